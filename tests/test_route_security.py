"""The router follows the replicas' rule: with a key, ``/metrics`` and every forwarded route need
it and ``/healthz`` names no replica without it; bodies are bounded both ways (a client's at
``max_body_bytes``, chunked too; a replica's error body read at most `MAX_ERROR_BYTES`); ``/docs``
is off and the page carries its CSP. Real servers on 127.0.0.1 (`OpenAIServer` replicas)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from asgi_server import assert_error, running
from openai_server import OpenAIServer

from slimrag.route.app import create_router_app
from slimrag.route.policy import RouterConfig

KEY = "router-Key-1"
AUTH = {"Authorization": f"Bearer {KEY}"}
SEARCH = {"query": "lighthouse", "k": 1}


@pytest.fixture(scope="module")
def replica() -> Iterator[OpenAIServer]:
    with OpenAIServer() as srv:
        srv.api_key = KEY
        yield srv


def root(srv: OpenAIServer) -> str:
    return srv.base_url.removesuffix("/v1")


def test_with_a_key_metrics_and_routes_need_it_and_healthz_names_no_replica(replica: OpenAIServer) -> None:
    app = create_router_app([root(replica)], RouterConfig(health_interval_s=0), api_key=KEY)
    with running(app) as url, httpx.Client(base_url=url, timeout=10) as client:
        before = len(replica.requests)
        for method, path in [("GET", "/metrics"), ("GET", "/v1/models"), ("POST", "/v1/search"),
                             ("GET", "/openapi.json"), ("GET", "/v1/status"), ("GET", "/nothing")]:
            r = client.request(method, path, json=SEARCH if method == "POST" else None)
            assert_error(r, 401)
            assert r.headers["www-authenticate"] == "Bearer"
        assert len(replica.requests) == before  # refused at the router, nothing forwarded
        bare = client.get("/healthz")
        assert bare.status_code == 200 and bare.json() == {"status": "ok"}
        assert root(replica) not in bare.text
        wrong = client.get("/healthz", headers={"Authorization": "Bearer nope"})
        assert wrong.json() == {"status": "ok"}
        full = client.get("/healthz", headers=AUTH).json()
        assert full["replicas"][0]["url"] == root(replica)
        metrics = client.get("/metrics", headers=AUTH)
        assert metrics.status_code == 200 and root(replica) in metrics.text
        assert client.get("/v1/models", headers=AUTH).status_code == 200  # passed on to the replica
        assert client.get("/", headers={}).status_code == 200  # the page needs no key


def test_without_a_key_the_router_is_open_like_a_replica_without_one(replica: OpenAIServer) -> None:
    with running(create_router_app([root(replica)], RouterConfig(health_interval_s=0))) as url:
        assert httpx.get(f"{url}/metrics", timeout=10).status_code == 200
        assert httpx.get(f"{url}/healthz", timeout=10).json()["replicas"][0]["url"] == root(replica)


def test_a_key_no_client_can_send_is_refused(replica: OpenAIServer) -> None:
    with pytest.raises(ValueError, match="white space"):
        create_router_app([root(replica)], api_key=" key")


def test_bodies_are_bounded_both_ways(replica: OpenAIServer) -> None:
    app = create_router_app([root(replica)], RouterConfig(health_interval_s=0, max_body_bytes=10_000))
    with running(app) as url, httpx.Client(base_url=url, timeout=10, headers=AUTH) as client:
        def chunked() -> Iterator[bytes]:
            yield b'{"query": "'
            for _ in range(100):
                yield b"x" * 1000
            yield b'"}'

        assert_error(client.post("/v1/search", content=chunked(), headers={"Content-Type": "application/json"}), 413)
        replica.fail_status, replica.fail_message = 500, "x" * (4 << 20)  # a 4 MiB error body
        try:
            r = client.post("/v1/search", json=SEARCH)
        finally:
            replica.fail_status, replica.fail_message = None, "injected failure"
        assert_error(r, 502)
        assert len(r.content) < 4096, len(r.content)  # named in a line, not relayed or buffered whole


def test_docs_are_off_and_html_carries_a_csp_forbidding_other_origins(replica: OpenAIServer) -> None:
    with running(create_router_app([root(replica)], RouterConfig(health_interval_s=0))) as url:
        for path in ("/docs", "/redoc"):
            r = httpx.get(url + path, timeout=10)
            assert r.status_code == 404 and "cdn" not in r.text.lower()
        assert httpx.get(f"{url}/openapi.json", timeout=10).json()["info"]["title"] == "slimrag router"
        page = httpx.get(url + "/", timeout=10)
        csp = page.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp and "http" not in csp
        assert "cdn" not in page.text.lower() and "https://" not in page.text
