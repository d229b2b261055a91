"""`EventPublisher`: a knowledge tree's KV events on ZMQ, framed as vLLM's ``ZmqEventPublisher`` frames them.

``slimrag serve --kv-events ENDPOINT`` runs one (`slimrag.serve.app`); the records and their
encoding are in `slimrag.llm.kv.events`, the router that reads them in `slimrag.route.events`.

Framing (vLLM's)
    A PUB socket sends each batch as three frames: the topic, the sequence number (8 bytes,
    big-endian, from 0 for each stream) and the msgpack ``KVEventBatch``. A ROUTER socket serves
    replays: a client sends ``[b"", start]`` (``start`` 8 bytes big-endian) from a DEALER (a REQ
    works too) and gets ``[b"", seq, payload]`` for every buffered batch from ``start`` on, then
    ``[b"", END_SEQ, b""]`` (seq -1 signed). Both sockets are bound here (the replica is the stable
    side; vLLM binds too when the address holds ``*``).

The stream's name is in its topic
    Every stream starts with ``AllBlocksCleared`` at seq 0, but a PUB socket drops what it sends
    before a subscriber has joined, so a router may never see the first message of a restarted
    replica. The topic is therefore ``kv@`` and a random stream id drawn at start-up: a message
    whose topic changed is a new stream, whatever its sequence number, and a router rebuilds its view
    from nothing the moment the first message of the new stream arrives. Subscribe to the empty
    prefix (vLLM's default topic is empty, so its readers already do).

Knobs (`EventsConfig`)
    ``endpoint``: the PUB address, e.g. ``tcp://127.0.0.1:5557`` (``tcp://127.0.0.1:*``: a free
    port, read back from `EventPublisher.endpoint`). ``replay_endpoint`` (default: the same host,
    the PUB port + 1, or a free port for ``*``). ``buffer_steps`` 10,000: batches kept for replay,
    as vLLM keeps; at about 100 bytes an event and a few events a request, 10,000 batches are a few
    MB and cover a router that was away for thousands of requests. ``max_batch`` 1,024: most events
    in one message (what the queue holds when the thread wakes is sent together, up to this).
    ``layout`` ``map``: vLLM's current encoding (``array`` for readers of its earlier one).
    ``reuse`` ``exact``: how the replica reuses what it publishes (`slimrag.llm.kv.config.REUSE_MODES`),
    named in its ``/healthz`` beside the sockets: under ``exact`` a passage saves its prefill only
    behind the passages it was computed behind, under ``blend`` its entry (the segment right under a
    system segment) is placed wherever it stands, so a router prices a replica's segments by it.

Threads: `EventPublisher.put` may be called from any thread (the tree calls it under its lock;
it only queues); one thread owns both sockets.
"""

from __future__ import annotations

import logging
import queue
import secrets
import threading
from collections import deque
from dataclasses import dataclass

import zmq

from slimrag.llm.kv.config import REUSE_MODES
from slimrag.llm.kv.events import LAYOUTS, KVEvent, encode_batch

log = logging.getLogger(__name__)

#: The sequence number that ends a replay (-1, 8 bytes big-endian signed), as vLLM sends it.
END_SEQ = (-1).to_bytes(8, "big", signed=True)
#: The topic prefix; the stream id follows it.
TOPIC_PREFIX = "kv@"


@dataclass(frozen=True, slots=True)
class EventsConfig:
    """Where and how a replica publishes its KV events (module header)."""

    endpoint: str
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    max_batch: int = 1024
    layout: str = "map"
    reuse: str = "exact"

    def __post_init__(self) -> None:
        for name in ("endpoint", "replay_endpoint"):
            value = getattr(self, name)
            if value is not None and not value.startswith(("tcp://", "ipc://", "inproc://")):
                raise ValueError(f"{name} must look like tcp://127.0.0.1:5557, got {value!r}")
        if self.buffer_steps < 1 or self.max_batch < 1:
            raise ValueError("buffer_steps and max_batch must be >= 1")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.reuse not in REUSE_MODES:
            raise ValueError(f"reuse must be one of {REUSE_MODES}, got {self.reuse!r}")

    def replay(self) -> str:
        """The replay address: as given, else the PUB host with its port + 1 (a free port for ``*``)."""
        if self.replay_endpoint is not None:
            return self.replay_endpoint
        head, _, port = self.endpoint.rpartition(":")
        if not self.endpoint.startswith("tcp://") or not (port == "*" or port.isdigit()):
            raise ValueError(f"give a replay endpoint for {self.endpoint!r} (only tcp://HOST:PORT implies one)")
        return f"{head}:{'*' if port == '*' else int(port) + 1}"


class EventPublisher:
    """Publishes queued events on PUB, serves replays on ROUTER (module header). ``endpoint`` and
    ``replay_endpoint`` are the bound addresses; ``topic`` names this stream; ``seq`` counts the
    batches sent. Call `close` to stop."""

    def __init__(self, config: EventsConfig) -> None:
        self.config = config
        self.topic = TOPIC_PREFIX + secrets.token_hex(6)
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(100_000)
        self._replay = self._ctx.socket(zmq.ROUTER)
        try:
            self._pub.bind(config.endpoint)
            self._replay.bind(config.replay())
        except zmq.ZMQError as e:
            self._pub.close(linger=0)
            self._replay.close(linger=0)
            self._ctx.term()
            raise OSError(f"cannot bind the KV event sockets ({config.endpoint}, {config.replay()}): {e}; "
                          "choose free ports") from e
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        self.seq = 0
        self._queue: queue.SimpleQueue[KVEvent | None] = queue.SimpleQueue()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    def put(self, event: KVEvent) -> None:
        """Queue one event (any thread; never blocks)."""
        self._queue.put(event)

    def close(self, timeout: float = 2.0) -> None:
        """Send what is queued, stop the thread and close the sockets."""
        if not self._thread.is_alive():
            return
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("the KV event thread did not stop within %.1f s", timeout)
            return
        self._pub.close(linger=0)
        self._replay.close(linger=0)
        self._ctx.term()

    def _run(self) -> None:
        topic = self.topic.encode()
        stopping = False
        while not stopping:
            while self._replay.poll(0):
                self._serve_replay()
            try:
                first = self._queue.get(timeout=0.02)
            except queue.Empty:
                continue
            events: list[KVEvent] = []
            item: KVEvent | None = first
            while True:
                if item is None:
                    stopping = True
                    break
                events.append(item)
                if len(events) >= self.config.max_batch:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if events:
                payload = encode_batch(events, layout=self.config.layout)
                self._pub.send_multipart((topic, self.seq.to_bytes(8, "big"), payload))
                self._buffer.append((self.seq, payload))
                self.seq += 1

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            log.warning("ignored a replay request of %d frames (want identity, empty, 8-byte seq)", len(frames))
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= first:
                self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", END_SEQ, b""))
