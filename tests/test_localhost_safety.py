"""Localhost safety: the one Host and Origin rule (`slimrag.api.hosts`) that ``slimrag serve``,
``slimrag route`` and ``slimrag mcp --http`` enforce against DNS rebinding.

Real uvicorn servers on 127.0.0.1 (the MCP server as the real ``slimrag mcp --http`` process);
requests with a chosen Host header go through `http.client`, which sends headers as written. The
browser test points Debian's chromium at the server under a foreign name (``--host-resolver-rules``
maps ``evil.example`` to 127.0.0.1, which is what a rebinding attack achieves with DNS)."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from asgi_server import running
from click.testing import CliRunner
from conftest import DOCS, write_tree
from openai_server import OpenAIServer

from slimrag.api.hosts import HostRule
from slimrag.cli import cli
from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.rag.pipeline import RAG
from slimrag.route.app import create_router_app
from slimrag.route.policy import RouterConfig
from slimrag.serve.app import create_app

SEARCH = json.dumps({"query": "office cat", "k": 1}).encode()
EVIL = "evil.example"
CHROMIUM = shutil.which("chromium")


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Index]:
    docs = write_tree(tmp_path_factory.mktemp("docs"), DOCS)
    with Index.build(docs, tmp_path_factory.mktemp("idx") / "local.slimrag", embedder=embedder) as idx:
        yield idx


@pytest.fixture(scope="module")
def base(index: Index, echo: OpenAIServer) -> Iterator[str]:
    """``slimrag serve``'s app with no API key (the default), as the rebinding page finds it."""
    with running(create_app(RAG(index, echo.base_url))) as url:
        yield url


def port_of(url: str) -> int:
    return int(urlsplit(url).port or 0)


def send(url: str, method: str, path: str, host: str | None = None, origin: str | None = None,
         body: bytes | None = None) -> tuple[int, bytes]:
    """One request to ``url``'s server with ``Host`` (default: as a client would send it) and
    ``Origin`` headers as given; the status and body."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=20)
    try:
        conn.putrequest(method, path, skip_host=host is not None, skip_accept_encoding=True)
        if host is not None:
            conn.putheader("Host", host)
        if origin is not None:
            conn.putheader("Origin", origin)
        if body is not None:
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Accept", "application/json, text/event-stream")
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def code_of(body: bytes) -> str:
    return json.loads(body)["error"]["code"]


# -- the rule ------------------------------------------------------------------------------------


def test_the_rule_on_its_own() -> None:
    rule = HostRule()
    ok = [("127.0.0.1:8000", None), ("localhost:8000", None), ("LocalHost:8000", None), ("[::1]:8000", None),
          ("[0:0:0:0:0:0:0:1]:8000", None), ("127.0.0.1:8000", "http://127.0.0.1:8000"),
          ("127.0.0.1:8000", "http://localhost:8000"), ("localhost:8000", "http://[::1]:8000")]
    for host, origin in ok:
        assert rule.refusal(host, origin, 8000) is None, (host, origin)
    refused_host = ["evil.example:8000", "evil.example", "127.0.0.1", "127.0.0.1:8001", "localhost.:8000",
                    "127.0.0.2:8000", "0.0.0.0:8000", "::1:8000", "[::1", "", "127.0.0.1:80x", "user@127.0.0.1:8000"]
    for host in refused_host:
        err = rule.refusal(host, None, 8000)
        assert err is not None and err.status == 421 and "--allow-host" in err.message, host
    refused_origin = ["http://evil.example:8000", "http://localhost:3000", "null", "file://", "http://127.0.0.1",
                      "http://127.0.0.1:8000/path", "chrome-extension://abc", "http://x@127.0.0.1:8000", "garbage"]
    for origin in refused_origin:
        err = rule.refusal("127.0.0.1:8000", origin, 8000)
        assert err is not None and err.status == 403 and "--allow-origin" in err.message, origin

    # the --host given is a name of the server; a wildcard bind takes IP addresses, never names
    assert HostRule(bind="box.lan").refusal("box.lan:8000", "http://box.lan:8000", 8000) is None
    wild = HostRule(bind="0.0.0.0")
    assert wild.refusal("192.168.1.5:8000", "http://192.168.1.5:8000", 8000) is None
    assert wild.refusal("[fe80::1]:8000", None, 8000) is None
    assert wild.refusal("box.lan:8000", None, 8000).status == 421  # type: ignore[union-attr]
    assert wild.refusal("192.168.1.5:8000", "http://10.0.0.7:8000", 8000).status == 403  # type: ignore[union-attr]

    # --allow-host NAME: any port; NAME:PORT: that one; --allow-origin: exact origins, null, *
    proxy = HostRule(allow_hosts=("rag.example.com", "lan-box:9000"),
                     allow_origins=("https://app.example", "null"))
    for host in ("rag.example.com", "rag.example.com:443", "RAG.example.com:8443", "lan-box:9000"):
        assert proxy.refusal(host, None, 8000) is None, host
    assert proxy.refusal("lan-box:9001", None, 8000).status == 421  # type: ignore[union-attr]
    for origin in ("https://rag.example.com", "https://app.example", "https://app.example:443", "null"):
        assert proxy.refusal("rag.example.com", origin, 8000) is None, origin
    assert proxy.refusal("rag.example.com", "https://app.example:8443", 8000).status == 403  # type: ignore[union-attr]
    assert HostRule(allow_hosts=("*",)).refusal("anything.example:1", None, 8000) is None
    assert HostRule(allow_origins=("*",)).refusal("127.0.0.1:8000", "https://any.example", 8000) is None
    for bad in (("a:b:c",), ("host:port",), ("[::1",), (":80",)):
        with pytest.raises(ValueError):
            HostRule(allow_hosts=bad)
    for bad in (("rag.example.com",), ("https://x.example/path",), ("ftp://x.example",)):
        with pytest.raises(ValueError):
            HostRule(allow_origins=bad)


# -- slimrag serve -------------------------------------------------------------------------------


def test_a_foreign_host_gets_421_on_every_path(base: str) -> None:
    port = port_of(base)
    for method, path in [("GET", "/"), ("GET", "/static/app.js"), ("GET", "/healthz"), ("GET", "/v1/status"),
                         ("GET", "/v1/passages/0"), ("POST", "/v1/search"), ("POST", "/v1/chat/completions"),
                         ("GET", "/v1/models"), ("GET", "/metrics"), ("GET", "/openapi.json"), ("GET", "/nothing")]:
        for host in (f"{EVIL}:{port}", EVIL, f"127.0.0.1:{port + 1}", "127.0.0.1"):
            status, body = send(base, method, path, host=host, body=SEARCH if method == "POST" else None)
            assert status == 421 and code_of(body) == "misdirected_request", (method, path, host, status)
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
        assert send(base, "GET", "/healthz", host=host)[0] == 200, host


def test_a_foreign_origin_gets_403(base: str) -> None:
    port = port_of(base)
    for origin in (f"http://{EVIL}:{port}", f"http://localhost:{port + 1}", "null", "https://example.org"):
        for method, path in [("POST", "/v1/search"), ("GET", "/v1/status"), ("GET", "/")]:
            status, body = send(base, method, path, origin=origin, body=SEARCH if method == "POST" else None)
            assert status == 403 and code_of(body) == "forbidden_origin", (origin, path, status)
    # the page's own origin, under each of the server's names, is answered
    for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}", f"http://[::1]:{port}"):
        status, body = send(base, "POST", "/v1/search", origin=origin, body=SEARCH)
        assert status == 200 and json.loads(body)["data"][0]["source"] == "guide/cats.md", origin


def test_requests_without_an_origin_work_as_before(base: str) -> None:
    """As the ``openai`` client and curl send them: Host as in the URL, no Origin."""
    with httpx.Client(base_url=base, timeout=20) as client:
        assert client.get("/v1/models").json()["data"][0]["id"] == "slimrag"
        answer = client.post("/v1/chat/completions", json={"model": "x", "messages": [
            {"role": "user", "content": "What is the office cat called?"}]})
        assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"]
        r = client.post("/v1/search", json={"query": "office cat", "k": 1})
        assert r.status_code == 200 and r.json()["data"][0]["source"] == "guide/cats.md"


def test_a_rebinding_request_for_the_status_is_refused(base: str, index: Index, echo: OpenAIServer) -> None:
    """What a page on evil.example sends once its name resolves to 127.0.0.1: its own name as
    Host, its own origin as Origin (the same origin, to the browser)."""
    port = port_of(base)
    for origin in (None, f"http://{EVIL}:{port}"):
        status, body = send(base, "GET", "/v1/status", host=f"{EVIL}:{port}", origin=origin)
        assert status == 421 and str(index.root).encode() not in body
    # the same request, to a server told that the name is its own, reads the index's path: the
    # guard is what refuses it above
    with running(create_app(RAG(index, echo.base_url), hosts=HostRule(allow_hosts=(EVIL,)))) as url:
        status, body = send(url, "GET", "/v1/status", host=f"{EVIL}:{port_of(url)}",
                            origin=f"http://{EVIL}:{port_of(url)}")
        assert status == 200 and json.loads(body)["path"] == str(index.root)


def test_a_reverse_proxy_name_is_allowed_with_allow_host(index: Index, echo: OpenAIServer) -> None:
    rule = HostRule(allow_hosts=("rag.example.com",), allow_origins=("https://tools.example",))
    with running(create_app(RAG(index, echo.base_url), hosts=rule)) as url:
        for host, origin in [("rag.example.com", None), ("rag.example.com", "https://rag.example.com"),
                             ("rag.example.com", "https://tools.example"), (None, "https://tools.example")]:
            assert send(url, "POST", "/v1/search", host=host, origin=origin, body=SEARCH)[0] == 200, (host, origin)
        assert send(url, "POST", "/v1/search", host="rag.example.com", origin="https://other.example",
                    body=SEARCH)[0] == 403
        assert send(url, "GET", "/healthz", host="other.example.com")[0] == 421


def test_refusals_are_counted_in_metrics(base: str) -> None:
    port = port_of(base)
    send(base, "GET", "/v1/status", host=f"{EVIL}:{port}")
    send(base, "POST", "/v1/search", origin=f"http://{EVIL}:{port}", body=SEARCH)
    text = httpx.get(f"{base}/metrics", timeout=20).text
    assert 'slimrag_requests_total{endpoint="/v1/status",status="421"}' in text
    assert 'slimrag_errors_total{endpoint="/v1/search",status="403"}' in text


# -- slimrag route -------------------------------------------------------------------------------


def test_the_router_checks_host_and_origin_as_serve_does(base: str) -> None:
    with running(create_router_app([base], RouterConfig(health_interval_s=0))) as url:
        port = port_of(url)
        status, body = send(url, "GET", "/v1/status", host=f"{EVIL}:{port}")
        assert status == 421 and code_of(body) == "misdirected_request"
        status, body = send(url, "POST", "/v1/search", origin=f"http://{EVIL}:{port}", body=SEARCH)
        assert status == 403 and code_of(body) == "forbidden_origin"
        # the page's own origin goes through the router, which sends the replica its own URL's name
        status, body = send(url, "POST", "/v1/search", origin=f"http://localhost:{port}", body=SEARCH)
        assert status == 200 and json.loads(body)["data"][0]["source"] == "guide/cats.md"


# -- slimrag mcp --http --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_mcp_over_http_uses_the_same_rule_and_flags(index: Index) -> None:
    port = _free_port()
    cmd = [sys.executable, "-c", "from slimrag.cli import main; main()", "mcp", str(index.root), "--http",
           "--port", str(port), "--allow-host", "rag.example.com"]
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    init = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}).encode()
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "slimrag mcp --http did not listen within 60 s"
                time.sleep(0.2)
        status, body = send(url, "POST", "/mcp", host=f"{EVIL}:{port}", body=init)
        assert status == 421 and code_of(body) == "misdirected_request"
        # another local port's page: the SDK's own rule (loopback origins on any port) let it in
        status, body = send(url, "POST", "/mcp", origin=f"http://localhost:{port + 1}", body=init)
        assert status == 403 and code_of(body) == "forbidden_origin"
        for host, origin in [(None, None), (None, f"http://127.0.0.1:{port}"), ("rag.example.com", None)]:
            status, body = send(url, "POST", "/mcp", host=host, origin=origin, body=init)
            assert status == 200 and b'"serverInfo"' in body, (host, origin, status, body)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# -- the flags -----------------------------------------------------------------------------------


def test_the_three_commands_share_the_flags_and_refuse_bad_values(tmp_path: Path) -> None:
    runner = CliRunner()
    verbs = {"serve": ["serve", str(tmp_path)], "route": ["route", "--replica", "http://127.0.0.1:9"],
             "mcp": ["mcp", str(tmp_path), "--http"]}
    for verb, args in verbs.items():
        help_text = runner.invoke(cli, [*args[:1], "--help"]).output
        assert "--allow-host" in help_text and "--allow-origin" in help_text, verb
        result = runner.invoke(cli, [*args, "--allow-host", "a:b:c"])
        assert result.exit_code == 2 and "--allow-host" in result.output, (verb, result.output)
        result = runner.invoke(cli, [*args, "--allow-origin", "rag.example.com"])
        assert result.exit_code == 2 and "--allow-origin" in result.output, (verb, result.output)
    result = runner.invoke(cli, ["mcp", str(tmp_path), "--allow-host", "x.example"])
    assert result.exit_code == 2 and "only with --http" in result.output


# -- in a browser --------------------------------------------------------------------------------


def test_a_page_on_a_rebinding_name_is_refused_in_chromium_and_the_own_page_works(base: str, index: Index) -> None:
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        pytest.skip("the Python package playwright is not installed: pip install -e '.[dev]'")
    if CHROMIUM is None:
        pytest.skip("no chromium on PATH: install Debian's chromium (apt-get install chromium)")
    port = port_of(base)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM,
                                     args=[f"--host-resolver-rules=MAP {EVIL} 127.0.0.1"])
        try:
            page = browser.new_page()
            page.set_default_timeout(30_000)
            response = page.goto(f"http://{EVIL}:{port}/")
            assert response is not None and response.status == 421
            # what the attacker's script would run, from the rebinding origin
            got = page.evaluate("""async () => {
                const r = await fetch('/v1/status'); return [r.status, await r.text()]; }""")
            assert got[0] == 421 and str(index.root) not in got[1]
            got = page.evaluate("""async () => {
                const r = await fetch('/v1/search', {method: 'POST', headers: {'Content-Type': 'application/json'},
                                                     body: JSON.stringify({query: 'office cat'})});
                return r.status; }""")
            assert got == 421
            # the page the server itself serves: its status line and a search (a POST with Origin)
            page.goto(f"{base}/")
            expect(page.locator("#status-documents")).to_have_text(f"{index.status()['documents']:,}")
            got = page.evaluate("""async () => {
                const r = await fetch('/v1/search', {method: 'POST', headers: {'Content-Type': 'application/json'},
                                                     body: JSON.stringify({query: 'office cat', k: 1})});
                return [r.status, (await r.json()).data[0].source]; }""")
            assert got == [200, "guide/cats.md"]
        finally:
            browser.close()
