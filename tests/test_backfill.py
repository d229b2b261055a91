"""Chunks awaiting vectors embedded in the background (`slimrag.index.backfill`): on its own, the
backfill gives the vectors of a clean build; under ``serve``, an index with vectors pending answers
at once and its pending count reaches zero while it serves.

Interrupted builds as in test_progressive (bench.crash's deterministic `HashEmbedder`, a Ctrl-C in
the embedder's third batch), real SQLite and a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import numpy as np
import pytest
from asgi_server import running
from test_progressive import DOCS, FailingEmbedder, small_commits, vectors_by_chunk  # noqa: F401

from bench.crash import HashEmbedder
from slimrag.config import GenerationConfig
from slimrag.index.backfill import Backfill
from slimrag.index.core import Index
from slimrag.llm.base import Delta, Generator
from slimrag.prompt import Prompt
from slimrag.rag.pipeline import RAG
from slimrag.serve.app import create_app
from slimrag.types import Usage


class GatedHash(HashEmbedder):
    """`HashEmbedder` that holds the backfill thread's calls until `gate` is set, so a test can
    search while every chunk is still awaiting (searches embed on other threads, never held)."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        if threading.current_thread().name == "slimrag-backfill":
            assert self.gate.wait(30), "the test never opened the gate"
        return super().embed_batch(texts)


class Brief(Generator):
    """A generator that answers "ok": the server needs one; these tests ask it nothing."""

    def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
        yield Delta("ok", usage=Usage(prompt_tokens=1, completion_tokens=1), finish_reason="stop")


def pending_done(out: Path) -> bool:
    """No chunk of the index at ``out`` awaits vectors (a fresh handle: an open one keeps its version)."""
    with Index.open(out, embedder=HashEmbedder()) as idx:
        return idx.coverage().complete


def interrupted(out: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        Index.build(DOCS, out, embedder=FailingEmbedder(fail_at=3))


def test_backfill_gives_the_vectors_of_a_clean_build(tmp_path: Path, small_commits: None) -> None:  # noqa: F811
    with Index.build(DOCS, tmp_path / "clean", embedder=HashEmbedder()) as clean:
        want = vectors_by_chunk(clean)
    interrupted(tmp_path / "cut")
    fill = Backfill(tmp_path / "cut", HashEmbedder(), step=16).start()
    fill.join(60)
    assert not fill.running and fill.error is None and fill.embedded == 120 - 32
    with Index.open(tmp_path / "cut", embedder=HashEmbedder()) as idx:
        assert idx.coverage().complete and idx.check().ok
        got = vectors_by_chunk(idx)
    assert got.keys() == want.keys()
    for key, vec in want.items():
        np.testing.assert_allclose(got[key], vec, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="step"):
        Backfill(tmp_path / "cut", step=0)


def test_serve_answers_at_once_and_embeds_the_rest(tmp_path: Path, small_commits: None) -> None:  # noqa: F811
    out = tmp_path / "pending"
    interrupted(out)
    emb = GatedHash()
    index = Index.open(out, embedder=emb)
    assert index.coverage().awaiting == 120 - 32
    with running(create_app(RAG(index, Brief()), workers=1, search_workers=1)) as url, \
            httpx.Client(base_url=url, timeout=30) as c:
        r = c.post("/v1/search", json={"query": "uniq110 doc110", "k": 1})  # hybrid, vectors pending
        assert r.status_code == 200 and r.json()["data"][0]["source"] == "doc/110.txt"
        cov = r.json()["coverage"]  # the reply says what the vectors covered, keyword search the rest
        assert cov["chunks"] == 120 and cov["embedded"] == 32 and cov["awaiting"] == 120 - 32
        with Index.open(out, embedder=HashEmbedder()) as probe:
            assert probe.coverage().awaiting == 120 - 32  # answered before any backfill step
        emb.gate.set()
        deadline = time.monotonic() + 60
        while not pending_done(out) and time.monotonic() < deadline:  # only the server embeds
            time.sleep(0.1)
        assert pending_done(out)
        r = c.post("/v1/search", json={"query": "uniq110 doc110", "k": 1, "mode": "vector"})
        assert r.status_code == 200 and r.json()["data"][0]["source"] == "doc/110.txt"
        assert "coverage" not in r.json()  # complete: nothing to say
    index.close()
