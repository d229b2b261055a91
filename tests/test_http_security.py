"""`slimrag serve --api-key`: every route but ``/healthz`` needs the key, odd and encoded paths do
not get past it, the Bearer scheme is matched in any case, a non-ASCII key works, keys no client
can send are refused at start-up, and binding beyond loopback without a key warns. A real uvicorn
on 127.0.0.1; requests with odd paths go through `http.client`, which sends the path as written."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from asgi_server import running
from click.testing import CliRunner
from conftest import DOCS, write_tree
from openai_server import OpenAIServer

from slimrag.api.gate import bearer_matches, check_api_key
from slimrag.cli import cli
from slimrag.cli.serving import bind_warning
from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.rag.pipeline import RAG
from slimrag.serve.app import create_app

KEY = "s3cret-Key"
UNICODE_KEY = "clé-ключ-鍵-🔑"
SEARCH = json.dumps({"query": "office cat", "k": 1}).encode()


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Index]:
    docs = write_tree(tmp_path_factory.mktemp("docs"), DOCS)
    with Index.build(docs, tmp_path_factory.mktemp("idx") / "sec.slimrag", embedder=embedder) as idx:
        yield idx


@pytest.fixture(scope="module")
def base(index: Index, echo: OpenAIServer) -> Iterator[str]:
    with running(create_app(RAG(index, echo.base_url), api_key=KEY)) as url:
        yield url


def send(base: str, method: str, path: str, auth: bytes | None = None, body: bytes | None = None) -> tuple[int, bytes]:
    """One request with ``path`` sent exactly as given; the status and body."""
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        if auth is not None:
            conn.putheader("Authorization", auth)
        if body is not None:
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_every_route_but_healthz_needs_the_key(base: str) -> None:
    routes = [("GET", "/v1/models"), ("POST", "/v1/search"), ("POST", "/v1/embeddings"),
              ("POST", "/v1/chat/completions"), ("GET", "/metrics"), ("GET", "/openapi.json"), ("GET", "/docs"),
              ("GET", "/redoc"), ("GET", "/nothing"), ("OPTIONS", "/v1/search"), ("POST", "/healthz"),
              ("GET", "/healthz/"), ("DELETE", "/v1/models")]
    for method, path in routes:
        status, body = send(base, method, path, body=SEARCH if method == "POST" else None)
        assert status == 401, (method, path, status)
        assert json.loads(body)["error"]["code"] == "invalid_api_key"
    assert send(base, "GET", "/healthz")[0] == 200
    auth = f"Bearer {KEY}".encode()
    assert send(base, "GET", "/metrics", auth)[0] == 200 and send(base, "GET", "/openapi.json", auth)[0] == 200


def test_odd_and_encoded_paths_do_not_bypass_the_key(base: str) -> None:
    odd = ["//v1/search", "/v1/%73earch", "/V1/search", "/v1//search", "/v1/search/", "/./v1/search",
           "/healthz/../v1/search", "/%2e/v1/search", "/v1/search%00", "/%68ealthz/../v1/search",
           "http://127.0.0.1/v1/search", "/v1/search?x=/healthz", "/v1/search#/healthz", "/healthz%2f..%2fv1/search"]
    for path in odd:
        status, _ = send(base, "POST", path, body=SEARCH)
        # 400: a target uvicorn refuses to parse; 421: the absolute form, whose Host (taken from
        # the target by http.client) has no port, so it does not name this server
        assert status in (400, 401, 421), (path, status)
        assert status != 200
    # with the key, the percent-encoded path is the same route (routing and the gate see one path)
    status, body = send(base, "POST", "/v1/%73earch", f"Bearer {KEY}".encode(), SEARCH)
    assert status == 200 and json.loads(body)["data"][0]["source"] == "guide/cats.md"


def test_the_bearer_scheme_is_matched_in_any_case(base: str) -> None:
    for good in (f"Bearer {KEY}", f"bearer {KEY}", f"BEARER {KEY}", f"bEaReR   {KEY}  "):
        assert send(base, "POST", "/v1/search", good.encode(), SEARCH)[0] == 200, good
    for bad in (KEY, f"Basic {KEY}", f"Bearer{KEY}", f"Bearer {KEY.lower()}", f"Bearer {KEY}x", f"Bearer {KEY[:-1]}",
                "Bearer", ""):
        assert send(base, "POST", "/v1/search", bad.encode(), SEARCH)[0] == 401, bad


def test_a_non_ascii_key_works_as_utf8(index: Index, echo: OpenAIServer) -> None:
    with running(create_app(RAG(index, echo.base_url), api_key=UNICODE_KEY)) as url:
        assert send(url, "POST", "/v1/search", f"Bearer {UNICODE_KEY}".encode(), SEARCH)[0] == 200
        assert send(url, "POST", "/v1/search", f"Bearer {UNICODE_KEY}".encode("latin-1", "replace"), SEARCH)[0] == 401
        assert send(url, "POST", "/v1/search", b"Bearer " + UNICODE_KEY.encode()[:-1], SEARCH)[0] == 401
        assert send(url, "POST", "/v1/search", None, SEARCH)[0] == 401


def test_keys_no_client_can_send_are_refused_at_start_up(index: Index, tmp_path: Path) -> None:
    assert check_api_key(UNICODE_KEY) == UNICODE_KEY.encode()
    for bad, why in (("", "empty"), (" key", "white space"), ("key\t", "white space"), ("a\nb", "control"),
                     ("a\x00b", "control"), ("\ud800", "surrogate")):
        with pytest.raises(ValueError, match=why):
            check_api_key(bad)
        with pytest.raises(ValueError, match=why):
            create_app(RAG(index, "http://127.0.0.1:9/v1"), api_key=bad) if bad else check_api_key(bad)
    result = CliRunner().invoke(cli, ["serve", str(tmp_path), "--api-key", " spaced"])
    assert result.exit_code == 2 and "white space" in result.output  # before any model loads
    assert bearer_matches(b"bearer k", b"k") and not bearer_matches(b"bearer k", b"K")


def test_binding_beyond_loopback_without_a_key_warns() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"):
        assert bind_warning(host, None) is None, host
    for host in ("0.0.0.0", "::", "192.168.1.5", "example.org"):
        warning = bind_warning(host, None)
        assert warning is not None and host in warning and "--api-key" in warning
        assert bind_warning(host, KEY) is None


def test_docs_are_off_and_any_html_gets_a_csp(index: Index, echo: OpenAIServer) -> None:
    from slimrag.api.gate import with_csp

    with running(create_app(RAG(index, echo.base_url), warm=False)) as url:
        for path in ("/docs", "/redoc"):  # Swagger UI and ReDoc would load script from a CDN
            status, body = send(url, "GET", path)
            assert status == 404 and b"cdn" not in body.lower()
        status, body = send(url, "GET", "/openapi.json")
        assert status == 200 and json.loads(body)["info"]["title"] == "slimrag"
    html = with_csp({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/html")]})
    assert dict(html["headers"])[b"content-security-policy"].startswith(b"default-src 'self'")
    own = [(b"content-type", b"text/html"), (b"content-security-policy", b"default-src 'none'")]
    assert with_csp({"type": "http.response.start", "headers": own})["headers"] == own
    plain = [(b"content-type", b"application/json")]
    assert with_csp({"type": "http.response.start", "headers": plain})["headers"] == plain
