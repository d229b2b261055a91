"""The decode batcher: concurrent streams of the embedded engine share their decode forward passes.

Sources: continuous batching (Orca, OSDI '22; vLLM, nano-vllm): requests join and leave the
running batch at every step instead of waiting for a whole batch to finish.

Algorithm
---------
A stream that has finished its prefill enters the batcher (:meth:`DecodeBatcher.stream`, a
context manager: it counts as *active* until it leaves, EOS, limit, error or a caller that
stopped asking included). For each decode step it calls :meth:`DecodeSlot.step` with its token,
position and cache, and blocks until its logits are there. There is no batcher thread: the
waiting streams elect a *leader* among themselves, which

1. waits until no step is running and either every active stream has submitted (or ``width`` of
   them have), or ``wait_s`` has passed since the later of its own submission and the end of
   the last step (a stream whose caller is slow, or gone without leaving, delays the others by
   at most ``wait_s`` per step, never stalls them);
2. takes the model lock (the one prefills hold for each forward, so the prefills the scheduler
   admits interleave between decode steps), then the first ``width`` waiting requests (those
   that arrived while it waited for the lock included), and runs them as one step
   (:func:`slimrag.llm.model.batch.decode_step`: row-wise parts batched, each row's products
   those of a one-token forward; attention per sequence);
3. hands every request its logits (or the step's exception) and wakes the others. Requests
   beyond ``width`` wait for the next step, first come first served.

Waiting for the streams of the step that just ended (rather than starting at once with those
already waiting) is what merges streams into one step: with 8 streams and a free start, two
groups of 4 would alternate forever, each step paying the weights' read for 4 rows.

Exactness: a step's rows are bitwise the one-token forwards of their sequences alone (see
:mod:`slimrag.llm.model.batch`), so tokens do not depend on the batching, the timing or the
number of clients, and equal those of ``width = 1``. A step of one row is that forward itself:
a lone stream pays no batching tax.

Knobs (:class:`BatchConfig`)
----------------------------
width = 8: most sequences per step. More rows per step raise throughput (a step reads each
weight block from memory once for all its rows) and the time of each step. 1 turns batching
off: every step is the one-token forward of :meth:`slimrag.llm.model.Decoder.forward` under the
model lock, each stream on its own (the same tokens; no waiting for other streams).
wait_s = 0.02: how long a ready request waits for the others after a step (see step 1), against
steps of 150-400 ms here. Too short, and under load the streams of a step are not all back in
time (their threads wait for the GIL): the next step starts with some, the rest form another,
and the two groups alternate at half the width. Longer delays every step by up to that much
while a stream's caller is slow or gone.

Thread safety: every method may be called from any thread; one stream is used by one thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field

import torch

from slimrag.llm.engine.decoding import Chooser
from slimrag.llm.model import Decoder, KVCache
from slimrag.llm.model.batch import decode_step, rows_are_exact

#: Runs one step: tokens, positions and caches of the rows, returning their logits ``[rows, vocab]``.
StepFn = Callable[[Sequence[int], Sequence[int], Sequence[KVCache]], torch.Tensor]


@dataclass(frozen=True, slots=True)
class BatchConfig:
    """Settings of :class:`DecodeBatcher`; see the module header."""

    width: int = 8
    wait_s: float = 0.02

    def __post_init__(self) -> None:
        if self.width < 1:
            raise ValueError(f"decode width must be >= 1 (1 turns batching off), got {self.width}")
        if self.wait_s < 0:
            raise ValueError(f"wait_s must be >= 0, got {self.wait_s}")

    @property
    def enabled(self) -> bool:
        """Whether decode steps are batched (``width > 1``)."""
        return self.width > 1


@dataclass(eq=False, slots=True)
class _Request:
    token: int
    pos: int
    cache: KVCache
    since: float
    logits: torch.Tensor | None = None
    error: BaseException | None = None
    done: bool = field(default=False)


@dataclass(frozen=True, slots=True)
class BatchStats:
    """Counters of a batcher: steps run and rows computed (rows / steps is the mean batch)."""

    steps: int
    rows: int


class DecodeSlot:
    """One stream's handle on the batcher (from :meth:`DecodeBatcher.stream`)."""

    def __init__(self, batcher: DecodeBatcher) -> None:
        self._batcher = batcher

    def step(self, token: int, pos: int, cache: KVCache) -> torch.Tensor:
        """Feed ``token`` at ``pos`` to ``cache`` in the next shared step; its logits ``[vocab]``."""
        return self._batcher._step(token, pos, cache)


class DecodeBatcher:
    """Runs the decode steps of concurrent streams together (see the module header). ``run``
    computes one step for the rows given; ``lock`` is the model lock, held around it."""

    def __init__(self, run: StepFn, lock: AbstractContextManager[object], config: BatchConfig) -> None:
        if not config.enabled:
            raise ValueError("a DecodeBatcher needs width > 1; width 1 decodes each stream on its own")
        self.config = config
        self._run, self._lock = run, lock
        self._cond = threading.Condition()
        self._pending: list[_Request] = []
        self._active = 0
        self._running = False
        self._free_since = time.monotonic()
        self._steps = self._rows = 0

    @contextmanager
    def stream(self) -> Iterator[DecodeSlot]:
        """Be an active stream for the ``with`` block (the others wait for its requests)."""
        with self._cond:
            self._active += 1
        try:
            yield DecodeSlot(self)
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()  # the rest may now all be waiting

    @property
    def active(self) -> int:
        """Streams inside :meth:`stream` now."""
        with self._cond:
            return self._active

    def stats(self) -> BatchStats:
        """Steps run and rows computed so far."""
        with self._cond:
            return BatchStats(self._steps, self._rows)

    def _ready(self, now: float) -> bool:
        """May a waiting request start a step now? (Called holding ``_cond``, no step running.)"""
        everyone = len(self._pending) >= min(self.config.width, max(self._active, 1))
        waited = now - max(self._pending[0].since, self._free_since) >= self.config.wait_s
        return everyone or waited

    def _step(self, token: int, pos: int, cache: KVCache) -> torch.Tensor:
        req = _Request(token, pos, cache, time.monotonic())
        with self._cond:
            self._pending.append(req)
            self._cond.notify_all()
        while True:
            with self._cond:
                while not req.done:
                    now = time.monotonic()
                    if not self._running and self._pending and self._ready(now):
                        self._running = True
                        break
                    if self._running or not self._pending:
                        self._cond.wait()
                    else:
                        start = max(self._pending[0].since, self._free_since)
                        self._cond.wait(max(start + self.config.wait_s - now, 0.0))
                else:
                    if req.error is not None:
                        raise req.error
                    assert req.logits is not None
                    return req.logits
            self._lead()

    def _lead(self) -> None:
        """Run one step as the leader (``_running`` already set by the caller)."""
        batch: list[_Request] = []
        try:
            with self._lock:
                with self._cond:
                    batch = self._pending[: self.config.width]
                    del self._pending[: len(batch)]
                if batch:
                    try:
                        logits = self._run([r.token for r in batch], [r.pos for r in batch],
                                           [r.cache for r in batch])
                    except Exception as e:  # every row of the step gets the error, in its own thread
                        for r in batch:
                            r.error = e
                    else:
                        for i, r in enumerate(batch):
                            r.logits = logits[i]
        finally:
            with self._cond:
                for r in batch:
                    r.done = True
                    if r.logits is None and r.error is None:  # the step was interrupted
                        r.error = RuntimeError("the decode step this request was in did not finish")
                self._steps += 1 if batch else 0
                self._rows += len(batch)
                self._running = False
                self._free_since = time.monotonic()
                self._cond.notify_all()


#: The generator's own forward of ``ids`` at ``start_pos`` on ``cache`` (under its model lock):
#: last position's logits. The unbatched decode step is this with one token.
ForwardFn = Callable[[list[int], KVCache, int], torch.Tensor]


class DecodeLoop:
    """A generator's decode steps: through a :class:`DecodeBatcher` (``config.width > 1``), or
    each stream with its own one-token ``forward`` (width 1). ``model`` returns the loaded
    decoder; ``lock`` is the model lock."""

    def __init__(self, model: Callable[[], Decoder], forward: ForwardFn, lock: AbstractContextManager[object],
                 config: BatchConfig) -> None:
        self.config, self._forward = config, forward
        self._batcher = DecodeBatcher(_SharedStep(model, config.width), lock, config) if config.enabled else None

    @property
    def batcher(self) -> DecodeBatcher | None:
        """The batcher (None with batching off)."""
        return self._batcher

    def stats(self) -> BatchStats | None:
        """The batcher's counters (None with batching off)."""
        return self._batcher.stats() if self._batcher is not None else None

    def tokens(self, logits: torch.Tensor, cache: KVCache, pos: int,
               choose: Chooser) -> Generator[int, None, None]:
        """Yield one token per step, chosen from ``logits``; feed it back (at ``pos``, then on)
        only when the caller asks for the next one, so a caller that stops never pays for a
        forward it does not use. With batching on, the iterator is an active stream of the
        batcher until it is closed or collected: close it when done."""
        if self._batcher is None:
            while True:
                token = choose(logits)
                yield token
                logits = self._forward([token], cache, pos)
                pos += 1
        with self._batcher.stream() as slot:
            while True:
                token = choose(logits)
                yield token
                logits = slot.step(token, pos, cache)
                pos += 1


class _SharedStep:
    """One batched step of the decoder that ``model`` returns (a :class:`DecodeBatcher`'s ``run``,
    called holding the model lock). Its own object, not a method of :class:`DecodeLoop`: the
    batcher holds it, and a loop that the batcher held back would be a cycle keeping the model
    mapped until a collection ran."""

    def __init__(self, model: Callable[[], Decoder], width: int) -> None:
        self._model, self._width = model, width
        self._together: bool | None = None

    def __call__(self, tokens: Sequence[int], positions: Sequence[int], caches: Sequence[KVCache]) -> torch.Tensor:
        model = self._model()
        if self._together is None and len(tokens) > 1:  # checked once, at the first shared step
            self._together = rows_are_exact(model)
        with torch.inference_mode():
            return decode_step(model, tokens, positions, caches, self._width, together=bool(self._together))
