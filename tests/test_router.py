"""The router: a real uvicorn router on 127.0.0.1 over real replica servers (tests/openai_server.py,
the deterministic OpenAI-compatible server with prefix-cache emulation), so where a request
landed is read from the ``X-Slimrag-Replica`` header and checked against the replicas' own records.
The prefix tree is checked against brute force, the routing rule with plain numbers."""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx
import pytest
from asgi_server import assert_error, cli_server_url, running
from click.testing import CliRunner
from openai_server import OpenAIServer

from slimrag.cli import cli
from slimrag.route.app import create_router_app
from slimrag.route.policy import Replica, RouterConfig, choose, replica_url
from slimrag.route.prefix_tree import PrefixTree

TIMEOUT = 10.0
MODEL = "test-model"
CHAT = "/v1/chat/completions"


@contextmanager
def router(urls: list[str], **knobs: Any) -> Iterator[httpx.Client]:
    """A client of a fresh router over ``urls``."""
    with running(create_router_app(urls, RouterConfig(**knobs))) as url, \
            httpx.Client(base_url=url, timeout=TIMEOUT) as client:
        yield client


@pytest.fixture(scope="module")
def servers() -> Iterator[list[OpenAIServer]]:
    with OpenAIServer() as a, OpenAIServer() as b, OpenAIServer() as c:
        yield [a, b, c]


@pytest.fixture
def replicas(servers: list[OpenAIServer]) -> Iterator[list[OpenAIServer]]:
    """The three replica servers, their failure knobs reset after the test."""
    yield servers
    for s in servers:
        s.fail_status, s.chunk_delay_s, s.stream_fault, s.api_key, s.healthy = None, 0.0, None, None, True


def root(srv: OpenAIServer) -> str:
    return srv.base_url.removesuffix("/v1")


def body(system: str, question: str = "What does the keeper do?", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "system", "content": system},
                                         {"role": "user", "content": question}], **extra}


def prefix(name: str) -> str:
    """A long system prompt, different per name (about 1,000 characters)."""
    return f"You answer questions about the {name} archive. " * 20


def landed(response: httpx.Response, replicas: list[OpenAIServer]) -> int:
    """The index of the replica that answered."""
    assert response.status_code == 200, response.text
    return [root(s) for s in replicas].index(response.headers["x-slimrag-replica"])


def chats(replicas: list[OpenAIServer]) -> list[int]:
    return [len(s.requests_to("chat/completions")) for s in replicas]


def metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    line = f"{name}{{{want}}} " if labels else f"{name} "
    return sum(float(ln[len(line):]) for ln in text.splitlines() if ln.startswith(line))



# -- the prefix tree and the rule, without HTTP --------------------------------------------------


def test_prefix_tree_matches_like_brute_force() -> None:
    rng = random.Random(7)
    texts = ["".join(rng.choice("abc") for _ in range(rng.randint(0, 40))) for _ in range(300)]
    tree = PrefixTree()
    for t in texts:
        tree.insert(t)
    for _ in range(500):
        q = "".join(rng.choice("abc") for _ in range(rng.randint(0, 45)))
        expected = max(len(os.path.commonprefix([q, t])) for t in texts)
        assert tree.match(q) == expected, q
    assert tree.size <= sum(map(len, texts))
    # with a cap: never more than it holds, never a prefix nobody sent, the last text kept whole
    small = PrefixTree(max_chars=200)
    for i, t in enumerate(texts):
        small.insert(t)
        assert small.size <= 200 and small.match(t) == len(t)
        q = texts[rng.randrange(i + 1)]
        assert small.match(q) <= max(len(os.path.commonprefix([q, s])) for s in texts[: i + 1])


def test_prefix_tree_evicts_least_recently_used() -> None:
    tree = PrefixTree(max_chars=100)
    a, b, c = "a" * 40, "b" * 40, "c" * 40
    tree.insert(a)
    tree.insert(b)
    tree.insert(a)  # a is now more recent than b
    tree.insert(c)  # 120 > 100: b goes, down to 7/8 of the cap
    assert (tree.match(a), tree.match(b), tree.match(c), tree.size) == (40, 0, 40, 80)
    tree.insert("x" * 500)  # longer than the cap: kept, cut to it
    assert tree.match("x" * 500) == 100 and tree.size == 100
    tree.clear()
    assert tree.size == 0 and tree.match(a) == 0
    with pytest.raises(ValueError, match="max_chars"):
        PrefixTree(0)


def test_routing_rule() -> None:
    cfg = RouterConfig(cache_threshold=0.5, balance_abs_threshold=4, balance_rel_threshold=1.5)
    a, b, c = Replica("http://a"), Replica("http://b"), Replica("http://c")
    key = "<system>" + "x" * 100 + "\n<user>q\n"
    b.tree.insert(key[:80])
    assert choose([a, b, c], key, cfg) == (b, "cache")  # 80 of 117 characters match
    assert choose([a, b, c], "<user>hello there", cfg) == (a, "least_loaded")  # no match: the first idle one
    assert choose([a, b, c], None, cfg) == (a, "least_loaded")
    b.in_flight, a.in_flight = 3, 1
    assert choose([a, b, c], key, cfg) == (b, "cache")  # 3 - 0 is not more than 4: balanced
    b.in_flight = 5
    assert choose([a, b, c], key, cfg) == (c, "balance")  # 5 - 0 > 4 and 5 > 1.5 * 0
    a.in_flight, b.in_flight, c.in_flight = 20, 26, 21
    assert choose([a, b, c], key, cfg) == (b, "cache")  # 26 - 20 > 4 but 26 < 1.5 * 20
    b.in_flight = 31
    assert choose([a, b, c], key, cfg) == (a, "balance")
    a.in_flight = b.in_flight = c.in_flight = 0
    a.tree.insert("zzz")
    assert choose([a, b, c], "<user>hello there", cfg)[0] is c  # equal loads: the smallest tree (b holds 80)
    assert choose([a, b], key, RouterConfig(cache_threshold=0.9)) == (a, "least_loaded")
    b.mark_down(0.05)
    assert not b.healthy() and b.tree.size == 0
    time.sleep(0.06)
    assert b.healthy()


def test_config_and_urls_are_checked() -> None:
    assert replica_url("http://127.0.0.1:8001/v1/") == "http://127.0.0.1:8001"
    for bad in ("127.0.0.1:8001", "ftp://host", "http://host/api"):
        with pytest.raises(ValueError, match="replica URL"):
            replica_url(bad)
    for knobs in ({"cache_threshold": 1.5}, {"balance_abs_threshold": -1}, {"balance_rel_threshold": 0.5},
                  {"cooldown_s": -1}, {"timeout_s": 0}, {"max_tree_chars": 0}):
        with pytest.raises(ValueError, match=next(iter(knobs))):
            RouterConfig(**knobs)
    with pytest.raises(ValueError, match="twice"):
        create_router_app(["http://a:1", "http://a:1/v1"])
    with pytest.raises(ValueError, match="at least one"):
        create_router_app([])


# -- routing over real servers -------------------------------------------------------------------


def test_shared_prefixes_stick_and_new_ones_spread(replicas: list[OpenAIServer]) -> None:
    with router([root(s) for s in replicas]) as client:
        first = {name: landed(client.post(CHAT, json=body(prefix(name))), replicas)
                 for name in ("lighthouse", "harbour", "ferry")}
        assert sorted(first.values()) == [0, 1, 2]  # idle replicas with empty trees take new prefixes
        for name in ("harbour", "lighthouse", "ferry", "harbour"):
            r = client.post(CHAT, json=body(prefix(name), "Who rings the bell at noon?"))
            assert landed(r, replicas) == first[name]
            # the replica's prefix cache (emulated) holds the shared system prompt
            assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= len(prefix(name).split())
        # a conversation's next turn follows its first
        turn = body(prefix("ferry"))
        turn["messages"] += [{"role": "assistant", "content": "He lights the lamp."},
                             {"role": "user", "content": "And when?"}]
        assert landed(client.post(CHAT, json=turn), replicas) == first["ferry"]


def test_imbalanced_load_goes_to_the_least_loaded(replicas: list[OpenAIServer]) -> None:
    for s in replicas:
        s.chunk_delay_s = 0.3  # each stream below lasts about 4 s; all three open within about 1 s
    question = "Please list every task of the lighthouse keeper in the winter months"
    with router([root(s) for s in replicas], balance_abs_threshold=1, balance_rel_threshold=1.0) as client, \
            ExitStack() as streams:
        where = []
        for _ in range(3):
            r = streams.enter_context(client.stream("POST", CHAT, json=body(prefix("busy"), question, stream=True)))
            where.append(landed(r, replicas))
        # 1st: idle, new prefix; 2nd: same prefix, 1 - 0 is not more than 1; 3rd: 2 - 0 > 1 is imbalanced
        assert where[0] == where[1] != where[2]
        health = client.get("/healthz").json()
        assert sorted(s["in_flight"] for s in health["replicas"]) == [0, 1, 2]
        text = client.get("/metrics").text
        assert metric(text, "slimrag_router_routed_total", replica=root(replicas[where[2]]), reason="balance") == 1
        assert metric(text, "slimrag_router_routed_total", replica=root(replicas[where[1]]), reason="cache") == 1


def test_failover_skips_dead_and_failing_replicas(replicas: list[OpenAIServer]) -> None:
    with OpenAIServer() as gone:
        dead = root(gone)  # stopped below: connections to it are refused
    replicas[1].fail_status, replicas[1].fail_message = 503, "overloaded"
    before = chats(replicas)
    # passive failover only: the active health check (tests/test_router_faults.py) would leave the
    # dead replica out before any request tried it
    with router([dead, root(replicas[1]), root(replicas[2])], health_interval_s=0) as client:
        r = client.post(CHAT, json=body(prefix("failover")))
        assert landed(r, replicas) == 2 and r.json()["choices"][0]["message"]["content"].startswith("echo:")
        assert [n - b for n, b in zip(chats(replicas), before, strict=True)] == [0, 1, 1]
        # both failed replicas cool down: a stream goes straight to the healthy one
        events = [ln for ln in client.post(CHAT, json=body(prefix("x"), stream=True)).text.splitlines() if ln]
        assert events[-1] == "data: [DONE]"
        assert [n - b for n, b in zip(chats(replicas), before, strict=True)] == [0, 1, 2]
        health = client.get("/healthz").json()
        assert health["status"] == "ok" and [s["healthy"] for s in health["replicas"]] == [False, False, True]
        text = client.get("/metrics").text
        assert metric(text, "slimrag_router_upstream_total", replica=dead, status="error") == 1
        assert metric(text, "slimrag_router_upstream_total", replica=root(replicas[1]), status="503") == 1
        assert metric(text, "slimrag_router_failures_total", replica=dead) == 1
        assert metric(text, "slimrag_router_healthy", replica=dead) == 0
    with router([dead, root(replicas[1])], health_interval_s=0) as client:  # nobody answers: 502 naming both failures
        err = assert_error(client.post(CHAT, json=body("q")), 502)
        assert err["code"] == "replicas_unavailable" and "overloaded" in err["message"]
        assert "ConnectError" in err["message"]
        assert client.get("/healthz").status_code == 503
    replicas[1].fail_status, replicas[1].fail_message = 500, "model crashed"
    with router([root(replicas[1]), root(replicas[2])], health_interval_s=0) as client:  # a 500: retried, nobody left out
        r = client.post(CHAT, json=body(prefix("crash")))
        assert landed(r, replicas) == 2
        assert [s["healthy"] for s in client.get("/healthz").json()["replicas"]] == [True, True]


@contextmanager
def breaking_server() -> Iterator[str]:
    """A server that starts an event stream, sends one event and closes the connection."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, rest = data.split(b"\r\n\r\n", 1)
            length = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))  # type: ignore[union-attr]
            while len(rest) < length:
                rest += conn.recv(65536)
            event = b'data: {"choices": [{"index": 0, "delta": {"content": "half"}}]}\n\n'
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                         + f"{len(event):x}\r\n".encode() + event + b"\r\n")
            conn.shutdown(socket.SHUT_RDWR)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()
        thread.join(5)


def test_streams_pass_through_chunk_by_chunk_and_are_never_retried(replicas: list[OpenAIServer]) -> None:
    for s in replicas:
        s.chunk_delay_s = 0.1
    question = "Who keeps the lamp lit tonight?"
    with router([root(s) for s in replicas]) as client:
        arrivals: list[tuple[float, str]] = []
        with client.stream("POST", CHAT, json=body(prefix("stream"), question, stream=True)) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            for line in r.iter_lines():
                if line:
                    arrivals.append((time.monotonic(), line))
        events = [line.removeprefix("data: ") for _, line in arrivals]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        assert text == f"echo: {question}" and chunks[-1]["choices"][0]["finish_reason"] == "stop"
        # ten events 0.1 s apart at the replica arrive spread out, not in one piece at the end
        times = [t for t, _ in arrivals]
        assert times[-1] - times[0] > 0.5 and sum(b - a > 0.04 for a, b in zip(times, times[1:], strict=False)) >= 5
        # a replica that ends its stream early: the client gets what it sent, nothing is retried
        for s in replicas:
            s.chunk_delay_s, s.stream_fault = 0.0, "cut"
        before = sum(chats(replicas))
        events = [ln for ln in client.post(CHAT, json=body(prefix("cut"), stream=True)).text.splitlines() if ln]
        assert len(events) == 2 and "[DONE]" not in events[-1] and sum(chats(replicas)) == before + 1
    # a replica that breaks the connection mid-stream: an error event, no retry, marked down
    with breaking_server() as broken, router([broken, root(replicas[0])], health_interval_s=0) as client:
        before = chats(replicas)
        r = client.post(CHAT, json=body(prefix("broken"), stream=True))
        events = [json.loads(ln[5:]) for ln in r.text.splitlines() if ln.startswith("data:")]
        assert r.status_code == 200 and events[0]["choices"][0]["delta"]["content"] == "half"
        assert events[-1]["error"]["code"] == "replica_failed" and len(events) == 2
        assert chats(replicas) == before
        assert [s["healthy"] for s in client.get("/healthz").json()["replicas"]] == [False, True]


def test_bad_requests_get_openai_errors_from_the_router(replicas: list[OpenAIServer]) -> None:
    before = sum(len(s.requests) for s in replicas)
    with router([root(s) for s in replicas], max_body_bytes=10_000) as client:
        r = client.post(CHAT, content=b'{"messages": [', headers={"Content-Type": "application/json"})
        assert "not valid JSON" in assert_error(r, 400)["message"]
        assert_error(client.post(CHAT, json={}), 400, "messages")
        assert_error(client.post(CHAT, json={"messages": []}), 400, "messages")
        assert_error(client.post(CHAT, json={**body("s"), "k": 0}), 400, "k")
        assert_error(client.post(CHAT, json=body("s" * 20_000)), 413)
        assert_error(client.get("/v1/nothing"), 404)
        assert_error(client.get(CHAT), 405)
        assert sum(len(s.requests) for s in replicas) == before  # refused by the router itself
        # a replica's 4xx is the request's fault: passed through, no failover, nobody marked down
        r = client.post(CHAT, json={**body("s"), "model": "no-such-model"})
        assert r.status_code == 404 and "no-such-model" in r.json()["error"]["message"]
        for s in replicas:
            s.api_key = "secret"
        assert client.post(CHAT, json=body("s")).status_code == 401
        r = client.post(CHAT, json=body("s"), headers={"Authorization": "Bearer secret"})
        assert r.status_code == 200  # the key is passed through
        assert sum(len(s.requests) for s in replicas) == before + 3
        assert all(s["healthy"] for s in client.get("/healthz").json()["replicas"])


def test_metrics_count_per_replica(replicas: list[OpenAIServer]) -> None:
    with router([root(s) for s in replicas]) as client:
        where = [landed(client.post(CHAT, json=body(prefix(f"metrics {i % 4}"))), replicas) for i in range(8)]
        models = client.get("/v1/models")
        assert models.status_code == 200 and [m["id"] for m in models.json()["data"]] == [MODEL]
        text = client.get("/metrics").text
        assert "# TYPE slimrag_router_in_flight gauge" in text
        assert metric(text, "slimrag_requests_total", endpoint=CHAT, status="200") == 8
        for i, s in enumerate(replicas):
            routed = metric(text, "slimrag_router_routed_total", replica=root(s), reason="cache") + \
                metric(text, "slimrag_router_routed_total", replica=root(s), reason="least_loaded")
            assert routed == where.count(i) + (models.headers["x-slimrag-replica"] == root(s))
            assert metric(text, "slimrag_router_upstream_total", replica=root(s), status="200") == routed
            assert metric(text, "slimrag_router_in_flight", replica=root(s)) == 0
            assert metric(text, "slimrag_router_tree_chars", replica=root(s)) > 0
        assert metric(text, "slimrag_router_routed_total", replica=root(replicas[where[0]]), reason="cache") >= 1


# -- the command ---------------------------------------------------------------------------------


def test_slimrag_route_command(replicas: list[OpenAIServer]) -> None:
    runner = CliRunner()
    assert runner.invoke(cli, ["route"]).exit_code == 2  # --replica is required
    result = runner.invoke(cli, ["route", "--replica", "ftp://host"])
    assert result.exit_code == 2 and "replica URL" in result.output
    cmd = [sys.executable, "-c", "from slimrag.cli import main; main()", "route", "--port", "0",
           "--replica", replicas[0].base_url, "--replica", root(replicas[1])]
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stderr=subprocess.PIPE, text=True)
    try:
        url = cli_server_url(proc)
        health = httpx.get(f"{url}/healthz", timeout=TIMEOUT).json()
        assert [s["url"] for s in health["replicas"]] == [root(replicas[0]), root(replicas[1])]
        r = httpx.post(f"{url}{CHAT}", json=body("cli"), timeout=TIMEOUT)
        assert r.status_code == 200 and r.headers["x-slimrag-replica"] in (root(replicas[0]), root(replicas[1]))
    finally:
        proc.terminate()
        proc.wait(timeout=20)
