"""Evidence and attribution through the HTTP server (``slimrag`` field of completions and of the last
stream chunk) and the MCP ask tool: a real uvicorn on 127.0.0.1 over a real index, a real
`Generator` subclass that streams a fixed reply (no model)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_server import running
from conftest import DOCS

from slimrag.config import GenerationConfig
from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.llm.base import Delta, Generator
from slimrag.mcp.results import AnswerResult
from slimrag.prompt import Prompt
from slimrag.rag.pipeline import RAG
from slimrag.serve.app import create_app
from slimrag.types import Usage

QUESTION = "How long should lentil soup simmer?"
REPLY = "Simmer them for half an hour. The soup needs 3 hours of rest."


class Fixed(Generator):
    """Streams ``REPLY`` word by word: a real `Generator` subclass, no model."""

    thread_safe = True

    def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
        for w in REPLY.split(" "):
            yield Delta(w + " ")
        yield Delta("", finish_reason="stop", usage=Usage(prompt_tokens=10, completion_tokens=12))


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Index]:
    root: Path = tmp_path_factory.mktemp("evapi")
    idx = Index.build(list(DOCS.items()), root / "e.slimrag", embedder=embedder, storage="flat")
    yield idx
    idx.close()


def check_extension(ext: dict[str, Any], index: Index) -> None:
    ev = ext["evidence"][0]
    assert ev["label"] == "notes/recipes.rst#0" and "half an hour" in ev["text"]
    passage = index.catalog.chunks([ev["chunk_id"]])[ev["chunk_id"]].text
    assert passage[ev["start"]:ev["end"]] == ev["text"]
    assert set(ext["used"]) == {"notes/recipes.rst#0"} <= {s["label"] for s in ext["sources"]}
    assert [s["supported"] for s in ext["support"]] == [True, False]
    assert ext["support"][1]["unknown_terms"] == ["3"]
    assert "half an hour [notes/recipes.rst#0]." in ext["marked"]


def test_completion_and_stream_carry_evidence(index: Index) -> None:
    body = {"messages": [{"role": "user", "content": QUESTION}]}
    with running(create_app(RAG(index, Fixed()), workers=1)) as url, httpx.Client(base_url=url, timeout=30) as c:
        whole = c.post("/v1/chat/completions", json=body).json()
        check_extension(whole["slimrag"], index)
        assert whole["choices"][0]["message"]["content"] == REPLY  # the model's text as streamed
        r = c.post("/v1/chat/completions", json={**body, "stream": True})
        events = [line[5:].strip() for line in r.text.splitlines() if line.startswith("data:")]
        assert events[-1] == "[DONE]"
        check_extension(json.loads(events[-2])["slimrag"], index)


def test_mcp_answer_result_carries_evidence(index: Index) -> None:
    res = AnswerResult.from_answer(RAG(index, Fixed()).ask(QUESTION))
    assert res.evidence[0].label == "notes/recipes.rst#0" and "half an hour" in res.evidence[0].text
    assert res.used == ["notes/recipes.rst#0"] and set(res.used) <= {s.label for s in res.sources}
    assert [s.supported for s in res.support] == [True, False]
    assert "[notes/recipes.rst#0]" in res.marked


class Refuses(Generator):
    """A generator that must not be called: the evidence-only answer runs no model."""

    thread_safe = True

    def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
        raise AssertionError("the model was called for an evidence-only answer")


def test_evidence_only_request_runs_no_model(index: Index) -> None:
    body = {"messages": [{"role": "user", "content": QUESTION}], "evidence_only": True}
    with running(create_app(RAG(index, Refuses()), workers=1)) as url, httpx.Client(base_url=url, timeout=30) as c:
        whole = c.post("/v1/chat/completions", json=body).json()
        text = whole["choices"][0]["message"]["content"]
        assert text.splitlines()[0].endswith("[notes/recipes.rst#0]") and "half an hour" in text
        assert whole["slimrag"]["evidence"][0]["label"] == "notes/recipes.rst#0"
        r = c.post("/v1/chat/completions", json={**body, "stream": True})
        events = [line[5:].strip() for line in r.text.splitlines() if line.startswith("data:")]
        streamed = "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1]
                           if json.loads(e)["choices"])
        assert streamed == text and json.loads(events[-2])["slimrag"]["evidence"]


def test_the_answer_mode_and_the_verdict_go_through_http_and_mcp(index: Index) -> None:
    """``answer`` picks the mode per request; the ``slimrag`` field carries the mode, the verdict and
    what to show (issue 29). REPLY's second sentence states a number no passage holds: partial."""
    from slimrag.rag.attribution import UNSUPPORTED_MARK
    from slimrag.rag.grounded import IN_SHORT

    body = {"messages": [{"role": "user", "content": QUESTION}]}
    with running(create_app(RAG(index, Fixed()), workers=1)) as url, httpx.Client(base_url=url, timeout=30) as c:
        free = c.post("/v1/chat/completions", json=body).json()
        assert free["slimrag"]["mode"] == "free" and free["slimrag"]["verdict"] == "partial"
        assert f"3 hours of rest {UNSUPPORTED_MARK}." in free["slimrag"]["shown"]
        grounded = c.post("/v1/chat/completions", json={**body, "answer": "grounded"}).json()
        text = grounded["choices"][0]["message"]["content"]
        assert grounded["slimrag"]["mode"] == "grounded" and grounded["slimrag"]["verdict"] == "partial"
        assert text.splitlines()[0].endswith("[notes/recipes.rst#0]") and IN_SHORT in text
        assert c.post("/v1/chat/completions", json={**body, "answer": "quoted"}).status_code in (400, 422)
    res = AnswerResult.from_answer(RAG(index, Fixed()).ask(QUESTION, answer="grounded"))
    assert res.mode == "grounded" and res.verdict == "partial" and IN_SHORT in res.shown
