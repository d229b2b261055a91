"""`HostGuard`: the Host and Origin rule that keeps a server on this machine out of web pages' reach.

The attack it stops (DNS rebinding)
    A web page on ``evil.example`` makes its name resolve to 127.0.0.1 after the page has loaded.
    To the browser, the local server is then the page's own origin, so the page may read every
    answer, and with no API key (the default) it can read the whole index. The one thing the page
    cannot forge is the name it used: its requests carry ``Host: evil.example:PORT``. So the rule
    is on the Host header, and every request is checked, whatever its path (the page's files,
    ``/healthz`` and unknown paths included), before anything else runs.

The rule (one for ``slimrag serve``, ``slimrag route`` and ``slimrag mcp --http``)
    Host
        Accepted when it names this server on the port the request came in on
        (``scope["server"]``, so ``--port 0`` needs nothing more): ``127.0.0.1``, ``localhost``,
        ``[::1]``, or the address it was told to bind (``--host``). A Host without a port means 80.
        A wildcard bind (``0.0.0.0``, ``::``) also accepts any IP address as Host: a rebinding
        attack needs a DNS name, and an IP address names the machine it reaches. Other names,
        such as a reverse proxy's public name or a LAN host name, must be allowed with
        ``--allow-host NAME`` (any port) or ``--allow-host NAME:PORT`` (that port only).
        ``--allow-host '*'`` turns the check off. Any other Host: 421 Misdirected Request.
    Origin
        Browsers send it on cross-origin requests and on every POST. A request without one (the
        ``openai`` client, curl, a router forwarding) is not checked. One with an Origin is
        accepted when that origin is the server's own: the same name and port as the request's
        Host, or a name the Host rule accepts on its port (so a page opened at ``localhost`` may
        call ``127.0.0.1``; with a wildcard bind, another IP address is not one), with scheme
        http or https. Others must be allowed with
        ``--allow-origin ORIGIN`` (exactly ``scheme://name[:port]``; ``null`` for sandboxed pages
        and files; ``*`` for any). Any other Origin: 403. This is defence in depth: the server
        never sends CORS headers, so browsers already keep cross-origin pages from reading
        answers; the check also stops them from sending requests with effects (a chat costs
        minutes of compute).

Why not the MCP SDK's own check: it accepts the loopback names and origins on any port (a page
served by another local program could call the MCP server), and a second rule with other flags
would drift; ``slimrag mcp --http`` turns the SDK's off and uses this one.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from slimrag.api.errors import APIError
from slimrag.api.metrics import Metrics, endpoint_of

#: Names that always mean this machine's loopback interface (browsers resolve ``localhost``
#: themselves, RFC 6761), accepted on the server's port whatever it binds.
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
#: Bind addresses that listen on every interface.
WILDCARD_BINDS = ("0.0.0.0", "::", "[::]", "")
#: The port a scheme implies when a Host or Origin gives none.
DEFAULT_PORTS = {"http": 80, "https": 443}


def _ip(name: str) -> str | None:
    """``name`` in its canonical IP form (IPv6 in brackets, compressed), None when it is no IP."""
    try:
        addr = ipaddress.ip_address(name[1:-1] if name.startswith("[") and name.endswith("]") else name)
    except ValueError:
        return None
    return str(addr) if addr.version == 4 else f"[{addr.compressed}]"


def _name(name: str) -> str:
    """A host name as compared: lower case; an IP address in its canonical form."""
    name = name.lower()
    return _ip(name) or name


def split_authority(authority: str) -> tuple[str, int | None]:
    """``name[:port]`` (or ``[v6][:port]``) as (canonical name, port or None); ValueError when it
    does not parse (an empty name, a port that is not a number, an IPv6 address without brackets)."""
    authority = authority.strip()
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise ValueError(f"{authority!r}: an IPv6 address needs its closing ']'")
        name, rest = authority[:end + 1], authority[end + 1:]
        if rest and not rest.startswith(":"):
            raise ValueError(f"{authority!r}: only ':PORT' may follow ']'")
        port = rest[1:] if rest else None
        if _ip(name) is None:
            raise ValueError(f"{authority!r}: not an IPv6 address in brackets")
    else:
        if authority.count(":") > 1:
            raise ValueError(f"{authority!r}: write an IPv6 address in brackets, e.g. [::1]")
        name, _, port = authority.partition(":")
        port = port if ":" in authority else None
    if not name:
        raise ValueError(f"{authority!r}: no host name")
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"{authority!r}: the port must be a number from 1 to 65535")
    return _name(name), int(port) if port is not None else None


def split_origin(origin: str) -> tuple[str, str, int]:
    """An Origin value ``scheme://name[:port]`` as (scheme, canonical name, port, the scheme's
    default when none is given); ValueError when it is not one (paths and user info included)."""
    parts = urlsplit(origin.strip())
    if parts.scheme not in DEFAULT_PORTS or not parts.netloc or "@" in parts.netloc or parts.path not in ("", "/") \
            or parts.query or parts.fragment:
        raise ValueError(f"{origin!r} is not an origin: write scheme://name[:port], e.g. https://rag.example.com")
    name, port = split_authority(parts.netloc)
    return parts.scheme, name, DEFAULT_PORTS[parts.scheme] if port is None else port


@dataclass(frozen=True, slots=True)
class HostRule:
    """Which Host and Origin values a server accepts (see the module header).

    bind: the address the server listens on (``--host``), default 127.0.0.1. allow_hosts:
    ``NAME`` (any port) or ``NAME:PORT`` values accepted besides the bound ones; ``*``: any Host.
    allow_origins: exact origins accepted besides the server's own; ``null`` and ``*`` as the
    module header says. ValueError, naming the value, for one that does not parse.
    """

    bind: str = "127.0.0.1"
    allow_hosts: tuple[str, ...] = ()
    allow_origins: tuple[str, ...] = ()
    _hosts: tuple[tuple[str, int | None], ...] = field(init=False, repr=False, compare=False)
    _origins: frozenset[tuple[str, str, int]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        hosts = [split_authority(h) for h in self.allow_hosts if h.strip() != "*"]
        origins = {split_origin(o) for o in self.allow_origins if o.strip() not in ("*", "null")}
        object.__setattr__(self, "_hosts", tuple(hosts))
        object.__setattr__(self, "_origins", frozenset(origins))

    @property
    def any_host(self) -> bool:
        """Whether the Host check is off (``--allow-host '*'``)."""
        return any(h.strip() == "*" for h in self.allow_hosts)

    def names_server(self, name: str, port: int | None, listening: int | None, any_ip: bool = True) -> bool:
        """Whether ``name`` (canonical) on ``port`` names this server, which listens on
        ``listening`` (None: unknown, any port is taken as its own). any_ip: with a wildcard
        bind, whether any IP address counts (for a Host; an Origin must be the Host itself)."""
        if any(name == n and (p is None or p == port) for n, p in self._hosts):
            return True
        if listening is not None and port != listening:
            return False
        if name in LOOPBACK_NAMES or name == _name(self.bind.strip()):
            return True
        return any_ip and self.bind.strip() in WILDCARD_BINDS and _ip(name) is not None

    def refusal(self, host: str | None, origin: str | None, listening: int | None) -> APIError | None:
        """Why a request with these Host and Origin headers is refused (421 or 403), None when it
        is accepted. ``listening``: the port the request came in on."""
        try:
            hname, hport = split_authority(host or "")
            hport = 80 if hport is None else hport
        except ValueError:
            hname, hport = "", 0
        if not self.any_host and not (hname and self.names_server(hname, hport, listening)):
            return APIError(421, f"the Host header {host!r} does not name this server, which answers only to "
                                 "127.0.0.1, localhost, [::1] or its --host: a web page on another name may be "
                                 "reaching it (DNS rebinding). If the name is yours (a reverse proxy's, the "
                                 "machine's), start the server with --allow-host NAME",
                            code="misdirected_request")
        if origin is None or "*" in self.allow_origins:
            return None
        if origin.strip() == "null":
            ok = "null" in self.allow_origins
        else:
            try:
                scheme, oname, oport = split_origin(origin)
            except ValueError:
                ok = False
            else:
                ok = ((scheme, oname, oport) in self._origins or (oname, oport) == (hname, hport)
                      or self.names_server(oname, oport, listening, any_ip=False))
        if ok:
            return None
        return APIError(403, f"the Origin {origin!r} is not this server's own: web pages from other sites may not "
                             "call it. To let one, start the server with --allow-origin ORIGIN",
                        code="forbidden_origin")


class HostGuard:
    """ASGI middleware, outermost: refuses a request whose Host or Origin breaks ``rule`` (421,
    403, in OpenAI's error shape) before any other part sees it; counts refusals in ``metrics``
    (when given) as `Gate` counts requests."""

    def __init__(self, app: ASGIApp, *, rule: HostRule, metrics: Metrics | None = None) -> None:
        self.app, self.rule, self.metrics = app, rule, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host = origin = None
        for key, value in scope["headers"]:
            key = key.lower()
            if key == b"host" and host is None:
                host = value.decode("latin-1")
            elif key == b"origin" and origin is None:
                origin = value.decode("latin-1")
        server = scope.get("server")
        err = self.rule.refusal(host, origin, server[1] if server and server[1] is not None else None)
        if err is None:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        payload = json.dumps(err.body()).encode()
        await send({"type": "http.response.start", "status": err.status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})
        if self.metrics is not None:
            endpoint = endpoint_of(scope["path"])
            self.metrics.inc("slimrag_requests_total", endpoint=endpoint, status=str(err.status))
            self.metrics.inc("slimrag_errors_total", endpoint=endpoint, status=str(err.status))
