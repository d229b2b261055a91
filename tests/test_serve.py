"""The HTTP server: a real uvicorn on 127.0.0.1 (ephemeral port) over a real index, with the
deterministic OpenAI-compatible test server (tests/openai_server.py) as its language model, so
expected answers follow from that server's echo rule. Every client has a short timeout."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from asgi_server import assert_error, cli_server_url, running
from conftest import DOCS, write_tree
from openai_server import OpenAIServer

from slimrag.api.errors import api_error
from slimrag.config import GenerationConfig
from slimrag.embed.local import LocalEmbedder
from slimrag.errors import BackendError, IndexFormatError, RequestError
from slimrag.index.core import Index
from slimrag.llm.base import Delta, Generator
from slimrag.llm.remote import RemoteGenerator
from slimrag.prompt import Prompt
from slimrag.rag.pipeline import RAG
from slimrag.rag.verdict import NOT_BACKED
from slimrag.serve.app import create_app
from slimrag.types import Usage

KEY = "test-key"
TIMEOUT = 10.0
CAT_Q = "What is the office cat called?"


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Index]:
    docs = write_tree(tmp_path_factory.mktemp("docs"), DOCS)
    with Index.build(docs, tmp_path_factory.mktemp("idx") / "serve.slimrag", embedder=embedder) as idx:
        yield idx


@pytest.fixture(scope="module")
def base(index: Index, echo: OpenAIServer) -> Iterator[str]:
    with running(create_app(RAG(index, echo.base_url), api_key=KEY, max_body_bytes=64_000)) as url:
        yield url


@pytest.fixture
def client(base: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {KEY}"}, timeout=TIMEOUT) as c:
        yield c


def chat(client: httpx.Client, question: str = CAT_Q, **body: Any) -> httpx.Response:
    return client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": question}], **body})


def sse(response: httpx.Response) -> list[Any]:
    """The decoded ``data:`` events of a stream (``"[DONE]"`` kept as a string)."""
    events = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
    return [e if e == "[DONE]" else json.loads(e) for e in events]



# -- chat completions ----------------------------------------------------------------------------


def test_completion_has_text_sources_and_usage(client: httpx.Client) -> None:
    body = chat(client).json()
    assert body["object"] == "chat.completion" and body["model"] == "slimrag"
    choice, ext = body["choices"][0], body["slimrag"]
    assert ext["text"] == f"echo: Question: {CAT_Q}" and choice["finish_reason"] == "stop"
    # no passage backs the echo: the content a client reads is the notice and the passages, not the text
    assert ext["verdict"] == "not_backed" and choice["message"] == {"role": "assistant", "content": ext["shown"]}
    assert ext["shown"].startswith(NOT_BACKED) and "[guide/cats.md#0]" in ext["shown"]
    usage = body["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] == len(ext["text"].split())
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert isinstance(usage["prompt_tokens_details"]["cached_tokens"], int)
    sources = body["slimrag"]["sources"]
    assert len(sources) == 4 and {"chunk_id", "source", "label", "score", "text"} <= set(sources[0])
    assert any(s["source"] == "guide/cats.md" and "Whiskers" in s["text"] for s in sources)


def test_history_sampling_and_limits_reach_the_model(client: httpx.Client, echo: OpenAIServer) -> None:
    messages = [{"role": "system", "content": "ignored"}, {"role": "user", "content": "Where does Whiskers sleep?"},
                {"role": "assistant", "content": "On the radiator."},
                {"role": "user", "content": [{"type": "text", "text": "And in summer?"}]}]
    r = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2, "temperature": 0.5,
                                                  "top_p": 0.9, "stop": ["zzz"], "k": 2, "model": "any"})
    body = r.json()
    assert body["slimrag"]["text"] == "echo: Question:" and body["choices"][0]["finish_reason"] == "length"
    assert len(body["slimrag"]["sources"]) == 2
    sent = echo.requests_to("chat/completions")[-1]["body"]
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "user"]
    assert sent["messages"][1]["content"] == "Where does Whiskers sleep?" and "ignored" not in sent["messages"][0]
    assert (sent["max_tokens"], sent["temperature"], sent["top_p"], sent["stop"]) == (2, 0.5, 0.9, ["zzz"])
    # max_completion_tokens wins over max_tokens, and a stop string ends the answer
    r = chat(client, max_tokens=50, max_completion_tokens=3, stop="Question")
    assert r.json()["slimrag"]["text"] == "echo:"


def test_stream_matches_completion_and_ends_with_usage(client: httpx.Client) -> None:
    whole = chat(client).json()
    events = sse(chat(client, stream=True, stream_options={"include_usage": True}))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text.strip() == whole["slimrag"]["text"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    last = chunks[-1]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]
    assert [s["chunk_id"] for s in last["slimrag"]["sources"]] == [s["chunk_id"] for s in whole["slimrag"]["sources"]]
    # without include_usage: no usage anywhere, the sources ride on the finish chunk
    events = sse(chat(client, stream=True))
    assert events[-1] == "[DONE]" and all("usage" not in c for c in events[:-1])
    assert events[-2]["choices"][0]["finish_reason"] == "stop" and events[-2]["slimrag"]["sources"]


def test_remote_generator_speaks_to_our_server(base: str, echo: OpenAIServer) -> None:
    echo.reset_cache()
    with RemoteGenerator(base, api_key=KEY, timeout=TIMEOUT) as gen:
        assert gen.resolve_model() == "slimrag"
        first = gen.generate(Prompt(CAT_Q), GenerationConfig(max_new_tokens=32))
        assert first.text == f"echo: Question: Question: {CAT_Q}" and first.finish_reason == "stop"
        assert first.usage.prompt_tokens > 0 and first.usage.completion_tokens == len(first.text.split())
        again = gen.generate(Prompt(CAT_Q))  # the same prompt: the backend's prefix cache hits fully
        assert again.usage.cached_tokens == again.usage.prompt_tokens > 0
        pieces = list(gen.stream(Prompt(CAT_Q), GenerationConfig(max_new_tokens=3)))
        assert "".join(p.text for p in pieces) == "echo: Question: Question:"
        assert pieces[-1].finish_reason == "length"


def test_concurrent_requests_each_get_their_own_answer(client: httpx.Client) -> None:
    questions = {"Where does Whiskers sleep?": "guide/cats.md", "When is rain expected?": "notes/weather.txt",
                 "What does the lighthouse keeper do?": "site/index.html", "How do I bake bread?": "notes/recipes.rst"}

    jobs = [(q, i % 2 == 0) for i, q in enumerate(list(questions) * 2)]  # half of them streamed

    def ask(job: tuple[str, bool]) -> tuple[str, list[dict[str, Any]]]:
        q, stream = job
        if not stream:
            body = chat(client, q, k=1).json()
            return body["slimrag"]["text"], body["slimrag"]["sources"]
        chunks = [c for c in sse(chat(client, q, k=1, stream=True)) if c != "[DONE]"]
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        return text, chunks[-1]["slimrag"]["sources"]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(ask, jobs))
    for (q, _), (text, sources) in zip(jobs, results, strict=True):
        assert text.strip() == f"echo: Question: {q}"
        assert [s["source"] for s in sources] == [questions[q]]


class _OneAtATime(Generator):
    """A generator that is not thread-safe: it records how many streams overlap."""

    def __init__(self) -> None:
        self.active = self.most = 0

    def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
        self.active += 1
        self.most = max(self.most, self.active)
        for word in ("one", " two"):
            time.sleep(0.05)
            yield Delta(word)
        self.active -= 1
        yield Delta("", usage=Usage(prompt_tokens=5, completion_tokens=2), finish_reason="stop")


def test_generator_that_is_not_thread_safe_runs_one_at_a_time(index: Index) -> None:
    gen = _OneAtATime()
    with running(create_app(RAG(index, gen))) as url, httpx.Client(base_url=url, timeout=TIMEOUT) as c:
        with ThreadPoolExecutor(4) as pool:
            texts = list(pool.map(lambda q: chat(c, q).json()["slimrag"]["text"], [CAT_Q, "When is rain expected?", "How do I bake bread?"]))
    assert texts == ["one two"] * 3 and gen.most == 1


def test_answer_carries_the_finish_reason_of_the_last_piece(index: Index) -> None:
    class Cut(Generator):
        def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
            yield Delta("cut")
            yield Delta("", usage=Usage(prompt_tokens=5, completion_tokens=1), finish_reason="length")

    answer = RAG(index, Cut()).ask("Where does Whiskers sleep?", k=1)
    assert (answer.text, answer.finish_reason, answer.usage.completion_tokens) == ("cut", "length", 1)



# -- embeddings, search, models, health ----------------------------------------------------------


def test_embeddings_equal_the_embedders_vectors(client: httpx.Client, embedder: LocalEmbedder) -> None:
    texts = ["The office cat is named Whiskers.", "Bake at 230 degrees."]
    expected = embedder.embed_batch(texts)
    body = client.post("/v1/embeddings", json={"input": texts, "model": "whatever"}).json()
    assert body["object"] == "list" and body["model"] == embedder.model_id
    assert [d["index"] for d in body["data"]] == [0, 1] and body["usage"]["prompt_tokens"] > 0
    np.testing.assert_allclose(np.array([d["embedding"] for d in body["data"]]), expected, atol=1e-5)
    body = client.post("/v1/embeddings", json={"input": texts[0], "encoding_format": "base64"}).json()
    vec = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(vec, expected[0], atol=1e-5)


def test_search_finds_the_expected_chunk(client: httpx.Client) -> None:
    hits = client.post("/v1/search", json={"query": "office cat", "k": 3}).json()["data"]
    assert len(hits) == 3 and hits[0]["source"] == "guide/cats.md" and "Whiskers" in hits[0]["text"]
    assert isinstance(hits[0]["chunk_id"], int) and hits[0]["score"] >= hits[1]["score"]
    hits = client.post("/v1/search", json={"query": "office cat", "k": 5, "source": "notes/*"}).json()["data"]
    assert hits and all(h["source"].startswith("notes/") for h in hits)
    hits = client.post("/v1/search", json={"query": "Whiskers", "mode": "keyword"}).json()["data"]
    assert [h["source"] for h in hits] == ["guide/cats.md"]


def test_workers_follow_index_updates_without_a_restart(tmp_path: Path, embedder: LocalEmbedder,
                                                        echo: OpenAIServer) -> None:
    docs = write_tree(tmp_path / "docs", DOCS)
    with Index.build(docs, tmp_path / "live.slimrag", embedder=embedder) as idx, \
            running(create_app(RAG(idx, echo.base_url), workers=1)) as url, \
            httpx.Client(base_url=url, timeout=TIMEOUT) as c:
        query = {"query": "Which ferry crosses the fjord at dawn?", "k": 1}
        assert c.post("/v1/search", json=query).json()["data"][0]["source"] != "ferry.md"
        with Index.open(tmp_path / "live.slimrag", embedder=embedder) as writer:  # another writer
            writer.add([("ferry.md", "The Nordlys ferry crosses the fjord at dawn, every day.")])
        assert c.post("/v1/search", json=query).json()["data"][0]["source"] == "ferry.md"
        with Index.open(tmp_path / "live.slimrag", embedder=embedder) as writer:
            writer.remove(["ferry.md"])
        assert c.post("/v1/search", json=query).json()["data"][0]["source"] != "ferry.md"


def test_models_and_health(client: httpx.Client, embedder: LocalEmbedder) -> None:
    models = client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["slimrag", embedder.model_id]
    assert client.get("/healthz").json()["status"] == "ok"


# -- errors, key, metrics ------------------------------------------------------------------------


def test_bad_requests_get_openai_errors(client: httpx.Client, base: str) -> None:
    post = client.post
    r = post("/v1/chat/completions", content=b'{"messages": [', headers={"Content-Type": "application/json"})
    assert "not valid JSON" in assert_error(r, 400)["message"]
    assert_error(post("/v1/chat/completions", json={}), 400, "messages")
    assert_error(post("/v1/chat/completions", json={"messages": "hi"}), 400, "messages")
    assert_error(post("/v1/chat/completions", json={"messages": []}), 400, "messages")
    assert_error(post("/v1/chat/completions", json={"messages": [{"role": "user"}]}), 400, "messages")
    assert_error(post("/v1/chat/completions", json={"messages": [{"role": "pirate", "content": "x"}]}), 400,
                 "messages[0].role")
    r = post("/v1/chat/completions", json={"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})
    assert_error(r, 400, "messages[0].content[0].type")
    assert_error(post("/v1/chat/completions", json={"messages": [{"role": "assistant", "content": "x"}]}), 400,
                 "messages")
    for k in (0, 101, "3", True):
        assert_error(chat(client, k=k), 400, "k")
    assert_error(chat(client, temperature=3), 400, "temperature")
    assert_error(chat(client, n=2), 400, "n")
    assert_error(post("/v1/chat/completions", content=b'{"messages": []}', headers={"Content-Type": "text/plain"}),
                 400)
    assert_error(post("/v1/chat/completions", json=[1, 2]), 400)
    assert_error(post("/v1/embeddings", json={"input": ""}), 400, "input")
    assert_error(post("/v1/embeddings", json={"input": []}), 400, "input")
    assert_error(post("/v1/embeddings", json={"input": [1, 2]}), 400, "input[0]")
    assert_error(post("/v1/embeddings", json={"input": "x", "encoding_format": "hex"}), 400, "encoding_format")
    assert_error(post("/v1/search", json={"query": "   "}), 400, "query")
    assert_error(post("/v1/search", json={"query": "cat", "k": 0}), 400, "k")
    assert_error(post("/v1/search", json={"k": 3}), 400, "query")
    big = {"input": "word " * 20_000}
    assert_error(post("/v1/embeddings", json=big), 413)

    def chunked() -> Iterator[bytes]:  # no Content-Length: the limit applies while reading
        yield b'{"input": "'
        for _ in range(100):
            yield b"word " * 200
        yield b'"}'

    assert_error(post("/v1/embeddings", content=chunked(), headers={"Content-Type": "application/json"}), 413)
    assert_error(client.get("/v1/nothing"), 404)
    assert_error(client.get("/v1/chat/completions"), 405)


class _TooLong(Generator):
    """A generator whose model cannot hold the prompt, as the local engine reports it."""

    def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
        raise RequestError("The prompt has 9000 tokens but the model holds 8192. Ask with fewer passages.")
        yield Delta("")  # unreachable: makes this a generator function, like every real stream


def test_request_errors_are_400_and_backend_errors_502(index: Index) -> None:
    with running(create_app(RAG(index, _TooLong()))) as url, httpx.Client(base_url=url, timeout=TIMEOUT) as c:
        err = assert_error(chat(c, "Where does Whiskers sleep?"), 400)
        assert err["code"] == "invalid_request" and "fewer passages" in err["message"]
    assert isinstance(RequestError("x"), ValueError)
    assert api_error(BackendError("down")).status == 502
    assert api_error(IndexFormatError("broken")).status == 500


def test_api_key_is_enforced_on_every_route_but_healthz(base: str) -> None:
    with httpx.Client(base_url=base, timeout=TIMEOUT) as anon:
        err = assert_error(anon.get("/v1/models"), 401)
        assert err["code"] == "invalid_api_key" and "missing" in err["message"]
        r = anon.post("/v1/search", json={"query": "cat"}, headers={"Authorization": "Bearer nope"})
        assert "wrong" in assert_error(r, 401)["message"]
        assert anon.get("/healthz").status_code == 200
        assert_error(anon.get("/metrics"), 401)
    with RemoteGenerator(base, model="slimrag", timeout=TIMEOUT) as gen, pytest.raises(BackendError, match="401"):
        gen.generate(Prompt(CAT_Q))


def metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    line = f"{name}{{{want}}} " if labels else f"{name} "
    return sum(float(ln[len(line):]) for ln in text.splitlines() if ln.startswith(line))


def test_metrics_count_requests_errors_and_tokens(client: httpx.Client) -> None:
    before = client.get("/metrics")
    assert before.headers["content-type"].startswith("text/plain") and "# TYPE slimrag_requests_total counter" in before.text
    body = chat(client).json()
    assert_error(client.post("/v1/search", json={}), 400)
    after = client.get("/metrics").text

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before.text, name, **labels)

    assert delta("slimrag_requests_total", endpoint="/v1/chat/completions", status="200") == 1
    assert delta("slimrag_requests_total", endpoint="/v1/search", status="400") == 1
    assert delta("slimrag_errors_total", endpoint="/v1/search", status="400") == 1
    assert delta("slimrag_prompt_tokens_total") == body["usage"]["prompt_tokens"]
    assert delta("slimrag_completion_tokens_total") == body["usage"]["completion_tokens"]
    assert delta("slimrag_cached_tokens_total") == body["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_backend_failures_are_clear_5xx(client: httpx.Client, echo: OpenAIServer) -> None:
    echo.fail_status, echo.fail_message = 500, "model crashed"
    try:
        for stream in (False, True):  # a stream fails before its first piece: a real status too
            err = assert_error(chat(client, stream=stream), 502)
            assert "model crashed" in err["message"] and err["code"] == "backend_error"
    finally:
        echo.fail_status = None
    echo.stream_fault = "error"  # the backend fails after its first piece: an error event ends our stream
    try:
        r = chat(client, stream=True)
    finally:
        echo.stream_fault = None
    events = sse(r)
    assert r.status_code == 200 and events[-1]["error"]["type"] == "server_error" and "[DONE]" not in events
    assert "echo:" in events[1]["choices"][0]["delta"]["content"]


# -- the command ---------------------------------------------------------------------------------


def test_slimrag_serve_command(index: Index, echo: OpenAIServer) -> None:
    env = {**os.environ, "SLIMRAG_API_KEY": KEY, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", "from slimrag.cli import main; main()", "serve", str(index.root), "--port", "0",
           "--llm", echo.base_url]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    try:
        url = cli_server_url(proc)
        assert httpx.get(f"{url}/v1/models", timeout=TIMEOUT).status_code == 401
        hits = httpx.post(f"{url}/v1/search", json={"query": "office cat", "k": 1}, timeout=TIMEOUT,
                          headers={"Authorization": f"Bearer {KEY}"}).json()["data"]
        assert hits[0]["source"] == "guide/cats.md"
    finally:
        proc.terminate()
        proc.wait(timeout=20)
