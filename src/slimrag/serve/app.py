"""The HTTP server (``slimrag serve``): one index and its generator behind OpenAI-compatible routes.

This module builds the app (`create_app`) and holds the routes; the parts live beside it:
`schemas` (request bodies, response JSON), `chat` (RAG as chat completions, streaming),
`workers` (the threads, each with its own `Index`, that do the blocking work), `gate` (API key,
body size limit, request counting), `errors` (OpenAI's error shape and statuses) and `metrics`.

Endpoints
    ``POST /v1/chat/completions``: RAG over the served index (see `slimrag.serve.chat`).
    Extensions: ``k`` (passages, default 4) and ``source`` (a glob on source paths); the passages
    used come back in the ``slimrag`` field. ``n`` must be 1. ``model`` may be anything: the
    served model answers, under `create_app`'s ``model_name``.
    ``POST /v1/embeddings``: the index's embedder; ``input`` is a string or up to
    `MAX_EMBED_INPUTS` strings (truncated to the embedder's window, as sentence-transformers does);
    ``encoding_format`` ``float`` or ``base64`` (little-endian float32, as OpenAI sends it).
    ``POST /v1/search``: ``{query, k=5, source?, mode?}`` → hits with chunk id, source, score, text.
    ``GET /v1/models``, ``GET /healthz``, ``GET /metrics`` (Prometheus text format, see
    `slimrag.api.metrics`).

Errors
    Every error, FastAPI's own included (422 validation errors become 400, unknown routes 404), is
    answered in OpenAI's shape; see `slimrag.api.errors` for the statuses.
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from slimrag.api.errors import APIError, install_handlers
from slimrag.api.gate import Gate
from slimrag.api.metrics import Metrics
from slimrag.api.schemas import (
    MAX_EMBED_INPUTS,
    ChatRequest,
    EmbeddingsRequest,
    SearchRequest,
    hit_json,
    usage_json,
)
from slimrag.rag.pipeline import RAG
from slimrag.serve.chat import answer_pieces, conversation, extension, generation_config, sse_chunks
from slimrag.serve.workers import Worker, Workers
from slimrag.types import Answer


def warm_up(rag: RAG) -> None:
    """Load the generator's model and the embedder now, so the first request does not wait."""
    rag.llm.load()
    rag.index.embedder.embed_batch(["warm up"])


def create_app(rag: RAG, *, api_key: str | None = None, model_name: str = "slimrag", workers: int = 4,
               max_body_bytes: int = 1 << 20, warm: bool = True) -> FastAPI:
    """The server for ``rag``'s index folder, generator and settings (see the module header).

    api_key: required as a bearer token on ``/v1/`` routes when set. model_name: the id listed at
    ``/v1/models`` and named in completions. workers: threads doing blocking work, each with its
    own index. max_body_bytes: larger request bodies get 413. warm: load the models at startup
    (:func:`warm_up`); False when the caller already did.
    """
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
    pool = Workers(rag, workers)
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if warm:
            await asyncio.to_thread(warm_up, rag)
        yield
        await asyncio.to_thread(pool.stop)

    app = FastAPI(title="slimrag", summary="RAG over one index, OpenAI-compatible", lifespan=lifespan)
    app.add_middleware(Gate, api_key=api_key or None, max_body_bytes=max_body_bytes, metrics=metrics)

    install_handlers(app)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest) -> Response:
        if req.n != 1:
            raise APIError(400, "only n=1 is supported: ask again for another answer", param="n",
                           code="invalid_value")
        question, history = conversation(req.messages)
        config = generation_config(req, rag.generation)
        events = pool.stream(lambda w: answer_pieces(w, question, history, req.k, req.source, config))
        first = await anext(events)  # retrieval, prompt and backend errors still get their status
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model_name}
        if req.stream:
            include_usage = req.stream_options is not None and req.stream_options.include_usage
            return StreamingResponse(sse_chunks(head, first, events, include_usage, metrics),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        final = first
        async for item in events:
            final = item
        assert isinstance(final, Answer)
        metrics.usage(final.usage)
        message = {"role": "assistant", "content": final.text}
        return JSONResponse({**head, "object": "chat.completion",
                             "choices": [{"index": 0, "message": message, "logprobs": None,
                                          "finish_reason": final.finish_reason}],
                             "usage": usage_json(final.usage), "slimrag": extension(final)})

    @app.post("/v1/embeddings")
    async def embeddings(req: EmbeddingsRequest) -> dict[str, Any]:
        texts = [req.input] if isinstance(req.input, str) else req.input
        if not texts or not all(t.strip() for t in texts):
            raise APIError(400, "'input' must be a non-empty string or a non-empty list of non-empty strings",
                           param="input", code="invalid_value")
        if len(texts) > MAX_EMBED_INPUTS:
            raise APIError(400, f"'input' has {len(texts)} strings; send at most {MAX_EMBED_INPUTS} per "
                                "request", param="input", code="invalid_value")
        embedder = rag.index.embedder
        if req.dimensions is not None and req.dimensions != embedder.dim:
            raise APIError(400, f"{embedder.model_id} gives {embedder.dim} dimensions, not {req.dimensions}",
                           param="dimensions", code="invalid_value")

        def embed(w: Worker) -> tuple[np.ndarray, int]:
            vecs = w.index.embedder.embed(texts, batch_size=w.index.config.embed_batch, progress=False)
            return vecs, sum(w.index.chunker.count(t) for t in texts)

        vectors, tokens = await pool.run(embed)
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode()
                 if req.encoding_format == "base64" else v.tolist()} for i, v in enumerate(vectors)]
        return {"object": "list", "data": data, "model": embedder.model_id,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    @app.post("/v1/search")
    async def search(req: SearchRequest) -> dict[str, Any]:
        if not req.query.strip():
            raise APIError(400, "'query' must be non-empty text", param="query", code="invalid_value")
        hits = await pool.run(lambda w: w.index.search(req.query, k=req.k, mode=req.mode or rag.mode,
                                                       source=req.source))
        return {"object": "list", "data": [hit_json(h) for h in hits]}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        created = int(time.time())
        ids = [model_name, rag.index.embedder.model_id]
        data = [{"id": i, "object": "model", "created": created, "owned_by": "slimrag"} for i in ids]
        return {"object": "list", "data": data}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "model": model_name}

    @app.get("/metrics")
    async def metrics_text() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
