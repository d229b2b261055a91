"""The router under faults: a replica that fails its health check is left out and its waiting
requests go elsewhere, a hung one (accepting connections, never answering: what a SIGSTOPped
process does) is found by the health check, a stream from it ends with an error event, and a
replica that passes its check again gets traffic again.

The default suite drives the router (a real uvicorn on 127.0.0.1) over the deterministic test
server (tests/openai_server.py) and a stalling socket server; the slow suite kills real
``slimrag serve`` processes (kill -9, SIGSTOP, restart) behind it and counts lost requests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_server import Endless, running
from conftest import DOCS, write_tree
from openai_server import OpenAIServer

from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.rag.pipeline import RAG
from slimrag.route.app import create_router_app
from slimrag.route.policy import RouterConfig
from slimrag.serve.app import create_app

CHAT = "/v1/chat/completions"
TIMEOUT = 30.0
FAST = {"health_interval_s": 0.2, "health_timeout_s": 0.5}


def body(topic: str, stream: bool = False, model: str = "test-model") -> dict[str, Any]:
    """A new conversation per topic (no shared prefix: least-loaded routing spreads them)."""
    return {"model": model, "stream": stream,
            "messages": [{"role": "user", "content": f"{topic}: what is the office cat called?"}]}


def wait_until(condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> float:
    """Seconds until ``condition()`` held; fails after ``timeout``."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout, f"{what}: not within {timeout}s"
        time.sleep(0.05)
    return time.monotonic() - start


def healthy(client: httpx.Client) -> list[bool]:
    return [s["healthy"] for s in client.get("/healthz").json()["replicas"]]


def events(response_text: str) -> list[str]:
    return [ln[5:].strip() for ln in response_text.splitlines() if ln.startswith("data:")]


@contextmanager
def router(urls: list[str], **knobs: Any) -> Iterator[httpx.Client]:
    with running(create_router_app(urls, RouterConfig(**knobs))) as url, \
            httpx.Client(base_url=url, timeout=TIMEOUT) as client:
        yield client


@contextmanager
def stalling_server() -> Iterator[tuple[str, threading.Event, threading.Event]]:
    """A replica that answers health checks and starts each chat stream with one event (setting
    the second yielded event), until the first yielded event is set; from then on it accepts
    connections and never answers (a hung process), and streams already started get nothing more."""
    hang, started, stop = threading.Event(), threading.Event(), threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    conns: list[socket.socket] = []

    def handle(conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data and not stop.is_set():
            try:
                part = conn.recv(65536)
            except OSError:
                return
            if not part:
                return
            data += part
        if hang.is_set() or stop.is_set():
            return  # keep the connection open, say nothing
        if data.startswith(b"GET /healthz"):
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
                         b"Connection: close\r\n\r\n{}")
            return
        event = b'data: {"choices": [{"index": 0, "delta": {"content": "half"}}]}\n\n'
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + f"{len(event):x}\r\n".encode() + event + b"\r\n")
        started.set()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conns.append(conn)
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", hang, started
    finally:
        stop.set()
        thread.join(5)
        listener.close()
        for c in conns:
            c.close()


# -- in-process faults (default suite) -----------------------------------------------------------


def test_a_replica_failing_its_health_check_is_left_out_and_rejoins() -> None:
    with OpenAIServer() as a, OpenAIServer() as b, \
            router([a.base_url, b.base_url], cooldown_s=60, **FAST) as client:
        wait_until(lambda: healthy(client) == [True, True], what="both healthy")
        a.healthy = False
        wait_until(lambda: healthy(client) == [False, True], what="a left out")
        where = [client.post(CHAT, json=body(f"out {i}")).headers["x-slimrag-replica"] for i in range(6)]
        assert set(where) == {b.base_url.removesuffix("/v1")}
        a.healthy = True
        took = wait_until(lambda: healthy(client) == [True, True], what="a back")
        assert took < 2.0  # one check interval, not the 60 s cool-down
        where = [client.post(CHAT, json=body(f"back {i}")).headers["x-slimrag-replica"] for i in range(6)]
        assert where.count(a.base_url.removesuffix("/v1")) >= 2  # new conversations spread again
        text = client.get("/metrics").text
        series = f'slimrag_router_health_checks_total{{replica="{a.base_url.removesuffix("/v1")}",result="failed"}}'
        assert series in text


def test_a_hung_replica_is_found_and_its_requests_go_elsewhere() -> None:
    with stalling_server() as (stall, hang, started), OpenAIServer() as ok, \
            router([stall, ok.base_url], **FAST) as client:
        wait_until(lambda: healthy(client) == [True, True], what="both healthy")
        # a stream answering from the replica when it hangs: an error event, not a hang
        with ThreadPoolExecutor(4) as pool:
            streamed = pool.submit(client.post, CHAT, json=body("stream", stream=True))
            assert started.wait(TIMEOUT), "the stream did not reach the stalling replica"
            hang.set()
            start = time.monotonic()
            # requests sent now may wait on the hung replica until its check fails: then they go elsewhere
            waiting = [pool.submit(client.post, CHAT, json=body(f"queued {i}")) for i in range(3)]
            r = streamed.result(timeout=TIMEOUT)
            sse = events(r.text)
            assert r.status_code == 200 and json.loads(sse[0])["choices"][0]["delta"]["content"] == "half", (r.headers, sse)
            err = json.loads(sse[-1])["error"]
            assert err["code"] == "replica_failed" and "health check" in err["message"] and "[DONE]" not in sse
            answers = [f.result(timeout=TIMEOUT) for f in waiting]
            took = time.monotonic() - start
        assert [a.status_code for a in answers] == [200, 200, 200]
        assert {a.headers["x-slimrag-replica"] for a in answers} == {ok.base_url.removesuffix("/v1")}
        assert took < 5.0  # found by the health check (0.2 s + 0.5 s), not the 600 s read deadline
        assert healthy(client) == [False, True]



def test_a_client_leaving_the_router_stops_the_replicas_generation(tmp_path: Path, embedder: LocalEmbedder) -> None:
    gen = Endless()
    docs = write_tree(tmp_path / "docs", DOCS)
    with Index.build(docs, tmp_path / "r.slimrag", embedder=embedder) as idx, \
            running(create_app(RAG(idx, gen))) as replica, router([replica], **FAST) as client:
        with pytest.raises(httpx.ReadTimeout):  # a non-streamed chat, abandoned after 0.5 s
            client.post(CHAT, json=body("leave", model="slimrag"), timeout=httpx.Timeout(10, read=0.5))
        assert gen.closed.wait(5), "the replica generated on for nobody"
        assert gen.pieces < 250
        assert 'status="499"' in client.get("/metrics").text


# -- real `slimrag serve` processes (slow suite) -------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Replica:
    """A `slimrag serve` process on a fixed 127.0.0.1 port (so a restart comes back at the same URL)."""

    def __init__(self, index: Path, llm: str) -> None:
        self.index, self.llm, self.port = index, llm, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        cmd = [sys.executable, "-c", "from slimrag.cli import main; main()", "serve", str(self.index),
               "--port", str(self.port), "--llm", self.llm]
        self.proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"},
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def up() -> bool:
            assert self.proc is not None and self.proc.poll() is None, "slimrag serve exited"
            try:
                return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(up, timeout=120, what=f"slimrag serve on {self.port}")

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        if sig == signal.SIGKILL:
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[list[Replica]]:
    docs = write_tree(tmp_path_factory.mktemp("docs"), DOCS)
    root = tmp_path_factory.mktemp("idx") / "faults.slimrag"
    Index.build(docs, root, embedder=embedder).close()
    with OpenAIServer(chunk_delay_s=0.05) as llm:
        reps = [Replica(root, llm.base_url), Replica(root, llm.base_url)]
        try:
            for r in reps:
                r.start()
            yield reps
        finally:
            for r in reps:
                r.stop()


def ask(client: httpx.Client, topic: str, stream: bool) -> str:
    """One chat through the router: ``ok``, ``error-event`` (a stream ended by an error event) or
    ``lost`` (any other outcome: a status other than 200, a broken or hanging connection)."""
    try:
        r = client.post(CHAT, json=body(topic, stream, model="slimrag"))
    except httpx.HTTPError:
        return "lost"
    if r.status_code != 200:
        return "lost"
    if not stream:
        return "ok" if r.json()["choices"][0]["message"]["content"] else "lost"
    sse = events(r.text)
    if sse and sse[-1] == "[DONE]":
        return "ok"
    return "error-event" if sse and "error" in json.loads(sse[-1]) else "lost"


def run_load(client: httpx.Client, n: int, during: Callable[[], None], at: int) -> dict[str, int]:
    """``n`` chats from 6 threads (every third streamed); ``during()`` runs once ``at`` have been sent."""
    sent = threading.Semaphore(0)
    counts: dict[str, int] = {}

    def one(i: int) -> str:
        sent.release()
        return ask(client, f"topic {i}", stream=i % 3 == 0)

    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(one, i) for i in range(n)]
        for _ in range(at):
            sent.acquire()
        during()
        for f in futures:
            outcome = f.result(timeout=120)
            counts[outcome] = counts.get(outcome, 0) + 1
    return counts


@pytest.mark.slow
def test_kill_9_a_replica_under_load_then_restart_it(replicas: list[Replica]) -> None:
    a, b = replicas
    with router([a.url, b.url], **FAST) as client:
        counts = run_load(client, 60, lambda: b.signal(signal.SIGKILL), at=20)
        print(f"\nkill -9 during 60 chats: {counts}")
        assert counts.get("lost", 0) == 0 and counts["ok"] >= 55
        assert healthy(client) == [True, False]
        b.start()
        took = wait_until(lambda: healthy(client) == [True, True], timeout=10, what="restarted replica back")
        where = [client.post(CHAT, json=body(f"after {i}", model="slimrag")).headers["x-slimrag-replica"]
                 for i in range(10)]
        print(f"restarted replica back after {took:.2f}s; got {where.count(b.url)} of the next 10 chats")
        assert where.count(b.url) >= 3


@pytest.mark.slow
def test_sigstop_a_replica_under_load(replicas: list[Replica]) -> None:
    a, b = replicas
    with router([a.url, b.url], **FAST) as client:
        try:
            counts = run_load(client, 60, lambda: a.signal(signal.SIGSTOP), at=20)
            print(f"\nSIGSTOP during 60 chats: {counts}")
            assert counts.get("lost", 0) == 0 and counts["ok"] >= 55
            assert healthy(client) == [False, True]
        finally:
            a.signal(signal.SIGCONT)
        took = wait_until(lambda: healthy(client) == [True, True], timeout=10, what="resumed replica back")
        print(f"resumed replica back after {took:.2f}s")
