"""The web page (``GET /``): its static files, served without the API key by both HTTP programs.

The files (``static/index.html``, ``app.js``, ``markdown.js``, ``style.css``, ``favicon.svg``)
ship in the package: no build step, no CDN, no framework, so the page works offline and is read as
written. ``markdown.js`` is slimrag's own small Markdown renderer for answers: it builds DOM nodes
and sets text with text nodes only, so raw HTML in an answer shows as text (see its header). The
icon is served at ``/favicon.ico`` too, where browsers look for it unasked. It talks only to its own
origin: ``POST /v1/chat/completions`` (streamed), ``POST /v1/search``, ``GET /v1/status`` and
``GET /v1/passages/{chunk_id}``. ``slimrag serve`` answers those itself (`slimrag.serve.web`);
``slimrag route`` forwards them to a replica, so the page works the same behind the router.

Why a front in front of `Gate`
    The page must load to ask for the key, so its files are served without it, while every API
    route keeps needing it. `PageFront` is raw ASGI placed outside `Gate`: it answers ``GET`` and
    ``HEAD`` of exactly the paths in `PAGE_FILES` from bytes read once at start-up, and hands every
    other request, unchanged, to `Gate` and the routes behind it. Matching is by equality on the
    decoded path, as `Gate` does, so no request path ever reaches the file system (``/static/../x``
    is just an unknown path, gated and 404). The page's responses carry a strict
    Content-Security-Policy (scripts, styles and requests to this origin only, no inline script,
    no framing), ``nosniff`` and no referrer; they are counted in ``/metrics`` like every request.
"""

from __future__ import annotations

from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from slimrag.api.metrics import Metrics, endpoint_of

STATIC = Path(__file__).with_name("static")

#: URL path → (file in `STATIC`, content type): the only files the page serves.
PAGE_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/markdown.js": ("markdown.js", "text/javascript; charset=utf-8"),
    "/static/style.css": ("style.css", "text/css; charset=utf-8"),
    "/static/favicon.svg": ("favicon.svg", "image/svg+xml"),
    "/favicon.ico": ("favicon.svg", "image/svg+xml"),
}

#: Headers of every page file: this origin only, nothing inline, never framed, no referrer.
PAGE_HEADERS = (
    (b"content-security-policy", b"default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                                 b"img-src 'self' data:; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-cache"),
)

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
