"""A generator's owner closes it (`Generator.close`): a `Deferred` closes what its thread built, once, whether the build ends before or after the owner's
close, and a build that ends after it starts no load."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from slimrag.config import GenerationConfig
from slimrag.llm.base import Delta, Generator
from slimrag.llm.declared import Declared
from slimrag.llm.deferred import Deferred
from slimrag.prompt import Prompt


class Counted(Generator):
    """Counts its loads and closes."""

    def __init__(self) -> None:
        self.loads = self.closes = 0

    def load(self) -> None:
        self.loads += 1

    def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
        yield Delta("", finish_reason="stop")

    def close(self) -> None:
        self.closes += 1


@pytest.mark.parametrize("close_first", [True, False])
def test_a_deferred_closes_what_it_built_once(close_first: bool) -> None:
    built, release = Counted(), threading.Event()

    def build() -> Generator:
        release.wait(10)
        return built

    d = Deferred(build, Declared())
    if close_first:  # the owner is done before the build ends: the thread closes it, and loads nothing
        d.close()
        release.set()
    else:
        release.set()
        d.generator()
        d.close()
    d._thread.join(10)
    assert built.closes == 1
    if close_first:
        assert built.loads == 0  # closed before its build ended: nothing will use the model


def test_a_served_generator_that_takes_turns_keeps_its_answer_mode_and_closes() -> None:
    from slimrag.serve.workers import shared

    class Grounded(Counted):
        thread_safe, default_answer_mode = False, "grounded"

    inner = Grounded()
    served = shared(inner)
    assert served is not inner  # not thread-safe: the workers take turns through a wrapper
    assert served.default_answer_mode == "grounded"  # the wrapper read "free", the base's default
    served.close()
    assert inner.closes == 1


def test_a_close_during_the_threads_load_returns_at_once_and_the_thread_closes_after_it() -> None:
    """The owner's close never waits for the thread's load (`ask` closes its generator as it ends,
    and the embedded model's close would wait for a load under way); the thread closes what the
    load opened once the load ends, once."""
    loading, release = threading.Event(), threading.Event()

    class Slow(Counted):
        def load(self) -> None:
            loading.set()
            release.wait(10)
            super().load()

    built = Slow()
    d = Deferred(lambda: built, Declared())
    assert loading.wait(10)
    closer = threading.Thread(target=d.close)
    closer.start()
    closer.join(5)
    assert not closer.is_alive() and built.closes == 0  # returned at once; nothing closed under the load
    release.set()
    d._thread.join(10)
    assert built.loads == 1 and built.closes == 1
