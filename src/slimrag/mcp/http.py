"""``slimrag mcp --http``: the tools over streamable HTTP, behind a key, a Host rule and bounds.

Layers of the app `http_app` builds, outermost first; each refuses before the next one runs:

1. `slimrag.api.hosts.HostGuard`: the Host and Origin rule of ``slimrag serve`` (421 for a
   foreign Host, 403 for a foreign Origin; DNS rebinding). It replaces the SDK's own check, which
   accepts loopback origins on any port.
2. `BearerKey` (when the server has a key): every request without ``Authorization: Bearer KEY``
   gets 401 with ``WWW-Authenticate: Bearer`` and a JSON-RPC error body, before any body is read
   and before the SDK sees it, so an unauthenticated client can neither open a session nor make
   the server buffer a body. The key is checked at start-up (`slimrag.api.gate.check_api_key`:
   no empty key, no white space at either end, no control characters) and compared in constant
   time (`slimrag.api.gate.bearer_matches`, as ``slimrag serve`` compares its key).
3. The SDK's session manager, with `HttpLimits` instead of its defaults (made for a public
   multi-tenant server: 4 MiB bodies, 10,000 sessions kept 30 minutes).

Who may connect
    On loopback without a key, any program run by *any user of this machine* can connect to the
    port (TCP has no owner check); the Host/Origin rule keeps web pages out, not local users. The
    CLI refuses to bind beyond loopback without a key (`needs_key`), and a key closes the port to
    local users too.

`HttpLimits`, each a knob of ``slimrag mcp`` (defaults fit one person's agents on one machine):

- ``max_body_bytes`` = 1 MiB (``MAX_BODY_BYTES``): a tool call is a query or a list of paths,
  a few KB. A larger declared ``Content-Length`` is refused with 413 before any of the body is
  read; a chunked body is counted as it arrives and refused once it passes the limit, so at most
  the limit is ever held (the SDK's `RequestBodyLimitMiddleware`). Raise it only for very long
  ``add_paths`` lists.
- ``max_sessions`` = 32 (``--max-sessions``): open MCP sessions at once. A request that would open
  one more gets 503 ("Too many open sessions") while the existing ones go on; room frees up as
  sessions end (DELETE) or expire. Each session holds a task and a few small buffers; the index
  is shared, so the cap bounds memory, not search speed. An agent opens one per connection.
- ``session_idle_s`` = 300 (``--session-idle``): a session with no request in flight and no open
  event stream for this long is closed; its id then answers 404 and the client initializes
  again (the SDK client does so on its own). Lower frees abandoned sessions sooner; higher
  spares a client that pauses long between calls a new handshake.
"""

from __future__ import annotations

import ipaddress
import json
import math
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from slimrag.api.gate import bearer_matches, check_api_key
from slimrag.api.hosts import HostGuard, HostRule

#: The largest request body, in bytes (see the module header).
MAX_BODY_BYTES = 1 << 20
#: The most MCP sessions open at once.
MAX_SESSIONS = 32
#: Seconds a session may sit idle before it is closed.
SESSION_IDLE_S = 300.0
#: The environment variable ``slimrag mcp --http`` reads its key from when ``--key`` is not given.
KEY_ENV = "SLIMRAG_MCP_KEY"


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """Bounds of the HTTP transport (see the module header for each one's trade-off)."""

    max_body_bytes: int = MAX_BODY_BYTES
    max_sessions: int = MAX_SESSIONS
    session_idle_s: float = SESSION_IDLE_S

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be at least 1024 (an initialize request is ~300 bytes), "
                             f"got {self.max_body_bytes}")
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1, got {self.max_sessions}")
        if not (math.isfinite(self.session_idle_s) and self.session_idle_s > 0):
            raise ValueError(f"session_idle_s must be a positive number of seconds, got {self.session_idle_s}")


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` listens on this machine only (a host name other than localhost
    may resolve beyond it, so it is not; a wildcard bind is not)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def needs_key(host: str, key: str | None) -> str | None:
    """Why the server must not start (bound beyond loopback without a key), None when it may."""
    if key is None and not is_loopback(host):
        return (f"refusing to serve MCP on {host} without a key: anyone who can reach the port could read the "
                f"index and add files to it. Give --key KEY (or set {KEY_ENV}) and send 'Authorization: "
                "Bearer KEY' from the client, or bind 127.0.0.1")
    return None


class BearerKey:
    """ASGI middleware: answers 401 to every HTTP request that does not carry ``Authorization:
    Bearer KEY`` (scheme in any case, key compared in constant time), before the app sees it.
    ``key``: ValueError, saying why, for one no client could send."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app, self.key = app, check_api_key(key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k.lower() == b"authorization"), b"")
        if bearer_matches(given, self.key):
            await self.app(scope, receive, send)
            return
        what = "wrong" if given else "missing"
        body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {
            "code": -32001, "message": f"key {what}: send 'Authorization: Bearer KEY' with the key the MCP server "
                                       "was started with (--key or " + KEY_ENV + ")"}}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})


def http_app(server: Any, hosts: HostRule | None = None, key: str | None = None,
             limits: HttpLimits | None = None) -> Any:
    """The streamable-HTTP app of ``server`` (an `MCPServer`; ``/mcp``) behind the layers of the
    module header: slimrag's Host and Origin rule (default: the loopback names), the key when one
    is given, and ``limits`` (default `HttpLimits()`)."""
    from mcp.server.transport_security import TransportSecuritySettings

    limits = limits or HttpLimits()
    app: Any = server.streamable_http_app(
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        max_request_body_size=limits.max_body_bytes, max_sessions=limits.max_sessions,
        session_idle_timeout=limits.session_idle_s)
    if key is not None:
        app = BearerKey(app, key)
    return HostGuard(app, rule=hosts or HostRule())
