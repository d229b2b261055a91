"""What `slimrag serve` reports on the OpenAI wire about reuse and finish reasons: a real uvicorn on
127.0.0.1 over a real index.

- ``usage.prompt_tokens_details``: OpenAI's ``cached_tokens`` plus ``recomputed_tokens`` and
  ``reuse``; ground truth is the embedded engine in blend mode, whose second request places
  passages from their entries (so it must report recomputed tokens) while the first computes all.
- ``finish_reason``: slimrag's ``loop`` (the loop guard stopped the answer) is ``stop`` on the
  wire, streamed or not, and the ``slimrag`` field keeps ``loop``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from asgi_server import running
from conftest import DOCS, write_tree

from slimrag.config import GenerationConfig
from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.llm import weights
from slimrag.llm.base import Delta, Generator
from slimrag.llm.kv.config import CacheConfig
from slimrag.llm.local import LocalGenerator
from slimrag.prompt import Prompt
from slimrag.rag.guards import Guards
from slimrag.rag.pipeline import RAG
from slimrag.serve.app import create_app
from slimrag.types import Usage

TIMEOUT = 120.0  # a prefill of the embedded model on a loaded 2-core machine
QUESTION = "Where does Whiskers sleep?"


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Index]:
    docs = write_tree(tmp_path_factory.mktemp("docs"), DOCS)
    with Index.build(docs, tmp_path_factory.mktemp("idx") / "usage.slimrag", embedder=embedder) as idx:
        yield idx


def chat(client: httpx.Client, **body: Any) -> httpx.Response:
    return client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": QUESTION}], **body})


class _Looping(Generator):
    """Repeats one sentence: the pipeline's loop guard must stop it long before it ends."""

    def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
        for _ in range(200):
            yield Delta("Whiskers sleeps on the radiator. ")
        yield Delta("", usage=Usage(prompt_tokens=9, completion_tokens=200), finish_reason="length")


def test_loop_is_stop_on_the_wire_and_loop_in_the_slimrag_field(index: Index) -> None:
    with running(create_app(RAG(index, _Looping()))) as url, httpx.Client(base_url=url, timeout=TIMEOUT) as c:
        body = chat(c, k=1).json()
        assert body["choices"][0]["finish_reason"] == "stop" and body["slimrag"]["finish_reason"] == "loop"
        assert body["choices"][0]["message"]["content"].count("radiator") < 200
        events = [json.loads(line[5:]) for line in chat(c, k=1, stream=True).text.splitlines()
                  if line.startswith("data:") and line.strip() != "data: [DONE]"]
        assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == "stop"
        assert events[-1]["slimrag"]["finish_reason"] == "loop"


def test_blend_usage_reports_cached_recomputed_and_reuse(index: Index, smollm: weights.LoadedModel) -> None:
    gen = LocalGenerator(loaded=smollm, cache=CacheConfig(reuse="blend", recompute="boundary:4"))
    rag = RAG(index, gen, guards=Guards(floor=None), answer="free")  # passage KV reuse: whole passages in the prompt
    with running(create_app(rag)) as url, httpx.Client(base_url=url, timeout=TIMEOUT) as c:
        first = chat(c, k=3, max_tokens=1).json()
        again = [json.loads(line[5:]) for line in chat(c, k=3, max_tokens=1, stream=True,
                                                       stream_options={"include_usage": True}).text.splitlines()
                 if line.startswith("data:") and line.strip() != "data: [DONE]"]
    details = first["usage"]["prompt_tokens_details"]
    assert details == {"cached_tokens": 0, "recomputed_tokens": 0, "reuse": "blend"}  # all computed
    usage = again[-1]["usage"]
    passages = len(again[-1]["slimrag"]["sources"])
    assert passages == 3  # (the prompt may grow: a reordered prompt states the relevance ranking)
    # at least the first passage follows the system segment exactly; each passage placed from
    # its entry has its first 4 tokens computed again (boundary:4). Since the one-forward prefill
    # (ae73437) the second request finds two passages on an exact path and places one (4
    # recomputed; 8 before): counted here as whole placed passages, at least one.
    assert usage["prompt_tokens_details"]["reuse"] == "blend"
    recomputed = usage["prompt_tokens_details"]["recomputed_tokens"]
    assert recomputed % 4 == 0 and 4 <= recomputed <= 4 * (passages - 1)
    assert 0 < usage["prompt_tokens_details"]["cached_tokens"] < usage["prompt_tokens"]


def test_exact_usage_says_exact_and_recomputes_nothing(index: Index, smollm: weights.LoadedModel) -> None:
    rag = RAG(index, LocalGenerator(loaded=smollm), guards=Guards(floor=None))
    with running(create_app(rag)) as url, httpx.Client(base_url=url, timeout=TIMEOUT) as c:
        chat(c, k=2, max_tokens=1)
        body = chat(c, k=2, max_tokens=1).json()
    details = body["usage"]["prompt_tokens_details"]
    assert details["reuse"] == "exact" and details["recomputed_tokens"] == 0
    assert details["cached_tokens"] > 0  # the same passages in the same order: all but the question
