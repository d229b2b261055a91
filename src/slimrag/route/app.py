"""The router of ``slimrag route``: one OpenAI-compatible front over several slimrag replicas.

Which replica answers follows SGLang's cache-aware router: the replica whose approximate prefix
tree best matches the conversation, unless in-flight load is imbalanced, then the least loaded.
The rule, its knobs and their defaults are in `slimrag.route.policy`; the tree in
`slimrag.route.prefix_tree`. Replicas that publish KV events (``slimrag serve --kv-events``,
named in their ``/healthz``) are followed exactly (`slimrag.route.events`, `slimrag.route.kv_view`);
with ``index`` (``slimrag route --index``) the router retrieves a chat's passages itself
(`slimrag.route.planner`), routes it by the prefill they save against load
(`slimrag.route.kv_policy`), and passes them on in ``X-Slimrag-Plan`` so the replica does not search.

Endpoints
    ``POST /v1/chat/completions``: validated as ``slimrag serve`` validates it (`ChatRequest`, so a
    bad request gets the same OpenAI-shaped 400 without a round trip), routed by its conversation
    text, and forwarded byte for byte, streaming or not. ``POST /v1/embeddings``,
    ``POST /v1/search``, ``GET /v1/models``, ``GET /v1/status`` and ``GET /v1/passages/{id}``:
    forwarded to the least-loaded replica, which validates them. ``GET /``: the web page, served
    by the router itself without the key (`slimrag.api.page`), so it works behind the router too. ``GET /healthz``: the router's view of each replica (healthy, in flight, tree
    size); 503 when every replica is cooling down. ``GET /metrics``. The ``Authorization`` header
    is passed through: replicas with an API key check it. Every forwarded
    answer names its replica in ``X-Slimrag-Replica``. Bodies over ``max_body_bytes`` get 413; of a
    replica's error body at most `MAX_ERROR_BYTES` (64 KiB) is read. Connections are guarded as
    ``slimrag serve``'s are (`slimrag.api.connections`: header and body timeouts, a cap).
    Host and Origin are checked first, as ``slimrag serve`` checks them (`slimrag.api.hosts`); the
    router sends neither on (a replica sees its own URL's name as Host, and no Origin).

Security
    With an API key (``slimrag route --api-key``, or ``SLIMRAG_API_KEY`` as for ``slimrag
    serve``), the router follows the replicas' rule (`slimrag.api.gate`): every route needs
    ``Authorization: Bearer KEY`` (``/metrics``, which names every replica, ``/openapi.json`` and
    the forwarded ``/v1/`` routes included) but the web page and ``GET /healthz``; ``/healthz``
    answers a caller without the key only ``{"status": ...}`` (200 or 503), never the replicas'
    URLs. The same header is passed on, so give the router the replicas' key. Without a key
    everything is open, as on a replica without one: bind loopback then (the CLI warns otherwise).
    ``/docs`` is off (Swagger UI would load from a CDN).

Forwarding and failover
    The router sends the request with httpx and waits for the replica's status and first bytes.
    A 5xx, a connection error or a timeout until then sends the request to the next choice;
    only the last two and 503/504 also mark the replica down for ``cooldown_s`` (another 5xx may
    be the request's own fault, and taking every replica down for it would be an outage). A
    refused request (4xx) is passed through and leaves no key. Each replica is tried at most once
    per request, healthy ones first. When the first bytes are passed on, the request is committed:
    the rest is relayed as it arrives (server-sent events chunk by chunk) and never retried, since
    a client cannot take back what it received. A replica that breaks off mid-answer is marked
    down, and an event stream then ends with a ``data: {"error": ...}`` event and no ``[DONE]``
    (how ``slimrag serve`` reports a late failure). A 4xx is the request's fault: passed through,
    no failover. When every replica failed: 502, naming each failure. A slimrag replica sends its
    200 only with its first piece, so its retrieval and model failures still come as statuses.

Health checks and hung replicas
    With ``health_interval_s`` > 0 (default 2 s) a background task sends ``GET /healthz`` to each
    replica every interval (timeout ``health_timeout_s``). A failed check marks the replica down
    until a check passes and takes back every request waiting on it for its first byte: each is
    cancelled there (an anyio cancel scope per wait) and sent to the next replica, as a connection
    error would be. Answers already relaying from it are ended the same way: an event stream with
    a ``data: {"error": ...}`` event (code ``replica_failed``), a JSON answer by aborting the
    connection. A passing check brings a replica back at once (see `slimrag.route.policy`).
    Counted in ``slimrag_router_health_checks_total`` by replica and result. A passing check also
    reads the replica's count of its chats (``load`` in its ``/healthz``): what exceeds the router's
    own requests there comes from direct clients, and `slimrag.route.kv_policy` weighs it.

Metrics (Prometheus text)
    ``slimrag_requests_total`` and ``slimrag_errors_total`` by endpoint and status, as ``slimrag
    serve`` counts them (`Gate`); by replica: ``slimrag_router_routed_total`` (answered, with the
    routing reason: cache, balance, least_loaded; kv, kv_load for chats routed by their passages), ``slimrag_router_upstream_total`` (attempts, by
    the replica's status, ``error`` when none came), ``slimrag_router_failures_total`` (attempts
    that failed over or answers broken off), and the gauges ``slimrag_router_in_flight``,
    ``slimrag_router_healthy`` and ``slimrag_router_tree_chars``.

Clients that leave
    A client that disconnects while the router waits for a replica's first bytes (a non-streamed
    chat waits for the whole answer) cancels the attempt: the upstream connection closes, so the
    replica stops generating too (`slimrag.api.disconnect`); counted as status 499.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

import anyio
import httpx
from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.requests import Request

from slimrag.api.disconnect import ClientGone, until_gone
from slimrag.api.errors import APIError, install_handlers
from slimrag.api.gate import Gate, bearer_matches, check_api_key
from slimrag.api.hosts import HostGuard, HostRule
from slimrag.api.page import PageFront
from slimrag.api.plan_header import PLAN_HEADER, format_plan
from slimrag.api.schemas import ChatRequest
from slimrag.errors import SlimragError
from slimrag.route.kv_policy import choose_planned
from slimrag.route.metrics import RouterMetrics
from slimrag.route.planner import RoutePlan, RoutePlanner
from slimrag.route.policy import Replica, RouterConfig, choose, replica_url
from slimrag.route.prefix_tree import PrefixTree
from slimrag.route.upstream import Failure, Relayed, head_of, json_object, reason_of

if TYPE_CHECKING:
    from slimrag.route.events import EventStreams

log = logging.getLogger(__name__)
T = TypeVar("T")


class _Lost:
    """What `Router._wait` returns when the replica failed its health check during the wait."""


LOST = _Lost()

#: Request headers passed on to replicas, and response headers passed back to the client.
FORWARDED = ("authorization", "content-type", "accept")
RETURNED = ("content-type", "cache-control", "content-encoding", "www-authenticate")


def routing_key(req: ChatRequest) -> str:
    """The text a chat completion is routed by: each message as ``<role>text`` and a newline."""
    return "".join(f"<{m.role}>{m.text()}\n" for m in req.messages)


class Router:
    """The replicas, their trees and loads, and the HTTP client of one router app. Event loop only."""

    def __init__(self, replicas: Sequence[str], config: RouterConfig, planner: RoutePlanner | None = None) -> None:
        urls = [replica_url(u) for u in replicas]
        if not urls:
            raise ValueError("give at least one replica URL")
        if len(set(urls)) != len(urls):
            raise ValueError(f"a replica is given twice: {urls}")
        self.config, self.planner = config, planner
        self.replicas = [Replica(u, PrefixTree(config.max_tree_chars)) for u in urls]
        self.streams: EventStreams | None = None
        self.metrics = RouterMetrics()
        #: Planned chats so far: the round-robin position that spreads ties (`choose_planned`).
        self.turn = 0
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s),
                                        limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
        #: The cancel scopes of every wait on a replica (first byte, next chunk), cancelled when
        #: its health check fails.
        self._waits: dict[str, set[anyio.CancelScope]] = {r.url: set() for r in self.replicas}

    async def _wait(self, replica: Replica, awaitable: Awaitable[T]) -> T | _Lost:
        """``awaitable``'s result, or `LOST` when the replica's health check fails meanwhile."""
        with anyio.CancelScope() as scope:
            self._waits[replica.url].add(scope)
            try:
                return await awaitable
            finally:
                self._waits[replica.url].discard(scope)
        return LOST  # reached only when the scope was cancelled

    async def check_health(self) -> None:
        """One round of health checks, all replicas at once (see the module header)."""

        async def check(replica: Replica) -> None:
            try:
                r = await self.client.get(replica.url + "/healthz", timeout=self.config.health_timeout_s)
                ok, why = r.status_code == 200, f"status {r.status_code}"
                if ok:
                    info = json_object(r)
                    self._follow_events(replica, info.get("kv_events"))
                    replica.read_load(info.get("load"))
            except httpx.TransportError as exc:
                ok, why = False, f"{type(exc).__name__}: {exc or 'no answer'}"
            self.metrics.inc("slimrag_router_health_checks_total", replica=replica.url,
                             result="ok" if ok else "failed")
            if replica.checked(ok):
                if ok:
                    log.warning("replica %s passed its health check: back in rotation", replica.url)
                else:
                    log.warning("replica %s failed its health check (%s): left out, %d waiting requests "
                                "taken back", replica.url, why, len(self._waits[replica.url]))
            if not ok:
                for scope in list(self._waits[replica.url]):
                    scope.cancel()

        async with anyio.create_task_group() as tg:
            for replica in self.replicas:
                tg.start_soon(check, replica)

    def _follow_events(self, replica: Replica, info: Any) -> None:
        """Start (or keep, or stop) the replica's KV event stream as its ``/healthz`` names it."""
        if info is None and self.streams is None:
            return
        if self.streams is None:
            from slimrag.route.events import EventStreams  # pyzmq: only when a replica publishes

            self.streams = EventStreams()
        from slimrag.llm.kv.config import BLEND, EXACT  # the KV package: only when a replica publishes

        replica.events = self.streams.watch(replica.url, info)
        replica.reuse = BLEND if isinstance(info, dict) and info.get("reuse") == BLEND else EXACT

    async def plan(self, req: ChatRequest) -> RoutePlan | None:
        """The chat's passages when the router plans (``--index``), else None; a failed plan routes
        the chat as before, by its text."""
        if self.planner is None:
            return None
        try:
            return await self.planner.aplan(req)
        except (SlimragError, OSError, ValueError) as exc:
            log.warning("could not plan a chat's passages (%s); routing it by its text", exc)
            return None

    async def watch_health(self) -> None:
        """Check health every ``health_interval_s`` until cancelled."""
        while True:
            await self.check_health()
            await anyio.sleep(self.config.health_interval_s)

    async def forward(self, request: Request, path: str, key: str | None, plan: RoutePlan | None = None) -> Response:
        """Answer ``request`` from a replica chosen by ``key``, or by ``plan``'s passages (module header)."""
        body = await request.body()
        headers = {k: v for k in FORWARDED if (v := request.headers.get(k)) is not None}
        tried: list[Replica] = []
        failures: list[str] = []
        planned = headers if plan is None else {**headers, PLAN_HEADER: format_plan(plan.hits)}
        turn, self.turn = self.turn, self.turn + (plan is not None)
        while len(tried) < len(self.replicas):
            now = time.monotonic()
            untried = [r for r in self.replicas if r not in tried]
            pool = [r for r in untried if r.healthy(now)] or untried
            if plan is None:
                (replica, reason), prefill, sent = choose(pool, key, self.config), 0, headers
            else:
                (replica, reason, prefill), sent = choose_planned(pool, plan, key, self.config, turn), planned
            tried.append(replica)
            try:  # a client that leaves before the answer starts: stop waiting, close the upstream
                outcome = await until_gone(request, self._attempt(replica, request.method, path, body, sent, prefill))
            except ClientGone:
                return Response(status_code=499)  # nobody reads it; counted as the client leaving
            if isinstance(outcome, Response):
                if key and outcome.status_code < 400:  # a refused request left nothing cached there
                    replica.tree.insert(key)
                self.metrics.inc("slimrag_router_routed_total", replica=replica.url, reason=reason)
                return outcome
            failures.append(f"{replica.url}: {outcome.reason}")
            if outcome.down:
                log.warning("replica %s failed (%s); left out for %gs", replica.url, outcome.reason,
                            self.config.cooldown_s)
                self._failed(replica)
            else:
                log.warning("replica %s answered %s; trying another", replica.url, outcome.reason)
        raise APIError(502, f"no replica answered ({'; '.join(failures)}); check that they are running",
                       code="replicas_unavailable")

    async def _attempt(self, replica: Replica, method: str, path: str, body: bytes,
                       headers: dict[str, str], prefill: int = 0) -> Response | Failure:
        """Send the request to ``replica``: its answer, committed, or why it failed before any byte.
        ``prefill``: its estimated prefill tokens, counted as pending there until the first byte."""
        replica.in_flight += 1
        replica.pending_prefill += prefill
        replica.waiting += 1
        upstream: httpx.Response | None = None
        owned = True  # until the relay takes the upstream response and the in-flight count over
        try:
            sent = self.client.build_request(method, replica.url + path, content=body, headers=headers)
            got = await self._wait(replica, self.client.send(sent, stream=True))
            if isinstance(got, _Lost):
                self.metrics.inc("slimrag_router_upstream_total", replica=replica.url, status="error")
                return Failure("failed its health check while the request waited for an answer", down=True)
            upstream = got
            status = upstream.status_code
            self.metrics.inc("slimrag_router_upstream_total", replica=replica.url, status=str(status))
            if status >= 500:  # retried elsewhere; only an unreachable or overloaded replica is left out
                return Failure(reason_of(status, await head_of(upstream)), down=status in (503, 504))
            chunks = upstream.aiter_raw()
            first = await self._wait(replica, anext(chunks, b""))
            if isinstance(first, _Lost):
                return Failure("failed its health check before the first byte of its answer", down=True)
            returned = {k: v for k in RETURNED if (v := upstream.headers.get(k)) is not None}
            owned = False
            return Relayed(self._relay(replica, upstream, first, chunks), status,
                            {**returned, "x-slimrag-replica": replica.url}, self._releaser(replica, upstream))
        except httpx.TransportError as exc:  # connection refused or reset, timeouts, broken HTTP
            if upstream is None:
                self.metrics.inc("slimrag_router_upstream_total", replica=replica.url, status="error")
            return Failure(f"{type(exc).__name__}: {exc or 'no detail'}", down=True)
        finally:
            replica.pending_prefill -= prefill
            replica.waiting -= 1
            if owned:
                replica.in_flight -= 1
                if upstream is not None:
                    await upstream.aclose()

    def _releaser(self, replica: Replica, upstream: httpx.Response) -> Callable[[], Awaitable[None]]:
        async def release() -> None:
            replica.in_flight -= 1
            await upstream.aclose()

        return release

    async def _relay(self, replica: Replica, upstream: httpx.Response, first: bytes,
                     chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """The answer's bytes as they arrive; an error event when the replica breaks off a stream."""
        if first:
            yield first
        try:
            while True:
                chunk = await self._wait(replica, anext(chunks, None))
                if chunk is None:
                    return
                if isinstance(chunk, _Lost):
                    raise httpx.ReadTimeout("the replica failed its health check in the middle of the answer")
                yield chunk
        except httpx.TransportError as exc:  # committed: the client has bytes, nothing can be retried
            log.warning("replica %s broke off an answer (%s: %s)", replica.url, type(exc).__name__, exc)
            self._failed(replica)
            if upstream.headers.get("content-type", "").startswith("text/event-stream"):
                err = APIError(502, f"replica {replica.url} broke off the answer ({type(exc).__name__}: {exc}); "
                                    "ask again", code="replica_failed")
                yield f"data: {json.dumps(err.body())}\n\n".encode()
            else:
                raise  # a JSON answer cut short: abort the connection rather than end it cleanly

    def _failed(self, replica: Replica) -> None:
        replica.mark_down(self.config.cooldown_s)
        self.metrics.inc("slimrag_router_failures_total", replica=replica.url)

    def health(self) -> dict[str, Any]:
        """The router's view of its replicas."""
        now = time.monotonic()
        states = [{"url": r.url, "healthy": r.healthy(now), "in_flight": r.in_flight, "tree_chars": r.tree.size}
                  for r in self.replicas]
        return {"status": "ok" if any(s["healthy"] for s in states) else "unavailable", "replicas": states}


def create_router_app(replicas: list[str], config: RouterConfig | None = None,
                      hosts: HostRule | None = None, api_key: str | None = None,
                      index: str | None = None) -> FastAPI:
    """The router over ``replicas`` (server roots such as ``http://127.0.0.1:8001``; a trailing
    ``/v1`` is dropped), with ``config``'s knobs (defaults: `RouterConfig`), answering the Host and
    Origin values of ``hosts`` (`slimrag.api.hosts`; default the loopback names). ``api_key``:
    required on every route but the page and ``/healthz``, which names the replicas only to a
    caller with the key (see "Security" in the module header). ``index``: the replicas' index folder,
    to route chats by their passages (`slimrag.route.planner`). Raises ValueError for no replica, a
    repeated one, a URL that is not ``http(s)://host:port``, or a key no client can send."""
    config = config or RouterConfig()
    key = None if api_key is None else check_api_key(api_key)
    router = Router(replicas, config, RoutePlanner(index, chars_per_token=config.chars_per_token) if index else None)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        watcher = asyncio.create_task(router.watch_health()) if config.health_interval_s > 0 else None
        try:
            yield
        finally:
            if watcher is not None:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)
            await router.client.aclose()
            if router.streams is not None:
                await router.streams.close()
            if router.planner is not None:
                await asyncio.to_thread(router.planner.close)

    app = FastAPI(title="slimrag router", summary="cache-aware routing over slimrag replicas", lifespan=lifespan,
                  docs_url=None, redoc_url=None)  # no CDN script: the contract is at /openapi.json
    app.state.router = router  # for tests and bench/route.py: the replicas' views and loads
    app.add_middleware(Gate, api_key=api_key, max_body_bytes=config.max_body_bytes, metrics=router.metrics)
    app.add_middleware(PageFront, metrics=router.metrics)  # the web page, as a replica serves it
    app.add_middleware(HostGuard, rule=hosts or HostRule(), metrics=router.metrics)  # outermost
    install_handlers(app)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest, request: Request) -> Response:
        return await router.forward(request, "/v1/chat/completions", routing_key(req), await router.plan(req))

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        return await router.forward(request, "/v1/embeddings", None)

    @app.post("/v1/search")
    async def search(request: Request) -> Response:
        return await router.forward(request, "/v1/search", None)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        return await router.forward(request, "/v1/models", None)

    # The web page's read-only routes: every replica serves the same index, so any one answers.
    @app.get("/v1/status")
    async def status(request: Request) -> Response:
        return await router.forward(request, "/v1/status", None)

    @app.get("/v1/passages/{chunk_id}")
    async def passage(chunk_id: str, request: Request) -> Response:
        query = f"?{request.url.query}" if request.url.query else ""
        return await router.forward(request, f"/v1/passages/{quote(chunk_id, safe='')}{query}", None)

    @app.get("/healthz")
    async def healthz(request: Request) -> JSONResponse:
        state = router.health()
        code = 200 if state["status"] == "ok" else 503
        if key is not None and not bearer_matches(request.headers.get("authorization", "").encode("latin-1"), key):
            return JSONResponse({"status": state["status"]}, status_code=code)  # replicas are named with the key only
        return JSONResponse(state, status_code=code)

    @app.get("/metrics")
    async def metrics_text() -> PlainTextResponse:
        return PlainTextResponse(router.metrics.render_all(router.replicas),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
