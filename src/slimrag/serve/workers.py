"""`Workers`: the threads that do the server's blocking work, each with its own `Index`.

Why threads with their own index
    An index's SQLite connection may only be used by the thread that opened it, so the event loop
    never touches the served `Index`: retrieval, embedding and generation run on ``workers``
    threads (default 4, set by `create_app`), each holding a `Worker`, its own `Index` on the
    served folder and a `RAG` over it that shares the embedder, the generator and the shadow of a
    remote prefix cache. Generation vectors are memory-mapped, so a worker's index costs little;
    an index with uncompacted delta parts holds them in memory once per worker, so compact large
    ones before serving. Threads start on the first job, open their `Worker` lazily, and close
    its index when `Workers.stop` ends them.

Index updates
    `slimrag add` and `compact` (from any process) end by replacing ``manifest.json`` with a new
    file (write, fsync, rename); `remove` only commits tombstones to the SQLite catalog. Before
    each job a worker compares the manifest's inode and modification time, and its catalog
    connection's ``PRAGMA data_version`` (which SQLite changes when another connection commits),
    with what it opened; when any differs it closes its index and opens the folder again, so
    answers follow the index without a restart. The check costs a stat and a pragma, microseconds.
    A job already running finishes on the version it started with.

Chunks awaiting vectors
    An index served before its last vector (an interrupted build, progressive indexing) answers at
    once: keyword search covers what has no vector (`slimrag.index.query`). The workers start a
    `Backfill` that embeds the rest in the background (one per folder: the server's pools share
    it), one writer-lock step at a time; each step's manifest switch reaches the workers as any
    add does (above). `Workers.stop` ends it.

Generators
    A generator whose ``thread_safe`` is True serves requests that overlap (the built-in ones: the
    local engine admits one prefill at a time through its scheduler and interleaves decode steps
    under its model lock). Any other runs one generation at a time: the workers share it wrapped by
    :func:`shared`, whose streams take turns through one lock.

Abandoned jobs
    `Workers.run` awaited by a request whose client left (`slimrag.api.disconnect.until_gone`)
    is cancelled: a job still queued never runs, and a running one finds `Worker.stop` set and
    stops at its next step if it checks (embeddings check between batches of the index's
    ``embed_batch`` texts; a search is one step and runs to its end). So 20 abandoned embeddings
    requests leave at most one batch of work behind, not 20 requests' worth.

Streaming
    `Workers.stream` moves an iterator's items from a worker thread onto the event loop one at a
    time; when the request leaves early (a client disconnect) the worker stops at its next item
    and closes the iterator, so a generation does not run on for nobody.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from slimrag.config import GenerationConfig
from slimrag.index import backfill
from slimrag.index.core import Index
from slimrag.llm.base import Delta, Generator, LoadReport
from slimrag.prompt import Prompt
from slimrag.rag.pipeline import RAG
from slimrag.rag.plan import PlanningCache

T = TypeVar("T")


class _Serialized(Generator):
    """A generator that is not thread-safe, as the workers share it: its streams take turns
    through one lock (held from the first piece asked for until the stream ends or is closed)."""

    thread_safe = True

    def __init__(self, inner: Generator) -> None:
        self.inner, self.name, self._lock = inner, inner.name, threading.Lock()
        self.default_repetition_penalty = inner.default_repetition_penalty
        self.shadows_prefix_cache = inner.shadows_prefix_cache

    def load(self) -> LoadReport | None:
        return self.inner.load()

    def planning_cache(self) -> PlanningCache | None:
        return self.inner.planning_cache()

    def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
        with self._lock:
            yield from self.inner.stream(prompt, config)


def shared(llm: Generator) -> Generator:
    """``llm`` as every worker may call it at once: itself when thread-safe, else taking turns."""
    return llm if llm.thread_safe else _Serialized(llm)


@dataclass
class Worker:
    """What one worker thread owns: its `Index` and a `RAG` over it sharing the served generator."""

    index: Index
    rag: RAG
    version: tuple[int, int, int]
    #: Set when the request of the job running now was abandoned (its client left): a long job
    #: checks it between steps and raises `Abandoned` (see `Workers.run`).
    stop: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def open(cls, served: RAG, llm: Generator) -> Worker:
        """Open the served index again in this thread, with the served embedder and settings;
        ``llm`` is the served generator as the workers share it (:func:`shared`)."""
        index = Index.open(served.index.root, embedder=served.index.embedder)
        version = index.version()
        # one mirror of the remote prefix cache for all workers (False: the served RAG keeps none)
        rag = RAG(index, llm, system=served.system, generation=served.generation, mode=served.mode,
                  shadow=served.shadow if served.shadow is not None else False, answer=served.answer_mode)
        return cls(index, rag, version)

    def current(self, served: RAG, llm: Generator) -> Worker:
        """This worker, or a fresh one when the index changed on disk since it was opened."""
        if self.index.version() == self.version:  # `Index.version`: moved by another process's add, compact or remove
            return self
        self.index.close()
        return Worker.open(served, llm)


class Abandoned(Exception):
    """A job stopped early because its request was abandoned (`Worker.stop` was set)."""


_Job = tuple[Callable[[Worker], Any], Future[Any], threading.Event]


class Workers:
    """A fixed set of threads running blocking work, each on its own `Worker` (see the module
    header). Threads start on first use and stop with :meth:`stop`; each closes its index."""

    def __init__(self, served: RAG, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"workers must be >= 1, got {threads}")
        self.served, self.n = served, threads
        self.llm = shared(served.llm)
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        #: embeds the chunks awaiting vectors while the workers answer (None: none were awaiting)
        self.backfill: backfill.Backfill | None = None
        if not served.index.coverage().complete:
            self.backfill = backfill.ensure(served.index.root, served.index.embedder)

    def submit(self, job: Callable[[Worker], T], stop: threading.Event | None = None) -> Future[T]:
        """Run ``job`` on a worker; its result or exception lands in the returned future. A
        cancelled future's job never starts; ``stop`` is the job's `Worker.stop` while it runs."""
        with self._lock:
            if not self._threads:
                self._threads = [threading.Thread(target=self._loop, name=f"slimrag-worker-{i}", daemon=True)
                                 for i in range(self.n)]
                for t in self._threads:
                    t.start()
        fut: Future[T] = Future()
        self._jobs.put((job, fut, stop or threading.Event()))
        return fut

    async def run(self, job: Callable[[Worker], T]) -> T:
        """Await ``job`` run on a worker. Cancelling the await (a client that left, see
        `slimrag.api.disconnect.until_gone`) drops the job if it has not started, and sets its
        `Worker.stop` if it has, so a job that checks it stops at its next step."""
        stop = threading.Event()
        fut = self.submit(job, stop)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            stop.set()
            fut.cancel()
            raise

    async def stream(self, job: Callable[[Worker], Iterator[T]]) -> AsyncIterator[T]:
        """Iterate ``job``'s items on a worker and yield them here; an exception it raises is
        raised here. Leaving early tells the worker to stop and close the iterator."""
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        stop = threading.Event()

        def run(worker: Worker) -> None:
            it = job(worker)
            try:
                for item in it:
                    if stop.is_set():
                        return
                    loop.call_soon_threadsafe(items.put_nowait, ("item", item))
            finally:
                close = getattr(it, "close", None)
                if close is not None:
                    close()

        def done(fut: Future[None]) -> None:
            if not fut.cancelled():
                exc = fut.exception()
                loop.call_soon_threadsafe(items.put_nowait, ("error", exc) if exc else ("end", None))

        fut = self.submit(run)
        fut.add_done_callback(done)
        try:
            while True:
                kind, value = await items.get()
                if kind == "error":
                    raise value
                if kind == "end":
                    return
                yield value
        finally:
            stop.set()
            fut.cancel()

    def stop(self, timeout: float = 10.0) -> None:
        """Let the threads finish their jobs and end (they close their indexes); a backfill still
        running ends after its current step."""
        if self.backfill is not None:
            self.backfill.stop(timeout)
        with self._lock:
            threads, self._threads = self._threads, []
        for _ in threads:
            self._jobs.put(None)
        for t in threads:
            t.join(timeout)

    def _loop(self) -> None:
        worker: Worker | None = None
        try:
            while (item := self._jobs.get()) is not None:
                job, fut, stop = item
                if not fut.set_running_or_notify_cancel():
                    continue
                try:
                    worker = (worker.current(self.served, self.llm) if worker is not None
                              else Worker.open(self.served, self.llm))
                    worker.stop = stop
                    fut.set_result(job(worker))
                except Exception as exc:  # handed to the waiting request, which answers it
                    fut.set_exception(exc)
        finally:
            if worker is not None:
                worker.index.close()
