"""``/healthz``'s ``load`` is exact whatever the client does (issue 31): a router weighs a replica's
reported chats (`slimrag.route.kv_policy`), so one counted for ever makes the replica look busy
for ever. Real servers on 127.0.0.1; the chats are counted by `slimrag.serve.app.ChatLoad`.

The hard case is a streamed chat whose client leaves as its first piece arrives: the route has its
first piece (so it answers 200 with a stream), and the response meets the disconnect before its body
starts. The tests make that happen on purpose by holding the server's event loop while the client
closes its socket and the generator posts every piece, so the loop sees both at once. Under uvicorn
(ASGI 2.3) Starlette still starts the body and stops it at its first wait; under an ASGI 2.4 server,
whose ``send`` raises once the client is gone (the spec's "IOError"), the response's first send
raises and the body never starts: `Asgi24` makes uvicorn behave so, since none is installed here.
Before the fix the chat's count was released in the body's own ``finally``, which a body never
started never runs: ``/healthz`` said ``chats: 1`` for ever."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from asgi_server import Endless, running, wait_for
from conftest import DOCS, write_tree

from slimrag.config import GenerationConfig
from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.llm.base import Delta, Generator
from slimrag.prompt import Prompt
from slimrag.rag.guards import Guards
from slimrag.rag.pipeline import RAG
from slimrag.serve.app import create_app
from slimrag.types import Usage

QUESTION = "What is the office cat called?"


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Index]:
    docs = write_tree(tmp_path_factory.mktemp("docs"), DOCS)
    with Index.build(docs, tmp_path_factory.mktemp("idx") / "load.slimrag", embedder=embedder) as idx:
        yield idx


class OnCue(Generator):
    """Answers only when released, then all at once (three pieces and the end); records when its
    stream was asked for and when it ended."""

    thread_safe = True

    def __init__(self) -> None:
        self.asked, self.release, self.closed = threading.Event(), threading.Event(), threading.Event()

    def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
        try:
            self.asked.set()
            assert self.release.wait(30), "the test never released the answer"
            for word in ("Whiskers ", "is ", "the cat."):
                yield Delta(word)
            yield Delta("", usage=Usage(), finish_reason="stop")
        finally:
            self.closed.set()


class LoopSpy:
    """The ASGI app, recording the event loop that serves it (to hold it still from the test)."""

    def __init__(self, app: Any) -> None:
        self.app, self.loop = app, None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.loop = asyncio.get_running_loop()
        await self.app(scope, receive, send)


class Asgi24:
    """``app`` as an ASGI 2.4 server runs it: ``spec_version`` 2.4, and ``send`` raising OSError
    once ``receive`` has said the client disconnected (uvicorn's h11 server says 2.3 and drops
    such sends silently)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        gone = False

        async def receiving() -> Any:
            nonlocal gone
            message = await receive()
            gone = gone or message["type"] == "http.disconnect"
            return message

        async def sending(message: Any) -> None:
            if gone:
                raise OSError("the client closed the connection")
            await send(message)

        await self.app({**scope, "asgi": {**scope.get("asgi", {}), "spec_version": "2.4"}}, receiving, sending)



def load_of(url: str) -> dict[str, int]:
    return httpx.get(url + "/healthz", timeout=10).json()["load"]


def raw_chat(url: str) -> socket.socket:
    """A streamed chat sent on a bare socket (so the test decides when the client leaves)."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"messages": [{"role": "user", "content": QUESTION}], "stream": True, "answer": "free",
                       "max_tokens": 8}).encode()
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


@pytest.mark.parametrize("spec", ["2.3", "2.4"])
def test_a_client_that_leaves_as_the_stream_starts_is_not_counted_for_ever(index: Index, spec: str) -> None:
    gen = OnCue()
    app = create_app(RAG(index, gen, guards=Guards(floor=None)))
    spy = LoopSpy(Asgi24(app) if spec == "2.4" else app)
    with running(spy) as url:
        assert load_of(url) == {"chats": 0, "waiting": 0}
        sock = raw_chat(url)
        assert gen.asked.wait(30), "the chat never reached the generator"
        assert load_of(url) == {"chats": 1, "waiting": 1}
        assert spy.loop is not None
        held, hold = threading.Event(), threading.Event()

        def stand_still() -> None:  # runs on the server's loop: nothing else runs there meanwhile
            held.set()
            hold.wait(10)

        spy.loop.call_soon_threadsafe(stand_still)
        try:
            assert held.wait(10)
            sock.close()  # the client leaves ...
            gen.release.set()  # ... as every piece arrives: the loop sees both when it runs again
            assert gen.closed.wait(10)
            time.sleep(0.2)  # the worker's end is posted to the loop after its last piece
        finally:
            hold.set()
        wait_for(lambda: load_of(url) == {"chats": 0, "waiting": 0}, "the chat to leave /healthz's load")
        assert chat_statuses(url) == {"200": 1.0}  # streamed (not a 499): the client left after the first piece


def chat_statuses(url: str) -> dict[str, float]:
    """``slimrag_requests_total`` of the chat route by status, from ``/metrics``."""
    out = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("slimrag_requests_total") and '"/v1/chat/completions"' in line:
            out[line.split('status="')[1].split('"')[0]] = float(line.split()[-1])
    return out


def test_a_client_that_leaves_mid_stream_leaves_the_count_and_stops_the_generation(index: Index) -> None:
    gen = Endless()
    with running(create_app(RAG(index, gen, guards=Guards(floor=None)))) as url, \
            httpx.Client(base_url=url, timeout=30) as client:
        body = {"messages": [{"role": "user", "content": QUESTION}], "stream": True, "answer": "free"}
        with client.stream("POST", "/v1/chat/completions", json=body) as r:
            events = 0
            for line in r.iter_lines():
                events += line.startswith("data:")
                if events == 3:
                    assert load_of(url) == {"chats": 1, "waiting": 0}
                    break
        assert gen.closed.wait(5) and gen.pieces < 100
        wait_for(lambda: load_of(url) == {"chats": 0, "waiting": 0}, "the chat to leave /healthz's load")


def test_chats_answered_whole_and_refused_leave_no_count(index: Index) -> None:
    gen = OnCue()
    gen.release.set()
    with running(create_app(RAG(index, gen, guards=Guards(floor=None)))) as url, \
            httpx.Client(base_url=url, timeout=30) as client:
        for stream in (True, False):
            body = {"messages": [{"role": "user", "content": QUESTION}], "stream": stream, "answer": "free"}
            r = client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200 and "Whiskers" in r.text
        assert client.post("/v1/chat/completions", json={"messages": []}).status_code == 400
        assert load_of(url) == {"chats": 0, "waiting": 0}
