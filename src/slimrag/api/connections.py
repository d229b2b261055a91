"""`ConnectionLimits` and `GuardedH11`: idle and slow connections are dropped, and the number held is capped.

Why a protocol subclass
    uvicorn's h11 protocol arms a timer only after a response (``timeout_keep_alive``) and cancels
    it on any byte received, so a socket that connects and sends nothing, or sends its request head
    one byte every few seconds (slowloris), is held forever. 300 such sockets starved ``slimrag
    serve`` in a probe, and the process ran out of file descriptors (``accept()`` failing with
    EMFILE, a traceback a second in the log). uvicorn's ``limit_concurrency`` does not help: it
    still accepts the socket and answers 503 only once a request head arrives, which an idle socket
    never sends. `GuardedH11` adds two timers and a cap, all in the transport, before any app code:

``header_timeout_s`` (default 10 s)
    From the moment a connection waits for a request (when it opens, and after each response)
    until the request's head (request line and headers) is complete. Bytes arriving slowly do not
    reset it. On expiry the connection is closed without an answer. Lower it to free sockets
    sooner; a client on a slow link needs a few seconds to send a head of a few KiB.
``body_timeout_s`` (default 30 s)
    From a complete head until the last byte of its body. The body is at most the app's
    ``max_body_bytes`` (1 MiB by default), so 30 s admits a link of about 35 KiB/s. On expiry the
    connection is closed; the app sees the client leave (counted as status 499).
``max_connections`` (default: half the process's soft ``RLIMIT_NOFILE``, at most 4096, at least 16)
    Connections held at once. The other half of the descriptors stays for the index, its SQLite
    connections (one per worker thread) and the model files. At the cap, a new connection takes
    the place of the one idle longest (waiting for a request, no request in progress), which is
    closed; when none is idle (every connection is in the middle of a request), the new one is
    closed at once. So idle sockets cannot keep a new client out, and the process never reaches
    its descriptor limit through connections alone. Raise ``ulimit -n`` to hold more.
``max_header_bytes`` (default 64 KiB)
    The largest request head h11 buffers (uvicorn's ``h11_max_incomplete_event_size``); a larger
    one is answered 400 and closed.

Accepting in bursts
    asyncio accepts up to ``backlog`` sockets each time the listening socket is readable, before
    any of their protocols run (and a closed transport frees its descriptor only a loop turn
    later), so a burst of a thousand connections took a thousand descriptors before the cap could
    close one: ``accept()`` failed with EMFILE, asyncio paused accepting for a second, and
    ``/healthz`` waited 6 s behind the flood (measured, descriptor limit 256). The server is
    therefore started with a backlog of 16 (`ACCEPT_BATCH`): a few bursts in flight stay well
    inside the half of the descriptors the cap leaves. The kernel's queue is then set back to 2048
    (the socket is listened on again), so a flood waits in the kernel, costing this process
    nothing, and is not dropped.

If ``accept()`` still fails for want of descriptors (another part of the process holds them),
asyncio pauses accepting for a second and retries; `quiet_accept_errors` turns its traceback into
one warning line a minute and closes the connection idle longest to free a descriptor.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from slimrag.api.limits import ACCEPT_BATCH, ConnectionLimits, default_max_connections

__all__ = ["ACCEPT_BATCH", "ConnectionLimits", "ConnectionTable", "GuardedH11", "default_max_connections",
           "guarded_protocol", "quiet_accept_errors"]

log = logging.getLogger("slimrag.http")

#: Errnos of an ``accept()`` that failed for want of descriptors or memory.
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


@dataclass
class ConnectionTable:
    """The connections one server holds, the idle ones in the order they became idle. Event loop only."""

    limit: int
    held: set[GuardedH11] = field(default_factory=set)
    idle: OrderedDict[GuardedH11, None] = field(default_factory=OrderedDict)
    dropped: int = 0

    def admit(self, conn: GuardedH11) -> bool:
        """Hold ``conn``, closing the connection idle longest when at the cap; False when every
        held connection is busy, so ``conn`` must be closed."""
        if len(self.held) >= self.limit and not self.drop_oldest_idle():
            self.dropped += 1
            return False
        self.held.add(conn)
        self.idle[conn] = None
        return True

    def drop_oldest_idle(self) -> bool:
        """Close the connection idle longest; False when none is idle."""
        if not self.idle:
            return False
        victim, _ = self.idle.popitem(last=False)
        self.held.discard(victim)
        self.dropped += 1
        victim.close()
        return True

    def busy(self, conn: GuardedH11) -> None:
        """``conn`` started a request: not a candidate for closing at the cap."""
        self.idle.pop(conn, None)

    def waiting(self, conn: GuardedH11) -> None:
        """``conn`` waits for its next request: the newest idle one."""
        if conn in self.held:
            self.idle.pop(conn, None)
            self.idle[conn] = None

    def forget(self, conn: GuardedH11) -> None:
        """``conn`` is closed."""
        self.held.discard(conn)
        self.idle.pop(conn, None)


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with the header and body timeouts and the connection cap of the
    module header. `guarded_protocol` makes a subclass bound to one server's table and limits."""

    table: ConnectionTable
    limits: ConnectionLimits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._in_request = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self.table.admit(self):
            log.warning("%d connections held, all in a request: a new one is closed (max_connections)",
                        self.table.limit)
            self.close()
            return
        self._arm(self.limits.header_timeout_s, "header")

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.table.forget(self)
        super().connection_lost(exc)

    def close(self) -> None:
        """Close the connection now (a timeout, or room made at the cap)."""
        self._disarm()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def _follow(self) -> None:
        """Arm the timer that fits where the connection is: waiting for a head, or for a body."""
        if self.transport is None or self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is None or cycle.response_complete:  # waiting for the next request's head
            if self._in_request:
                self._in_request = False
                self.table.waiting(self)
                self._arm(self.limits.header_timeout_s, "header")
            return
        if not self._in_request:  # a head just completed
            self._in_request = True
            self.table.busy(self)
            self._disarm()
        if cycle.more_body:
            if self._timer is None:
                self._arm(self.limits.body_timeout_s, "body")
        else:
            self._disarm()

    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, self._expired, what)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self, what: str) -> None:
        self._timer = None
        limit = self.limits.header_timeout_s if what == "header" else self.limits.body_timeout_s
        log.info("closed a connection from %s: its request %s took over %g s", self.client, what, limit)
        self.close()


def guarded_protocol(limits: ConnectionLimits) -> tuple[type[GuardedH11], ConnectionTable]:
    """A `GuardedH11` subclass for one server (uvicorn's ``http=`` argument) and its table."""
    table = ConnectionTable(limits.connections())
    return type("BoundGuardedH11", (GuardedH11,), {"table": table, "limits": limits}), table


def quiet_accept_errors(loop: asyncio.AbstractEventLoop, table: ConnectionTable, every_s: float = 60.0) -> None:
    """Install an exception handler on ``loop`` that answers an ``accept()`` out of descriptors
    with one warning line per ``every_s`` (not asyncio's traceback a second) and closes the
    connection idle longest; every other error goes to the handler installed before."""
    previous = loop.get_exception_handler()
    last = [-every_s]

    def handler(lp: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in _OUT_OF_RESOURCES and "accept" in context.get("message", ""):
            table.drop_oldest_idle()
            now = time.monotonic()
            if now - last[0] >= every_s:
                last[0] = now
                log.warning("accept() failed: %s; %d connections held. Raise the limit (ulimit -n) or lower "
                            "max_connections; retrying every second", exc.strerror or exc, len(table.held))
            return
        if previous is not None:
            previous(lp, context)
        else:
            lp.default_exception_handler(context)

    loop.set_exception_handler(handler)
