"""The HTTP server (``slimrag serve``): one index and its generator behind OpenAI-compatible routes.

This module builds the app (`create_app`) and holds the routes; the parts live beside it:
`schemas` (request bodies, response JSON), `chat` (RAG as chat completions, streaming),
`workers` (the threads that do the blocking work over one `Session`: one open `Index` for the
process, kept current by catching up), and in
`slimrag.api`: `gate` (API key, body size limit, request counting), `errors` (OpenAI's error
shape and statuses), `openapi` (the published contract) and `metrics`.

Endpoints
    ``POST /v1/chat/completions``: RAG over the served index (see `slimrag.serve.chat`).
    Extensions: ``k`` (passages, default 4) and ``source`` (a glob on source paths); the passages
    used come back in the ``slimrag`` field. ``n`` must be 1. ``model`` may be anything: the
    served model answers, under `create_app`'s ``model_name``.
    ``POST /v1/embeddings``: the index's embedder; ``input`` is a string or up to
    `MAX_EMBED_INPUTS` (256) strings (truncated to the embedder's window, as sentence-transformers does);
    ``encoding_format`` ``float`` or ``base64`` (little-endian float32, as OpenAI sends it).
    ``POST /v1/search``: ``{query, k=5, source?, mode?}`` → hits with chunk id, source, score, text and
    ``similarity`` (the cosine of the query's and the chunk's embeddings, where the search computed it:
    every vector hit, a hybrid hit among the vector candidates; null for a keyword-only hit; unlike
    ``score`` it has an absolute scale, `slimrag.types.Hit`);
    on an index whose vectors are still filling in, ``coverage`` too (what the vectors covered;
    keyword search covered the rest, `slimrag.index.coverage`).
    ``GET /v1/status`` (documents, chunks, bytes on disk, last update) and
    ``GET /v1/passages/{chunk_id}?around=1`` (a chunk in its document, with its neighbours).
    ``GET /v1/models``, ``GET /healthz``, ``GET /metrics`` (Prometheus text format, see
    `slimrag.api.metrics`), ``GET /openapi.json`` (the contract, `slimrag.api.openapi`). ``/docs``
    and ``/redoc`` are off: FastAPI's Swagger UI and ReDoc load their script from a CDN, which an
    offline tool must not do and which would run third-party script on this origin.
    ``GET /``: the web page (ask, streamed answer, citations that open their passage, search,
    status), served with its two static files without the API key; see `slimrag.api.page`.

KV events and routed plans (issue 31)
    With ``kv_events`` (``slimrag serve --kv-events ENDPOINT``) the generator's knowledge tree
    publishes its changes on ZMQ as vLLM publishes its KV events (`slimrag.llm.kv.publish`,
    ``docs/kv-events.md``), and ``GET /healthz`` names the sockets (``kv_events``: ``endpoint``,
    ``replay``, ``topic``, and ``reuse``, the ``--reuse`` mode the events are read by): that is how
    ``slimrag route`` finds them. A chat that carries a router's
    ``X-Slimrag-Plan`` (`slimrag.api.plan_header`) is answered from those passages without a
    second search (`slimrag.serve.planned`). Without either, nothing changes.
    ``GET /healthz`` also reports the chats being answered (``load``: ``chats`` in flight, and
    ``waiting``, those not past their first piece: queued or prefilling), so a router can weigh
    the load of clients that come here directly (`slimrag.route.kv_policy`). A streamed chat is
    counted until its response ends, however the client leaves (`ChatLoad.streamed`).

Errors and limits
    Connections are guarded before any of this runs (`slimrag.api.connections`: a request head
    within 10 s, its body within 30 s more, at most half the open-files limit held). Every error, FastAPI's own included (422 validation errors become 400, unknown routes 404), is
    answered in OpenAI's shape; see `slimrag.api.errors` for the statuses, `slimrag.api.schemas`
    for every limit and its default, and ``/openapi.json`` for the statuses each route declares.

Three pools of worker threads
    Searches, embeddings and chats run on separate `Workers` (``search_workers`` 2,
    ``embed_workers`` 1, ``workers`` 4 by default), so a search never waits in a queue behind
    generations (the old single pool of 4 made searches wait up to 36 s behind 8 chats) nor behind
    a large embeddings batch. They still share the CPU (or GPU): under load a search is slower,
    not queued. The three pools share one session (`slimrag.serve.workers.serving`): one `Index`
    (a SQLite connection per thread), one generator, one slim cache of recomputed rows; and one
    `Backfill` when the index has chunks awaiting vectors, started here and stopped at shutdown.

Clients that leave
    A chat's generation stops when its client disconnects, streamed or not: a streamed answer is
    closed by the response when it sees the disconnect; a non-streamed one races its generation
    against the disconnect (`slimrag.api.disconnect.until_gone`) and, when the client wins, stops the worker at its next
    piece (`Workers.stream`). Embeddings and searches race the same way: a queued job is dropped,
    a running embedding stops at its next batch (`Workers.run`). The request is counted with
    status 499.
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from slimrag.api.disconnect import ClientGone, until_gone
from slimrag.api.errors import APIError, install_handlers
from slimrag.api.gate import Gate, check_api_key
from slimrag.api.hosts import HostGuard, HostRule
from slimrag.api.metrics import Metrics
from slimrag.api.openapi import error_responses, publish
from slimrag.api.page import PageFront
from slimrag.api.plan_header import PLAN_HEADER, parse_plan
from slimrag.api.schemas import (
    ChatRequest,
    EmbeddingsRequest,
    SearchRequest,
    hit_json,
    usage_json,
)
from slimrag.index import backfill
from slimrag.rag.pipeline import RAG
from slimrag.serve.chat import (
    WireAnswer,
    answer_pieces,
    conversation,
    extension,
    final_answer,
    generation_config,
    sse_chunks,
)
from slimrag.serve.planned import planned_hits, planned_pieces
from slimrag.serve.web import add_browse_routes
from slimrag.serve.workers import Abandoned, Worker, Workers, serving

if TYPE_CHECKING:
    from slimrag.llm.kv.publish import EventsConfig

T = TypeVar("T")

#: A chat's 200 answer: a completion, or server-sent events when ``stream`` is true.
_CHAT_200 = {200: {"description": "A chat completion, or with ``stream: true`` server-sent events of chunks.",
                   "content": {"text/event-stream": {"schema": {
                       "type": "object", "required": ["data"],
                       "properties": {"data": {"type": "string", "description": "a chat.completion.chunk as JSON, "
                                               "then [DONE]; or an error object, which ends the stream"}}}}}}}


async def _last(events: AsyncIterator[T], first: T) -> T:
    """The last item of ``events`` (``first`` when it has none left)."""
    last = first
    async for item in events:
        last = item
    return last


class ChatLoad:
    """The chats this server is answering (event loop only), as ``/healthz`` reports them."""

    def __init__(self) -> None:
        self.chats = self.waiting = 0

    def streamed(self, chunks: AsyncGenerator[str, None], source: AsyncGenerator[Any, None]) -> StreamingResponse:
        """A chat's server-sent ``chunks`` (read from ``source``, the worker's pieces) as the response;
        the chat stays counted in flight until the response ends, however it ends (see `_CountedStream`)."""
        return _CountedStream(self, chunks, source)


class _CountedStream(StreamingResponse):
    """A streamed chat that leaves `ChatLoad` and stops its worker when the response ends, whatever
    the client did. Not in the chunks' own ``finally``: under an ASGI 2.4 server, a client gone as
    the response begins makes its first send raise before the body starts, so that ``finally``
    never runs and ``/healthz`` would count the chat for ever; and a body cancelled while it waits
    at a ``yield`` runs it only when garbage collected."""

    def __init__(self, load: ChatLoad, chunks: AsyncGenerator[str, None], source: AsyncGenerator[Any, None]) -> None:
        super().__init__(chunks, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._load, self._chunks, self._source = load, chunks, source

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._load.chats -= 1
            await self._chunks.aclose()  # a started body closes its source itself ...
            await self._source.aclose()  # ... one never started has not: the worker stops here


def warm_up(rag: RAG) -> None:
    """Load the generator's model and the embedder now, so the first request does not wait."""
    rag.llm.load()
    next(rag.index.embed_batches(["warm up"]))


def create_app(rag: RAG, *, api_key: str | None = None, model_name: str = "slimrag", workers: int = 4,
               search_workers: int = 2, embed_workers: int = 1, max_body_bytes: int = 1 << 20,
               warm: bool = True, hosts: HostRule | None = None, kv_events: EventsConfig | None = None) -> FastAPI:
    """The server for ``rag``'s index folder, generator and settings (see the module header).

    api_key: required as a bearer token on every route but ``/healthz`` and the page when set (ValueError for a
    key no client can send, see `check_api_key`). model_name: the id listed at ``/v1/models`` and
    named in completions. workers, search_workers, embed_workers: threads for chats, searches and
    embeddings, each with its own index. max_body_bytes: larger request bodies get 413. warm: load
    the models at startup (:func:`warm_up`); False when the caller already did. hosts: the Host
    and Origin values answered (`slimrag.api.hosts`; default: the loopback names only, as when
    bound to 127.0.0.1). kv_events: publish the generator's KV cache changes there (see "KV events"
    in the module header; OSError when its ports are taken, ValueError when the generator keeps no cache).
    """
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
    if api_key:
        check_api_key(api_key)  # here, not at the first request (middleware is built lazily)
    session = serving(rag)  # one index, generator and cache for the three pools
    chats, searches, embeds = (Workers(rag, n, session) for n in (workers, search_workers, embed_workers))
    # one per server (and per folder in the process): embeds what awaits vectors while we answer
    filling = None if rag.index.coverage().complete else backfill.ensure(rag.index)
    metrics = Metrics()
    load = ChatLoad()
    publisher = None
    if kv_events is not None:
        from slimrag.llm.kv.publish import EventPublisher  # pyzmq: only with --kv-events

        publisher = EventPublisher(kv_events)
        if not warm and not rag.llm.subscribe_kv(publisher.put):
            publisher.close()
            raise ValueError("--kv-events publishes the embedded model's KV tree; this generator keeps none")

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if warm:
            await asyncio.to_thread(warm_up, rag)
            if publisher is not None and not await asyncio.to_thread(rag.llm.subscribe_kv, publisher.put):
                raise ValueError("--kv-events publishes the embedded model's KV tree; this generator keeps none")
        yield
        if filling is not None:
            await asyncio.to_thread(filling.stop, 10.0)
        for pool in (chats, searches, embeds):
            await asyncio.to_thread(pool.stop)
        if publisher is not None:
            await asyncio.to_thread(publisher.close)

    app = FastAPI(title="slimrag", summary="RAG over one index, OpenAI-compatible", lifespan=lifespan,
                  docs_url=None, redoc_url=None)  # no CDN script: the contract is at /openapi.json
    app.add_middleware(Gate, api_key=api_key or None, max_body_bytes=max_body_bytes, metrics=metrics)
    app.add_middleware(PageFront, metrics=metrics)  # outside Gate: the page needs no key
    app.add_middleware(HostGuard, rule=hosts or HostRule(), metrics=metrics)  # outermost: before all else
    install_handlers(app)
    served = rag.index  # its embedder's id and width (read when used: a remote one learns its width late)

    def embedder_width(schema: dict[str, Any]) -> None:  # `dimensions` may only be the embedder's
        props = schema["components"]["schemas"]["EmbeddingsRequest"]["properties"]
        props["dimensions"] = {"anyOf": [{"type": "integer", "enum": [served.embedding[1]]}, {"type": "null"}],
                               "default": None, "title": "Dimensions"}

    publish(app, api_key=bool(api_key), patches=[embedder_width])

    @app.post("/v1/chat/completions", responses={**_CHAT_200, **error_responses(400, 413, 500, 502)})
    async def chat_completions(req: ChatRequest, request: Request) -> Response:
        question, history = conversation(req.messages)
        config = generation_config(req, rag.generation)
        plan = None if req.evidence_only else parse_plan(request.headers.get(PLAN_HEADER))

        def pieces(w: Worker) -> Iterator[str | WireAnswer]:  # a router's plan, when its chunks are all here
            hits = planned_hits(w, plan) if plan else None
            if hits:
                metrics.inc("slimrag_planned_chats_total")  # answered without a search of its own
                return planned_pieces(w, hits, question, history, config, req.answer)
            return answer_pieces(w, question, history, req.k, req.source, config, req.evidence_only, req.answer)

        events = chats.stream(pieces)
        load.chats, load.waiting, streamed = load.chats + 1, load.waiting + 1, False
        try:
            # retrieval, prompt and backend errors before the first piece still get their status
            try:
                first = await until_gone(request, anext(events))
            finally:
                load.waiting -= 1
            head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model_name}
            if req.stream:
                include_usage = req.stream_options is not None and req.stream_options.include_usage
                streamed = True  # counted until the response ends
                return load.streamed(sse_chunks(head, first, events, include_usage, metrics), events)
            final = final_answer(await until_gone(request, _last(events, first)))
        except ClientGone:
            await events.aclose()
            return Response(status_code=499)  # nobody reads it; counted as the client leaving
        finally:
            load.chats -= not streamed
        metrics.usage(final.usage)
        # a withheld answer is not sent as the answer: its content is the notice and the passages
        message = {"role": "assistant", "content": final.shown if final.verdict == "not_backed" else final.text}
        return JSONResponse({**head, "object": "chat.completion",
                             "choices": [{"index": 0, "message": message, "logprobs": None,
                                          "finish_reason": final.finish_reason}],
                             "usage": usage_json(final.usage), "slimrag": extension(final)})

    @app.post("/v1/embeddings", response_model=dict[str, Any], responses=error_responses(400, 413, 500, 502))
    async def embeddings(req: EmbeddingsRequest, request: Request) -> Any:
        texts = [req.input] if isinstance(req.input, str) else req.input
        embedder_id, dim = served.embedding
        if req.dimensions is not None and req.dimensions != dim:
            raise APIError(400, f"{embedder_id} gives {dim} dimensions, not {req.dimensions}",
                           param="dimensions", code="invalid_value")

        def embed(w: Worker) -> tuple[np.ndarray, int]:
            parts = []
            for part in w.index.embed_batches(texts):  # a batch at a time: an abandoned request stops here
                parts.append(part)
                if w.stop.is_set():
                    raise Abandoned
            return np.concatenate(parts), sum(w.index.count_tokens(t) for t in texts)

        try:
            vectors, tokens = await until_gone(request, embeds.run(embed))
        except ClientGone:
            return Response(status_code=499)  # nobody reads it; counted as the client leaving
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode()
                 if req.encoding_format == "base64" else v.tolist()} for i, v in enumerate(vectors)]
        return {"object": "list", "data": data, "model": embedder_id,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    @app.post("/v1/search", response_model=dict[str, Any], responses=error_responses(400, 413, 500, 502))
    async def search(req: SearchRequest, request: Request) -> Any:
        def run(w: Worker) -> tuple[list[Any], Any]:
            found = w.index.search(req.query, k=req.k, mode=req.mode or rag.mode, source=req.source)
            return found, w.index.last_coverage

        try:
            hits, coverage = await until_gone(request, searches.run(run))
        except ClientGone:
            return Response(status_code=499)
        out: dict[str, Any] = {"object": "list", "data": [hit_json(h) for h in hits]}
        if coverage is not None and not coverage.complete:  # vectors still filling in: say what they covered
            out["coverage"] = coverage.to_dict()
        return out

    add_browse_routes(app, searches, rag.mode)

    @app.get("/v1/models", responses=error_responses(500))
    async def models() -> dict[str, Any]:
        created = int(time.time())
        ids = [model_name, served.embedding[0]]
        data = [{"id": i, "object": "model", "created": created, "owned_by": "slimrag"} for i in ids]
        return {"object": "list", "data": data}

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        busy = {"chats": load.chats, "waiting": load.waiting}
        if publisher is None:
            return {"status": "ok", "model": model_name, "load": busy}
        return {"status": "ok", "model": model_name, "load": busy, "kv_events": {
            "endpoint": publisher.endpoint, "replay": publisher.replay_endpoint, "topic": publisher.topic,
            "reuse": kv_events.reuse}}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics_text() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
