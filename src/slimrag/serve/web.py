"""The two read-only routes that ``slimrag serve`` adds for the web page (`slimrag.api.page`).

Routes
    ``GET /v1/status``: `Index.status` (documents, chunks, bytes on disk, last update, storage,
    embedder) plus the server's default search mode. ``GET /v1/passages/{chunk_id}?around=1``:
    `Index.passage`: the chunk, its document, its page (PDFs) and up to ``around`` (0..20)
    neighbouring chunks on each side; 404 for an id that is not in the index (never added or
    removed). Both run on the search workers, each with its own `Index` (SQLite is per thread).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI
from fastapi import Path as PathParam
from fastapi import Query as QueryParam
from pydantic import BaseModel

from slimrag.api.errors import APIError
from slimrag.api.openapi import error_responses
from slimrag.api.schemas import ErrorBody
from slimrag.errors import NotFoundError
from slimrag.index.browse import MAX_AROUND
from slimrag.rag.wire import excerpt_json
from slimrag.serve.workers import Worker, Workers
from slimrag.types import Excerpt

#: 404 as the passage route publishes it.
_NOT_FOUND = {404: {"model": ErrorBody, "description": "No chunk has this id (never added, or removed since)."}}


class StatusOut(BaseModel):
    """``GET /v1/status``: the served index at a glance (see `Index.status`)."""

    path: str
    documents: int
    chunks: int
    bytes: int
    updated: float
    storage: str
    gen_kind: str
    embedder: str
    search_mode: str


class ChunkOut(BaseModel):
    """One chunk of a passage: its id, label (``source#ordinal``), place in the document, page (PDFs)
    and text."""

    chunk_id: int
    label: str
    ordinal: int
    page: int | None
    text: str


class PassageOut(BaseModel):
    """``GET /v1/passages/{chunk_id}``: a chunk in its document, with its neighbours
    (`slimrag.rag.wire.excerpt_json`); ``label`` is how answers cite the chunk."""

    chunk_id: int
    source: str
    doc_id: str
    ordinal: int
    label: str
    page: int | None
    text: str
    metadata: dict[str, Any]
    before: list[ChunkOut]
    after: list[ChunkOut]


def add_browse_routes(app: FastAPI, searches: Workers, search_mode: str) -> None:
    """Add ``GET /v1/status`` and ``GET /v1/passages/{chunk_id}`` (run on ``searches``)."""

    @app.get("/v1/status", response_model=StatusOut, responses=error_responses(500))
    async def status() -> dict[str, Any]:
        st = await searches.run(lambda w: w.index.status())
        return {**st, "search_mode": search_mode}

    @app.get("/v1/passages/{chunk_id}", response_model=PassageOut,
             responses={**error_responses(400, 500), **_NOT_FOUND})
    async def passage(chunk_id: Annotated[int, PathParam(ge=0, le=2**63 - 1, description="a hit's chunk_id")],
                      around: Annotated[int, QueryParam(ge=0, le=MAX_AROUND,
                                                        description="neighbouring chunks on each side")] = 1,
                      ) -> dict[str, Any]:
        def look(w: Worker) -> Excerpt:
            return w.index.passage(chunk_id, around)

        try:
            return excerpt_json(await searches.run(look))
        except NotFoundError as e:
            raise APIError(404, str(e), param="chunk_id", code="not_found") from None
