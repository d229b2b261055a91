"""`slimrag serve` against hostile requests: every fuzz case of issue 12 is a 400 (never a 500)
with a clear message, every limit has its status, a client that leaves stops its generation, and
searches do not wait behind generations. A real uvicorn on 127.0.0.1 over a real index; the
language model is the deterministic test server (tests/openai_server.py) or a generator that
blocks until the test lets it go."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from asgi_server import assert_error, running
from conftest import DOCS, write_tree
from openai_server import OpenAIServer

from slimrag.api.schemas import MAX_EMBED_INPUTS, MAX_MESSAGES, MAX_TOKENS
from slimrag.config import GenerationConfig
from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.llm.base import Delta, Generator
from slimrag.prompt import Prompt
from slimrag.rag.pipeline import RAG
from slimrag.serve.app import create_app
from slimrag.types import Usage

TIMEOUT = 10.0
CAT_Q = "What is the office cat called?"
CHAT, EMBED, SEARCH = "/v1/chat/completions", "/v1/embeddings", "/v1/search"


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Index]:
    docs = write_tree(tmp_path_factory.mktemp("docs"), DOCS)
    with Index.build(docs, tmp_path_factory.mktemp("idx") / "contract.slimrag", embedder=embedder) as idx:
        yield idx


@pytest.fixture(scope="module")
def client(index: Index) -> Iterator[httpx.Client]:
    with OpenAIServer() as echo, running(create_app(RAG(index, echo.base_url))) as url, \
            httpx.Client(base_url=url, timeout=TIMEOUT) as c:
        yield c


def user(text: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def raw(client: httpx.Client, path: str, json_text: str) -> httpx.Response:
    """POST a JSON text as written (``json=`` would refuse a lone surrogate)."""
    return client.post(path, content=json_text.encode(), headers={"Content-Type": "application/json"})


# -- the 500s the fuzzer found, each with its own test -------------------------------------------


def test_lone_surrogate_in_a_search_query_is_400(client: httpx.Client) -> None:
    err = assert_error(raw(client, SEARCH, '{"query": "\\ud800"}'), 400, "query")
    assert "surrogate" in err["message"]
    err = assert_error(raw(client, SEARCH, '{"query": "cat \\udfff cat", "mode": "keyword"}'), 400, "query")
    assert "surrogate" in err["message"]


def test_lone_surrogate_in_an_embeddings_input_is_400(client: httpx.Client) -> None:
    assert "surrogate" in assert_error(raw(client, EMBED, '{"input": "\\ud800"}'), 400, "input")["message"]
    err = assert_error(raw(client, EMBED, '{"input": ["fine", "x\\ud83d"]}'), 400, "input[1]")
    assert "surrogate" in err["message"]


def test_lone_surrogate_in_a_chat_message_is_400(client: httpx.Client) -> None:
    err = assert_error(raw(client, CHAT, '{"messages": [{"role": "user", "content": "cat \\ud800?"}]}'), 400)
    assert "surrogate" in err["message"] and err["param"].startswith("messages[0].content")
    parts = '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udc00"}]}]}'
    assert "surrogate" in assert_error(raw(client, CHAT, parts), 400)["message"]


def test_a_glob_of_thirty_stars_is_400(client: httpx.Client) -> None:
    stars = "*" * 30
    for path, body in ((SEARCH, {"query": "x", "source": stars}),
                       (SEARCH, {"query": "x", "source": stars, "mode": "keyword"}),
                       (CHAT, {**user(CAT_Q), "source": stars})):
        err = assert_error(client.post(path, json=body), 400, "source")
        assert "at most 8 wildcards" in err["message"]


def test_valid_pairs_and_globs_still_work(client: httpx.Client) -> None:
    hits = client.post(SEARCH, json={"query": "office cat 🐈", "source": "g*/*?*.md"}).json()["data"]
    assert hits and all(h["source"].startswith("guide/") for h in hits)
    eight = "*" * 8  # the most wildcards allowed
    for mode in ("vector", "keyword", "hybrid"):
        r = client.post(SEARCH, json={"query": "Whiskers", "source": eight, "mode": mode})
        assert r.status_code == 200 and r.json()["data"][0]["source"] == "guide/cats.md"
    assert client.post(SEARCH, json={"query": "cat", "source": "/etc/*"}).json()["data"] == []
    assert client.post(SEARCH, json={"query": "cat", "source": "../../*"}).json()["data"] == []


# -- every other hostile input: a 400 naming the field ---------------------------------------------

BAD = [
    (SEARCH, {"query": ""}, "query", "white space"),
    (SEARCH, {"query": " \t\n"}, "query", "white space"),
    (SEARCH, {"query": "cat\u0000"}, "query", "NUL"),
    (SEARCH, {"query": "x" * 4001}, "query", "4000"),
    (SEARCH, {"query": "cat", "source": "a\u0000*"}, "source", "NUL"),
    (SEARCH, {"query": "cat", "source": "a" * 257}, "source", "256"),
    (SEARCH, {"query": "cat", "k": 101}, "k", "100"),
    (SEARCH, {"query": "cat", "k": 2**63}, "k", "100"),
    (SEARCH, {"query": "cat", "mode": "sql"}, "mode", "vector"),
    (EMBED, {"input": ""}, "input", "white space"),
    (EMBED, {"input": ["ok", "a\u0000b"]}, "input[1]", "NUL"),
    (EMBED, {"input": ["x"] * (MAX_EMBED_INPUTS + 1)}, "input", str(MAX_EMBED_INPUTS)),
    (EMBED, {"input": ["x"] * 2048}, "input", str(MAX_EMBED_INPUTS)),
    (EMBED, {"input": "x" * 32_001}, "input", "32000"),
    (EMBED, {"input": "cat", "dimensions": 7}, "dimensions", "384"),
    (CHAT, {**user(CAT_Q), "max_tokens": 2**63}, "max_tokens", str(MAX_TOKENS)),
    (CHAT, {**user(CAT_Q), "max_tokens": MAX_TOKENS + 1}, "max_tokens", str(MAX_TOKENS)),
    (CHAT, {**user(CAT_Q), "max_completion_tokens": 0}, "max_completion_tokens", "1"),
    (CHAT, {"messages": [{"role": "user", "content": CAT_Q}] * (MAX_MESSAGES + 1)}, "messages", str(MAX_MESSAGES)),
    (CHAT, user("a\u0000"), "messages[0].content", "NUL"),
    (CHAT, user("x" * 32_001), "messages[0].content", "32000"),
    (CHAT, user("   "), "messages", "no user message"),
    (CHAT, {"messages": [{"role": "system", "content": "hi"}]}, "messages", "no user message"),
    (CHAT, {**user(CAT_Q), "stop": ["a", "b", "c", "d", "e"]}, "stop", "4"),
    (CHAT, {**user(CAT_Q), "stop": "s" * 257}, "stop", "256"),
    (CHAT, {**user(CAT_Q), "n": 2}, "n", "1"),
    (CHAT, {**user(CAT_Q), "top_p": 0}, "top_p", "0"),
    (CHAT, {**user(CAT_Q), "temperature": float("inf")}, "temperature", ""),
]


@pytest.mark.parametrize(("path", "body", "param", "words"), BAD, ids=[f"{p}-{b.get('k', '')}{i}" for i, (p, b, *_)
                                                                      in enumerate(BAD)])
def test_hostile_bodies_are_400_naming_the_field(client: httpx.Client, path: str, body: dict[str, Any],
                                                 param: str, words: str) -> None:
    text = json.dumps(body, allow_nan=True)  # Infinity is not JSON: the parser refuses it
    r = raw(client, path, text)
    err = assert_error(r, 400) if "Infinity" in text else assert_error(r, 400, param)
    assert words in err["message"], err


def test_bodies_that_are_not_objects_are_400(client: httpx.Client) -> None:
    for path in (CHAT, EMBED, SEARCH):
        assert "JSON object" in assert_error(client.post(path), 400)["message"]  # no body at all
        for text in ("null", "[]", '"x"', "1e999", '{"query": "x"', "\ufeff{}"):
            assert_error(raw(client, path, text), 400)
        assert_error(client.post(path, content=b"\xff\xfe", headers={"Content-Type": "application/json"}), 400)


def test_the_2048_input_embeddings_request_is_refused_at_once(client: httpx.Client) -> None:
    start = time.monotonic()
    err = assert_error(client.post(EMBED, json={"input": ["a long text " * 80] * 2048}), 413)
    assert "larger than" in err["message"] and time.monotonic() - start < TIMEOUT
    # under the body limit the count is what refuses it
    assert_error(client.post(EMBED, json={"input": ["cat"] * 2048}), 400, "input")
    body = client.post(EMBED, json={"input": ["cat"] * MAX_EMBED_INPUTS}).json()
    assert len(body["data"]) == MAX_EMBED_INPUTS


def test_the_schema_publishes_the_limits_and_statuses(client: httpx.Client) -> None:
    schema = client.get("/openapi.json").json()
    search = schema["paths"][SEARCH]["post"]
    assert set(search["responses"]) == {"200", "400", "413", "500", "502"}
    req = schema["components"]["schemas"]["SearchRequest"]["properties"]
    assert req["query"]["maxLength"] == 4000 and "pattern" in req["query"] and req["k"]["maximum"] == 100
    emb = schema["components"]["schemas"]["EmbeddingsRequest"]["properties"]
    assert emb["input"]["anyOf"][1]["maxItems"] == MAX_EMBED_INPUTS
    assert emb["dimensions"]["anyOf"][0]["enum"] == [384]
    chat = schema["paths"][CHAT]["post"]["responses"]["200"]["content"]
    assert set(chat) == {"application/json", "text/event-stream"}
    assert "securitySchemes" not in schema.get("components", {})  # no key: none declared


# -- clients that leave, and searches beside generations -----------------------------------------


class _Gate(Generator):
    """A generator whose streams yield a piece every 10 ms until ``release`` is set, or ``limit``
    pieces; counts streams running and records closed ones."""

    thread_safe = True

    def __init__(self, limit: int = 500) -> None:
        self.limit = limit
        self.release, self.closed = threading.Event(), threading.Event()
        self.running = self.pieces = 0
        self._lock = threading.Lock()

    def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
        with self._lock:
            self.running += 1
        try:
            for i in range(self.limit):
                if self.release.wait(0.01):
                    break
                self.pieces += 1
                yield Delta(hashlib.sha1(str(i).encode()).hexdigest()[:6] + " ")  # never loops
            yield Delta("", usage=Usage(), finish_reason="length")
        finally:
            with self._lock:
                self.running -= 1
            self.closed.set()


def test_client_leaving_a_non_streamed_chat_stops_generation(index: Index) -> None:
    gen = _Gate()
    with running(create_app(RAG(index, gen))) as url:
        with httpx.Client(base_url=url, timeout=httpx.Timeout(TIMEOUT, read=0.5)) as c, \
                pytest.raises(httpx.ReadTimeout):
            c.post(CHAT, json=user(CAT_Q))  # the client gives up after 0.5 s and closes the connection
        assert gen.closed.wait(5), "the generation ran on for nobody"
        assert gen.pieces < 250  # it would make 500 pieces (5 s) otherwise
        with httpx.Client(base_url=url, timeout=TIMEOUT) as c:
            assert 'status="499"' in c.get("/metrics").text


def test_search_does_not_wait_behind_generations(index: Index) -> None:
    gen = _Gate(limit=6000)  # a minute at most
    with running(create_app(RAG(index, gen), workers=4)) as url, ThreadPoolExecutor(8) as pool, \
            httpx.Client(base_url=url, timeout=TIMEOUT) as c, httpx.Client(base_url=url, timeout=90) as slow:
        chats = [pool.submit(slow.post, CHAT, json=user(CAT_Q)) for _ in range(8)]  # 4 run, 4 queue
        deadline = time.monotonic() + TIMEOUT
        while gen.running < 4:
            assert time.monotonic() < deadline, "the chats did not start"
            time.sleep(0.01)
        # every chat worker is busy until `release`: a search in the same queue could not answer
        for _ in range(5):
            r = c.post(SEARCH, json={"query": "office cat", "k": 1})
            assert r.status_code == 200 and r.json()["data"][0]["source"] == "guide/cats.md"
        r = c.post(EMBED, json={"input": "office cat"})
        assert r.status_code == 200 and gen.running == 4
        gen.release.set()
        assert all(f.result().status_code == 200 for f in chats)


def test_deeply_nested_json_is_400(client: httpx.Client) -> None:
    for path in (CHAT, EMBED, SEARCH):
        deep = '{"query": ' + "[" * 100_000 + "]" * 100_000 + "}"
        assert_error(raw(client, path, deep), 400)
