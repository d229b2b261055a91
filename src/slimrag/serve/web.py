"""The web page of ``slimrag serve`` (``GET /``) and the two read-only routes it adds to the API.

The page
    Three static files shipped in the package (``static/index.html``, ``app.js``, ``style.css``):
    no build step, no CDN, no framework, so it works offline and is read as written. It talks
    only to this server's own routes: ``POST /v1/chat/completions`` with ``stream: true`` (the
    answer streams; the last event's ``slimrag`` field lists the sources), ``POST /v1/search``,
    and the two routes below. With an API key, the page gets 401 from those routes, asks for the
    key once and keeps it in the tab's ``sessionStorage``.

Why a front in front of `Gate`
    The page must load to ask for the key, so its files are served without it, while every API
    route keeps needing it. `PageFront` is raw ASGI placed outside `Gate`: it answers ``GET`` and
    ``HEAD`` of exactly the paths in `PAGE_FILES` (``/``, ``/static/app.js``, ``/static/style.css``)
    from bytes read once at start-up, and hands every other request, unchanged, to `Gate` and the
    routes behind it. Matching is by equality on the decoded path, as `Gate` does, so no request
    path ever reaches the file system (``/static/../x`` is just an unknown path, gated and 404).
    The page's responses carry a strict Content-Security-Policy (scripts, styles and requests to
    this origin only, no inline script, no framing), ``nosniff`` and no referrer; they are counted
    in ``/metrics`` like every request.

Routes
    ``GET /v1/status``: `Index.status` (documents, chunks, bytes on disk, last update, storage,
    embedder) plus the server's default search mode. ``GET /v1/passages/{chunk_id}?around=1``:
    `Index.passage`: the chunk, its document, its page (PDFs) and up to ``around`` (0..20)
    neighbouring chunks on each side; 404 for an id that is not in the index (never added or
    removed). Both run on the search workers, each with its own `Index` (SQLite is per thread).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI
from fastapi import Path as PathParam
from fastapi import Query as QueryParam
from pydantic import BaseModel
from starlette.types import ASGIApp, Receive, Scope, Send

from slimrag.api.errors import APIError
from slimrag.api.metrics import Metrics, endpoint_of
from slimrag.api.openapi import error_responses
from slimrag.api.schemas import ErrorBody
from slimrag.errors import NotFoundError
from slimrag.index.browse import MAX_AROUND
from slimrag.serve.workers import Worker, Workers
from slimrag.types import Excerpt

STATIC = Path(__file__).with_name("static")

#: URL path → (file in `STATIC`, content type): the only files the page serves.
PAGE_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/style.css": ("style.css", "text/css; charset=utf-8"),
}

#: Headers of every page file: this origin only, nothing inline, never framed, no referrer.
PAGE_HEADERS = (
    (b"content-security-policy", b"default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                                 b"img-src 'self' data:; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-cache"),
)

#: 404 as the passage route publishes it.
_NOT_FOUND = {404: {"model": ErrorBody, "description": "No chunk has this id (never added, or removed since)."}}


class PageFront:
    """ASGI middleware outside `Gate`: serves `PAGE_FILES` to ``GET``/``HEAD`` without the API
    key, passes everything else on (see the module header). The files are read once, here."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics, static: Path = STATIC) -> None:
        self.app, self.metrics = app, metrics
        self.files = {path: ((static / name).read_bytes(), ctype.encode()) for path, (name, ctype) in PAGE_FILES.items()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        page = self.files.get(scope["path"]) if scope["type"] == "http" else None
        if page is None or scope["method"] not in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        body, ctype = page
        headers = [(b"content-type", ctype), (b"content-length", str(len(body)).encode()), *PAGE_HEADERS]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})
        self.metrics.inc("slimrag_requests_total", endpoint=endpoint_of(scope["path"]), status="200")


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
    """One chunk of a passage: its id, place in the document, page (PDFs) and text."""

    chunk_id: int
    ordinal: int
    page: int | None
    text: str


class PassageOut(BaseModel):
    """``GET /v1/passages/{chunk_id}``: a chunk in its document, with its neighbours."""

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


def passage_json(ex: Excerpt) -> dict[str, Any]:
    """`Excerpt` as `PassageOut`; ``label`` is how answers cite the chunk (``source#ordinal``)."""
    c = ex.chunk
    around = {side: [{"chunk_id": n.chunk_id, "ordinal": n.ordinal, "page": n.page, "text": n.text}
                     for n in chunks] for side, chunks in (("before", ex.before), ("after", ex.after))}
    return {"chunk_id": c.chunk_id, "source": c.source, "doc_id": c.doc_id, "ordinal": c.ordinal,
            "label": f"{c.source}#{c.ordinal}", "page": ex.page, "text": c.text, "metadata": c.metadata, **around}


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
            return passage_json(await searches.run(look))
        except NotFoundError as e:
            raise APIError(404, str(e), param="chunk_id", code="not_found") from None
