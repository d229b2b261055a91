"""`Gate`: the ASGI middleware in front of every route (counting, API key, body size, last-resort errors).

It is raw ASGI rather than a FastAPI dependency so that it sees every request, unknown routes and
refused ones included, and can refuse a body before any of it reaches pydantic.

Security
    ``slimrag serve`` binds 127.0.0.1 unless told otherwise (the CLI warns when it binds beyond
    loopback without a key). With an API key, every request but ``GET /healthz`` needs
    ``Authorization: Bearer KEY``: the ``/v1/`` routes, ``/metrics``, ``/openapi.json``, and
    any unknown path, ``/docs`` among them (it is off, see below): 401 with ``WWW-Authenticate:
    Bearer`` otherwise, before a 404. The test is on the path the router matches (``scope["path"]``, percent-decoded), by
    exact equality with the one open path, so ``//v1/search``, ``/v1/%73earch``, ``/V1/search``
    or ``/healthz/../v1/search`` cannot slip past it. The scheme is matched without regard to
    case (RFC 9110: ``bearer KEY`` works); the key is compared as bytes in constant time
    (`hmac.compare_digest`) with its UTF-8 encoding, so a non-ASCII key works from clients that
    send UTF-8 header bytes (curl does; clients that only send ASCII need an ASCII key).
    `check_api_key` refuses at start-up a key no client could send (empty, control characters,
    white space at either end, which HTTP strips). JSON bodies must say ``Content-Type:
    application/json`` (FastAPI hands a body of another type over as bytes, which
    `validation_error` refuses with 400), so a web page cannot post to the local server without a
    CORS preflight, which is never granted.

Body size
    ``max_body_bytes`` (default 1 MiB, set by `create_app`): a larger declared Content-Length is
    refused with 413 before reading; a chunked body is read up to the limit and refused once it
    passes it. An accepted body is read whole here and replayed to the route.

Content-Security-Policy
    Any HTML answered through the gate without a policy of its own gets `HTML_CSP` (this origin
    only). The servers serve no HTML of their own behind it: ``/docs`` and ``/redoc`` (Swagger UI
    and ReDoc, which FastAPI loads from a CDN) are off, and the contract stays at
    ``/openapi.json``; the web page has its own, stricter policy (`slimrag.api.page`).

Counting
    Every HTTP request adds one to ``slimrag_requests_total`` by endpoint and status, and a status
    of 400 or more to ``slimrag_errors_total``; a client that leaves before any answer counts as
    499 (nginx's "client closed request"). An exception that escapes a route before the response
    starts is answered in OpenAI's shape via `api_error`.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Sequence
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from slimrag.api.errors import APIError, api_error
from slimrag.api.metrics import Metrics, endpoint_of
from slimrag.api.openapi import OPEN_PATHS


async def _send_json(send: Send, status: int, body: dict[str, Any],
                     headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    payload = json.dumps(body).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": payload})


#: The policy of any HTML a route answers without one of its own (the page sets its own, see
#: `slimrag.api.page`): nothing from other origins, nothing inline, never framed.
HTML_CSP = b"default-src 'self'; script-src 'self'; style-src 'self'; object-src 'none'; base-uri 'none'; " \
           b"frame-ancestors 'none'"


def with_csp(start: Message) -> Message:
    """``start`` (an ``http.response.start``) with `HTML_CSP` added when it answers HTML without a policy."""
    headers = list(start.get("headers", []))
    names = {k.lower() for k, _ in headers}
    ctype = next((v for k, v in headers if k.lower() == b"content-type"), b"")
    if not ctype.lower().startswith(b"text/html") or b"content-security-policy" in names:
        return start
    return {**start, "headers": [*headers, (b"content-security-policy", HTML_CSP)]}


def check_api_key(key: str) -> bytes:
    """``key`` as the bytes a client sends (UTF-8); ValueError, saying why, for a key no HTTP
    client can send: empty, holding control characters, or with white space at either end."""
    if not key:
        raise ValueError("the API key is empty; give a key or none")
    if key != key.strip():
        raise ValueError("the API key starts or ends with white space, which HTTP strips from headers; remove it")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in key):
        raise ValueError("the API key holds a control character, which HTTP headers cannot carry; choose another")
    try:
        return key.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the API key holds a lone UTF-16 surrogate; choose another") from None


def bearer_matches(header: bytes, key: bytes) -> bool:
    """Whether an ``Authorization`` header value carries ``key`` with the Bearer scheme (scheme in
    any case, spaces around the token ignored); the key is compared in constant time."""
    scheme, _, token = header.strip().partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(b" \t"), key)


class Gate:
    """ASGI middleware: counts every request for ``/metrics``, checks the API key on every path but
    ``/healthz``, refuses a body over ``max_body_bytes`` with 413 (by its Content-Length, or while
    reading a chunked one), and answers any exception that escapes a route in the error shape."""

    def __init__(self, app: ASGIApp, *, api_key: str | None, max_body_bytes: int, metrics: Metrics) -> None:
        self.app, self.max_body_bytes, self.metrics = app, max_body_bytes, metrics
        self.api_key = None if api_key is None else check_api_key(api_key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 0

        async def counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = with_csp(message)
            await send(message)

        try:
            await self._guarded(scope, receive, counted)
        except Exception as exc:
            if status:  # the response has started: nothing else can be sent
                raise
            err = api_error(exc)
            await _send_json(counted, err.status, err.body())
        finally:
            endpoint = endpoint_of(scope["path"])
            # 499 (nginx's "client closed request"): the client left before any answer was sent
            self.metrics.inc("slimrag_requests_total", endpoint=endpoint, status=str(status or 499))
            if status >= 400:
                self.metrics.inc("slimrag_errors_total", endpoint=endpoint, status=str(status))

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.api_key is not None and not (scope["path"] in OPEN_PATHS and scope["method"] in ("GET", "HEAD")):
            given = next((v for k, v in scope["headers"] if k.lower() == b"authorization"), b"")
            if not bearer_matches(given, self.api_key):
                what = "wrong" if given else "missing"
                err = APIError(401, f"API key {what}: send 'Authorization: Bearer KEY' with the server's key",
                               code="invalid_api_key")
                await _send_json(send, 401, err.body(), [(b"www-authenticate", b"Bearer")])
                return
        if scope["method"] in ("POST", "PUT", "PATCH"):
            receive = await self._read_body(headers, receive, send)
            if receive is None:
                return
        await self.app(scope, receive, send)

    async def _read_body(self, headers: dict[str, str], receive: Receive, send: Send) -> Receive | None:
        """Read the whole body (at most ``max_body_bytes``) and return a ``receive`` replaying it;
        None when the request was refused or the client left."""
        too_large = APIError(413, f"the request body is larger than {self.max_body_bytes:,} bytes; send "
                                  "fewer or shorter texts", code="request_too_large")
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await _send_json(send, 413, too_large.body())
            return None
        parts, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            parts.append(message.get("body", b""))
            size += len(parts[-1])
            if size > self.max_body_bytes:
                await _send_json(send, 413, too_large.body())
                return None
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(parts), False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # later calls wait for the client's disconnect
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        return replay
