"""The prefill scheduler: which waiting request the embedded engine prefills next.

Sources: SGLang's longest-prefix-first scheduling, RAGCache's cache-aware reordering.

Algorithm
---------
Prefill is the expensive, cache-sensitive phase, so the engine runs one prefill at a time behind
this gate (decode steps of admitted requests still interleave, token by token, through the
engine's model lock). A request that finds the gate free and nobody waiting enters at once, with
no scoring at all. Otherwise it waits; each time the gate frees, the releasing thread scores every
waiter with its ``score()`` (the engine passes the tokens of the request's longest cached prefix,
read from the tree without side effects) and hands the gate to:

1. the oldest waiter, if it has waited longer than ``max_wait_s`` (the age bound: no request
   starves behind a stream of better-cached ones);
2. otherwise the waiter with the highest score, the earliest arrival among equals.

Scores are taken when the gate frees, not on arrival: the request just served may have inserted
exactly the passages a waiter needs. Serving the best-cached request first shortens its own
time to first token and, by RAGCache's argument, keeps the hot paths of the tree hot while they
are being reused.

Knobs (:class:`SchedulerConfig`)
--------------------------------
max_wait_s = 2.0: the age bound. Smaller is fairer (0 is plain FIFO); larger favours cache hits
under bursts. Scoring costs O(waiters × depth) tree look-ups per hand-over.

Thread-safety: :meth:`PrefillScheduler.turn` may be called from any number of threads.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Settings of :class:`PrefillScheduler`; see the module header."""

    max_wait_s: float = 2.0

    def __post_init__(self) -> None:
        if self.max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0, got {self.max_wait_s}")


@dataclass(eq=False)
class _Waiter:
    seq: int
    arrival: float
    score: Callable[[], int]
    admitted: bool = field(default=False)


class PrefillScheduler:
    """A gate that admits one prefill at a time, longest cached prefix first, with an age bound.

    clock: seconds, monotonic (injectable for tests).
    """

    def __init__(self, config: SchedulerConfig | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or SchedulerConfig()
        self.clock = clock
        self._cond = threading.Condition()
        self._busy = False
        self._waiting: list[_Waiter] = []
        self._seq = itertools.count()
        #: Admission order as request sequence numbers (for tests and diagnostics; bounded).
        self.admitted: list[int] = []

    @property
    def waiting(self) -> int:
        """How many requests wait for the gate now."""
        with self._cond:
            return len(self._waiting)

    @contextmanager
    def turn(self, score: Callable[[], int]) -> Iterator[int]:
        """Hold the gate for the ``with`` block; yields this request's sequence number.

        score: called (under the scheduler's lock, possibly several times, possibly never) to rank
        this request when it has to wait; higher goes first. It must not call the scheduler.
        """
        with self._cond:
            me = _Waiter(next(self._seq), self.clock(), score)
            if not self._busy and not self._waiting:
                self._admit(me)
            else:
                self._waiting.append(me)
                while not me.admitted:
                    self._cond.wait()
        try:
            yield me.seq
        finally:
            with self._cond:
                self._busy = False
                if self._waiting:
                    nxt = self._pick()
                    self._waiting.remove(nxt)
                    self._admit(nxt)
                    self._cond.notify_all()

    def _admit(self, waiter: _Waiter) -> None:
        self._busy = True
        waiter.admitted = True
        self.admitted.append(waiter.seq)
        if len(self.admitted) > 4096:
            del self.admitted[:2048]

    def _pick(self) -> _Waiter:
        i = pick_next([w.arrival for w in self._waiting], [w.score for w in self._waiting],
                      self.clock(), self.config.max_wait_s)
        return self._waiting[i]


def pick_next(arrivals: Sequence[float], scores: Sequence[Callable[[], int]], now: float,
              max_wait_s: float) -> int:
    """The scheduling rule, on its own (the benchmark replays it without threads): the index of
    the waiter to admit. ``arrivals`` in arrival order; the oldest waiter when it has waited more
    than ``max_wait_s``, else the highest score, the earliest arrival among equals. Scores are
    only called when the age bound does not decide."""
    if not arrivals:
        raise ValueError("nobody is waiting")
    if now - arrivals[0] > max_wait_s:
        return 0
    values = [score() for score in scores]
    return max(range(len(values)), key=lambda i: (values[i], -i))
