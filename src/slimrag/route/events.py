"""`EventStream`: one replica's KV events (ZMQ) kept applied to its `KVView`, with gaps replayed.

A replica started with ``slimrag serve --kv-events`` names its two sockets in ``GET /healthz``
(``kv_events``: ``endpoint``, ``replay``); the router's health check finds them and starts a
stream (`slimrag.route.app`). Framing and topic: `slimrag.llm.kv.publish`; records and both
encodings: `slimrag.llm.kv.events`.

Keeping the view exact
    - **In order.** Batches apply in sequence order. A batch past the next expected number means
      some were lost (a PUB socket drops what a slow or absent subscriber misses): it is held, and
      the stream asks the replica's replay socket for everything from the first missing number, applies
      the replayed batches, then the held ones. Duplicates (a replay overlapping live traffic) are
      skipped.
    - **New streams.** A batch whose topic differs from the stream's is the first seen of a new
      stream (the replica restarted, so its topic's random id changed): the view is emptied at once and
      rebuilt from that stream's seq 0 by a replay. A (re)connection of the SUB socket (its
      ZMQ monitor) does the same without waiting for a live batch, since the first batches of a
      restarted replica go out before the socket is back; that is what keeps a restarted
      replica's view empty within about 0.1 s (ZMQ's reconnect interval) of its start. A
      disconnection (the replica died: its kernel closed the socket) empties the view at once.
    - **Holes.** When the replay cannot fill a gap (the replica's buffer no longer holds it, or no
      answer within ``replay_timeout_s``), the view is marked inexact (``exact`` False): the router
      then routes that replica by its approximate tree until a rebuild succeeds. A replay that timed
      out (a replica down, starting or starved of CPU) is followed by a rebuild from nothing one
      timeout later, and again until one is answered; a hole the buffer cannot fill waits for the
      replica's next stream.
    - **Bad input.** A message without three frames or an 8-byte sequence number, a payload that
      is not a batch, or an event that breaks the schema is counted in ``malformed`` and skipped;
      nothing a replica sends stops the stream.

Knobs: ``replay_timeout_s`` 2 (how long a replay may take before the view is marked inexact; a
replay of 10,000 batches over loopback takes well under a second).

Not thread-safe: one asyncio task (`EventStream.run`) owns the sockets and the view.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from slimrag.llm.kv.events import AllBlocksCleared, MalformedEvent, decode_batch
from slimrag.llm.kv.publish import END_SEQ
from slimrag.route.kv_view import KVView

log = logging.getLogger(__name__)


@dataclass(slots=True)
class StreamCounts:
    """What one stream has seen: batches applied, batches and events malformed, gaps found,
    replays asked for, new streams (restarts) and holes left."""

    applied: int = 0
    malformed: int = 0
    gaps: int = 0
    replays: int = 0
    restarts: int = 0
    holes: int = 0


class EventStream:
    """The events of the replica publishing on ``endpoint`` (replays on ``replay``), applied to
    ``view`` (module header). ``exact``: the view is complete since its stream began;
    ``synced_at``: the monotonic time of the last rebuild from nothing."""

    def __init__(self, endpoint: str, replay: str, view: KVView | None = None, *,
                 replay_timeout_s: float = 2.0, ctx: zmq.asyncio.Context | None = None) -> None:
        self.endpoint, self.replay = endpoint, replay
        self.view = view if view is not None else KVView()
        self.replay_timeout_s = replay_timeout_s
        self.counts = StreamCounts()
        self.exact = False
        self.topic: bytes | None = None
        self.next_seq = 0
        self.synced_at = 0.0
        self._ctx = ctx or zmq.asyncio.Context.instance()
        self._held: dict[int, bytes] = {}
        self._skip = 0
        self._building = False
        self._want_rebuild = False
        self._retry_at: float | None = None
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.setsockopt(zmq.RCVHWM, 100_000)
        self._monitor = self._sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self._sub.connect(endpoint)
        self._dealer = self._new_dealer()

    def invalidate(self) -> None:
        """Forget the view now and rebuild it from the replica's replay (its health changed: a
        replica found down may come back with another cache, or with the same one)."""
        self.view.clear()
        self.exact, self._want_rebuild = False, True

    def drop_next(self, n: int) -> None:
        """Discard the next ``n`` live batches as if the network lost them (fault injection for
        tests and ``bench/route.py``; the gap is then found and replayed like any other)."""
        self._skip += n

    async def run(self) -> None:
        """Apply the stream until cancelled."""
        poller = zmq.asyncio.Poller()
        poller.register(self._sub, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        try:
            while True:
                ready = dict(await poller.poll(100))
                if self._want_rebuild or (self._retry_at is not None and time.monotonic() >= self._retry_at):
                    self._want_rebuild, self._retry_at = False, None
                    await self._rebuild(None)
                if self._monitor in ready:
                    event = parse_monitor_message(await self._monitor.recv_multipart())
                    if event["event"] == zmq.EVENT_CONNECTED:
                        await self._rebuild(None)
                    elif event["event"] == zmq.EVENT_DISCONNECTED:  # its cache may be gone with it
                        self.view.clear()
                        self.exact = False
                if self._sub in ready:
                    await self._on_message(await self._sub.recv_multipart())
        finally:
            self.close()

    def close(self) -> None:
        """Close the sockets (`run` does it when cancelled)."""
        self._sub.disable_monitor()
        for sock in (self._monitor, self._sub, self._dealer):
            sock.close(linger=0)

    async def _on_message(self, frames: list[bytes]) -> None:
        if len(frames) != 3 or len(frames[1]) != 8:
            self.counts.malformed += 1
            return
        if self._skip:
            self._skip -= 1
            return
        topic, seq, payload = frames[0], int.from_bytes(frames[1], "big"), frames[2]
        if self.topic is None:
            self.topic = topic  # the stream the last (re)connection's replay was of
        elif topic != self.topic:
            self.counts.restarts += 1
            log.warning("KV events of %s: a new stream (%s); its view is rebuilt", self.endpoint,
                        topic.decode(errors="replace"))
            self._held = {seq: payload}
            await self._rebuild(topic)
            return
        if seq < self.next_seq:
            return  # already applied (a replay overlapped the live stream)
        self._held[seq] = payload
        if seq > self.next_seq:
            self.counts.gaps += 1
            await self._replay_from(self.next_seq)
        else:
            self._drain()

    async def _rebuild(self, topic: bytes | None) -> None:
        """Empty the view and rebuild it from seq 0 of the stream named ``topic`` (None: the stream
        now behind the socket, whichever it is)."""
        held = self._held if topic is not None else {}
        self.view.clear()
        self.topic, self.next_seq, self.exact, self._held = topic, 0, False, held
        self._building = True
        self.synced_at = time.monotonic()
        await self._replay_from(0)

    async def _replay_from(self, start: int) -> None:
        """Ask the replay socket for the batches from ``start`` on and apply them in order."""
        self.counts.replays += 1
        await self._dealer.send_multipart([b"", start.to_bytes(8, "big")])
        deadline = time.monotonic() + self.replay_timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not await self._dealer.poll(left * 1000):
                log.warning("KV events of %s: no replay within %.1fs; routing it by its approximate tree "
                            "until its next stream", self.endpoint, self.replay_timeout_s)
                self._dealer.close(linger=0)
                self._dealer = self._new_dealer()  # late answers must not mix with the next replay's
                self._settle(timed_out=True)
                return
            frames = await self._dealer.recv_multipart()
            if len(frames) != 3 or len(frames[1]) != 8:
                self.counts.malformed += 1
                continue
            if frames[1] == END_SEQ:
                self._settle(timed_out=False)
                return
            self._held.setdefault(int.from_bytes(frames[1], "big"), frames[2])
            self._drain()

    def _drain(self) -> None:
        """Apply held batches from ``next_seq`` on while they follow each other; drop stale ones."""
        for seq in [s for s in self._held if s < self.next_seq]:
            del self._held[seq]
        while (payload := self._held.pop(self.next_seq, None)) is not None:
            self._apply(payload)
            self.next_seq += 1

    def _settle(self, timed_out: bool) -> None:
        """After a replay: apply what follows on; a batch still missing (the replica's buffer no
        longer holds it) or a replay that timed out leaves a hole, so the view is inexact."""
        self._drain()
        complete = not (timed_out or self._held)
        if timed_out:  # the replica may be starting or busy: ask again, from nothing, a timeout later
            self._retry_at = time.monotonic() + self.replay_timeout_s
        if not complete:
            self.exact = False
            self.counts.holes += 1
            if self._held:
                self.next_seq = min(self._held)
                self._drain()
        elif self._building:
            self.exact = True
        self._building = False

    def _apply(self, payload: bytes) -> None:
        try:
            batch = decode_batch(payload)
        except MalformedEvent as e:
            self.counts.malformed += 1
            log.info("KV events of %s: a malformed batch skipped (%s)", self.endpoint, e)
            return
        self.counts.malformed += batch.malformed
        self.counts.applied += 1
        for event in batch.events:
            if isinstance(event, AllBlocksCleared):
                self.synced_at = time.monotonic()
            self.view.apply(event)

    def _new_dealer(self) -> zmq.asyncio.Socket:
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.connect(self.replay)
        return dealer


class EventStreams:
    """The KV event streams of a router's replicas, started as their ``/healthz`` names them."""

    def __init__(self, replay_timeout_s: float = 2.0) -> None:
        self.replay_timeout_s = replay_timeout_s
        self._running: dict[str, tuple[tuple[str, str], EventStream, asyncio.Task[None]]] = {}

    def watch(self, url: str, info: object) -> EventStream | None:
        """The stream of the replica at ``url`` whose ``/healthz`` said ``kv_events: info``: started
        on first sight, replaced when its addresses change, stopped when it names none. A wildcard
        host in an address (``0.0.0.0``, ``*``, ``[::]``) is replaced by the replica's own."""
        addresses = _addresses(url, info)
        running = self._running.get(url)
        if running is not None and running[0] == addresses:
            return running[1]
        if running is not None:
            running[2].cancel()
            del self._running[url]
        if addresses is None:
            return None
        stream = EventStream(*addresses, replay_timeout_s=self.replay_timeout_s)
        self._running[url] = (addresses, stream, asyncio.get_running_loop().create_task(stream.run()))
        log.info("following the KV events of %s at %s", url, addresses[0])
        return stream

    async def close(self) -> None:
        """Stop every stream."""
        tasks = [task for _, _, task in self._running.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._running.clear()


def _addresses(url: str, info: object) -> tuple[str, str] | None:
    if not isinstance(info, dict):
        return None
    endpoint, replay = info.get("endpoint"), info.get("replay")
    if not isinstance(endpoint, str) or not isinstance(replay, str):
        return None
    host = urlsplit(url).hostname or "127.0.0.1"
    host = f"[{host}]" if ":" in host else host

    def own(address: str) -> str:
        head, _, port = address.rpartition(":")
        scheme, _, bound = head.partition("://")
        return f"{scheme}://{host}:{port}" if bound in ("0.0.0.0", "*", "[::]", "::") else address

    return own(endpoint), own(replay)
