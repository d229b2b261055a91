"""Binding the port first, serving on it later: how the three HTTP programs start.

``slimrag serve`` loads its models (seconds to minutes) before it can answer. Left to uvicorn,
the port is bound only after that, so a busy port was reported late, after the models loaded,
in uvicorn's shutdown log with exit status 3. `bind` takes the socket at once, before any model
loads, and says in one line why it cannot (`PortError`); `run` then serves the app on that very
socket, so nothing can take the port in between, and ``--port 0`` knows its port before start-up.

The socket is bound as uvicorn binds it (``SO_REUSEADDR``, so a restart does not wait for the
previous run's connections in TIME_WAIT; IPv6 for an address with a colon) but not listened on
while the models load (a client is refused at once rather than left waiting); `listen` starts
listening just before the address is printed, so the printed address answers.

Every connection is guarded (`slimrag.api.connections`): a request head must arrive within
``header_timeout_s`` and its body within ``body_timeout_s``, and at most ``max_connections`` are
held, the one idle longest giving way to a new one; `run` takes them as ``limits``.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from typing import Any

from slimrag.api.limits import ConnectionLimits

#: What a bind failure means, by errno, and what to do next.
_WHY = {
    errno.EADDRINUSE: "is in use by another program; stop it or give another --port (0 picks a free one)",
    errno.EADDRNOTAVAIL: "cannot be bound: the address is not one of this machine's; give another --host",
    errno.EACCES: "needs privileges to bind (ports below 1024 do); give a --port of 1024 or more",
}


#: Connections the kernel queues before this process accepts them (uvicorn's default backlog).
KERNEL_BACKLOG = 2048


class PortError(Exception):
    """The port cannot be bound; the message is one line saying why and what to do."""


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` (not yet listening), for `run`; `PortError` when it
    cannot be bound."""
    address = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
    except OSError as exc:
        sock.close()
        why = _WHY.get(exc.errno or 0, f"cannot be bound ({exc.strerror or exc})")
        raise PortError(f"port {port} on {host} {why}") from exc
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def bound_port(sock: socket.socket) -> int:
    """The port ``sock`` is bound to (the one the system chose for port 0)."""
    return int(sock.getsockname()[1])


def listen(sock: socket.socket) -> int:
    """Start listening on ``sock`` now, before uvicorn takes it over, so that the address printed
    next is already reachable (clients wait in the backlog for the moment uvicorn needs to
    start); the port."""
    sock.listen(KERNEL_BACKLOG)
    return bound_port(sock)


def server(app: Any, host: str, port: int, *, limits: ConnectionLimits | None = None,
           log_level: str = "info") -> Any:
    """A uvicorn server for ``app`` whose connections are guarded by ``limits`` (default
    `ConnectionLimits()`: header and body timeouts, a cap on connections, see
    `slimrag.api.connections`); start it with ``.run(sockets=[sock])``. It logs uvicorn's "Uvicorn
    running on http://HOST:PORT" line once it listens, as uvicorn does for a port it binds itself
    (it stays silent for sockets it is given, expecting a process manager's)."""
    import uvicorn

    from slimrag.api.connections import guarded_protocol, quiet_accept_errors

    limits = limits or ConnectionLimits()
    protocol, table = guarded_protocol(limits)

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            quiet_accept_errors(asyncio.get_running_loop(), table)
            await super().startup(sockets=sockets)
            for sock in sockets or ():  # uvicorn's backlog bounds each burst of accepts; the kernel's queue stays long
                sock.listen(KERNEL_BACKLOG)
            if sockets and self.started:
                self._log_started_message(sockets)

    config = uvicorn.Config(app, host=host.strip("[]"), port=port, log_level=log_level, http=protocol,
                            backlog=limits.accept_batch(),
                            timeout_keep_alive=limits.keep_alive_s,
                            h11_max_incomplete_event_size=limits.max_header_bytes)
    return Server(config)


def run(app: Any, sock: socket.socket, host: str, *, log_level: str = "info",
        limits: ConnectionLimits | None = None) -> None:
    """Serve ``app`` with uvicorn on ``sock`` (from `bind`) until stopped (Ctrl-C, SIGTERM), its
    connections guarded by ``limits`` (see `server`)."""
    try:
        server(app, host, bound_port(sock), limits=limits, log_level=log_level).run(sockets=[sock])
    finally:
        sock.close()
