"""`Deferred`: a generator built and loaded on a background thread, standing in for it meanwhile.

Why: a one-shot ``slimrag ask`` with the embedded model streams a grounded answer's evidence lead
before the model is needed (`slimrag.rag.grounded`), but building the embedded generator imports
torch and the engine (~1.2 s of a ~2 s cold first byte here, docs/benchmarks.md "Cold ask"). A
`Deferred` answers at once the capability attributes a `RAG` reads when it is made, from what
the backend declares (`slimrag.llm.declared.Declared`, registered beside its factory in
`slimrag.llm.backends`), and
builds the real generator on a daemon thread, then starts its ``load``: the main thread opens the
index, retrieves and ranks the evidence meanwhile, and the first call that needs the model
(``stream``, ``load``, ``keep``, ``planning_cache``, ``subscribe_kv``) waits for the build.

Failures: an exception of the build is kept and raised, as it was raised, by every call that needs
the generator (so a missing torch reads the same as without the thread); a failed ``load`` on the
thread is only logged, and raised again with its message by the load that the first call into
the model makes (a generator's ``load`` keeps nothing of a failed attempt).

Import safety: the thread imports the backend's stack (torch, the engine) while the main thread
imports the RAG layer and the embedder's runtime. Python's per-module import locks make that
safe unless two modules, one mid-import on each thread, import each other (an import cycle);
slimrag's layers import one way down (tests/test_layers.py) and tests/test_deferred.py runs the
race in fresh processes.

Exit: a process that ends while the thread runs (an answer below the relevance floor never calls
the model; Ctrl-C) waits for it at exit (`atexit`): native runtimes torn down under a thread still
importing torch or building the model's ONNX sessions abort the process ("terminate called
without an active exception", exit status 134: 2 of 2 such asks with the build on the thread,
1 of 4 before, when only the load ran there). The answer is out by then; only the exit waits, and
not for long: a build that is done starts no load once the process exits, and the wait ends after
`EXIT_WAIT_S` (10 s) whatever the thread does (a hung import then risks the abort, not a hang).
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from slimrag.config import GenerationConfig
from slimrag.llm.base import Delta, Generator, LoadReport
from slimrag.llm.declared import Declared
from slimrag.prompt import Prompt, Segment

if TYPE_CHECKING:
    from slimrag.llm.kv.events import KVEvent
    from slimrag.prompt import PlanningCache

log = logging.getLogger("slimrag.llm")

#: The longest the exit waits for the thread (module header, "Exit").
EXIT_WAIT_S = 10.0


class Deferred(Generator):
    """The generator ``build`` makes, built on a daemon thread started here and loaded after it;
    ``declared`` gives the capability attributes meanwhile, ``name`` the name until it is built
    (module header). Thread-safe as the built generator is (``declared.thread_safe``)."""

    def __init__(self, build: Callable[[], Generator], declared: Declared, name: str = "generator") -> None:
        self.name = name
        self.thread_safe = declared.thread_safe
        self.default_repetition_penalty = declared.default_repetition_penalty
        self.shadows_prefix_cache = declared.shadows_prefix_cache
        self.default_answer_mode = declared.default_answer_mode
        self.copies = declared.copies
        self._built: Generator | None = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._exiting = threading.Event()
        self._closed = False
        self._loading = False  # the thread's load runs: an owner's close is left to the thread
        self._close_lock = threading.Lock()  # the owner's close and the build's end: one of them closes
        self._thread = threading.Thread(target=self._run, args=(build,), name="slimrag-deferred", daemon=True)
        self._thread.start()
        atexit.register(self._at_exit)

    def _at_exit(self) -> None:
        """Wait for the thread a bounded while, and let a finished build start no load (module header)."""
        self._exiting.set()
        self._thread.join(EXIT_WAIT_S)
        if self._thread.is_alive():
            log.warning("the model's build did not finish within %.0f s of exit; exiting anyway", EXIT_WAIT_S)

    def _run(self, build: Callable[[], Generator]) -> None:
        try:
            built = build()
        except BaseException as e:  # kept and raised by every call that needs it (module header)
            self._error = e
            self._done.set()
            return
        with self._close_lock:
            self._built, self.name = built, built.name
            closed = self._closed
            # the process is ending or the owner closed it: nothing will use the model
            self._loading = not closed and not self._exiting.is_set()
        self._done.set()
        if closed:  # the owner closed it while it was being built
            built.close()
            return
        if not self._loading:
            return
        if not self._exiting.is_set():  # a close that landed since the lock above: no load for nothing
            try:
                built.load()
            except Exception as e:  # noqa: BLE001  (raised again by the answer's own load; module header)
                log.info("background load of %s failed (the answer's own load tries again): %s", built.name, e)
        with self._close_lock:
            closed, self._loading = self._closed, False
        if closed:  # the owner closed it during the load: close what the load opened
            built.close()

    def generator(self) -> Generator:
        """The built generator, once its build is done (its load may still run); raises the
        build's exception if it failed."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._built is not None
        return self._built

    def load(self) -> LoadReport | None:
        """Wait for the build and load (idempotent; the thread's load may be under way)."""
        return self.generator().load()

    def planning_cache(self) -> PlanningCache | None:
        """The built generator's (waits for the build)."""
        return self.generator().planning_cache()

    def subscribe_kv(self, listener: Callable[[KVEvent], None]) -> bool:
        """The built generator's (waits for the build)."""
        return self.generator().subscribe_kv(listener)

    def keep(self, segments: Sequence[Segment]) -> int:
        """The built generator's (waits for the build)."""
        return self.generator().keep(segments)

    def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
        """The built generator's stream (waits for the build when called)."""
        return self.generator().stream(prompt, config)

    def close(self) -> None:
        """Close the built generator, never waiting for the thread: a build still under way starts
        no load and is closed when it ends (the owner is done with it: nothing will use the model);
        a close that lands while the thread's load runs is left to the thread, which closes what
        the load opened once it ends (closing the embedded model during its load would wait for it)."""
        self._exiting.set()
        with self._close_lock:
            self._closed, built, loading = True, self._built, self._loading
        if built is not None and not loading:
            built.close()
