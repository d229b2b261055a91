"""The prefill scheduler: longest cached prefix first, oldest first past the age bound."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from slimrag.llm.engine.scheduler import PrefillScheduler, SchedulerConfig


def wait_for(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def run_queue(sched: PrefillScheduler, scores: list[int], before_release: Callable[[], None] = lambda: None,
              ) -> list[int]:
    """Hold the gate, queue one waiter per score (in list order), release; return service order."""
    order: list[int] = []
    gate = threading.Event()
    entered = threading.Event()

    def holder() -> None:
        with sched.turn(lambda: 0):
            entered.set()
            gate.wait()

    def waiter(score: int) -> None:
        with sched.turn(lambda: score):
            order.append(score)

    threads = [threading.Thread(target=holder)]
    threads[0].start()
    assert entered.wait(5)
    for i, s in enumerate(scores):
        threads.append(threading.Thread(target=waiter, args=(s,)))
        threads[-1].start()
        wait_for(lambda n=i + 1: sched.waiting == n)  # arrival order is list order
    before_release()
    gate.set()
    for t in threads:
        t.join(5)
    return order


def test_free_gate_admits_at_once_without_scoring() -> None:
    sched = PrefillScheduler()

    def never() -> int:
        raise AssertionError("an uncontended request must not be scored")

    with sched.turn(never) as seq:
        assert seq == 0
    with sched.turn(never) as seq:
        assert seq == 1


def test_longest_cached_prefix_first_ties_by_arrival() -> None:
    sched = PrefillScheduler(SchedulerConfig(max_wait_s=60))
    assert run_queue(sched, [10, 30, 20, 30, 0]) == [30, 30, 20, 10, 0]
    assert sched.admitted[1:3] == [2, 4]  # the two 30s, earlier arrival first


def test_age_bound_serves_the_oldest_first() -> None:
    now = [0.0]
    sched = PrefillScheduler(SchedulerConfig(max_wait_s=5), clock=lambda: now[0])

    def later() -> None:
        now[0] = 10.0  # everyone has now waited 10 s > 5 s: strict arrival order

    assert run_queue(sched, [1, 50, 7], before_release=later) == [1, 50, 7]
    assert run_queue(sched, [1, 50, 7]) == [50, 7, 1]  # no time passed: by score


def test_zero_age_bound_is_fifo() -> None:
    sched = PrefillScheduler(SchedulerConfig(max_wait_s=0), clock=iter(range(10**6)).__next__)
    assert run_queue(sched, [1, 9, 5]) == [1, 9, 5]


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        SchedulerConfig(max_wait_s=-1)
