"""`Workers`: the threads that do the server's blocking work, over one shared session.

One index for all threads
    Retrieval, embedding and generation run on ``workers`` threads (default 4, set by
    `create_app`), never on the event loop. Every pool of a server shares one `Session`
    (`slimrag.rag.session`): ONE open `Index` of the served folder (each thread reads the catalog
    through its own SQLite connection, and searches run side by side: `slimrag.index.threads`),
    the served generator, and a `RAG` per thread over both with the served settings (system
    prompt, generation, retrieval mode, answer mode, the one mirror of a remote prefix cache). A
    slim index therefore keeps one searcher and one cache of recomputed rows for the process. A
    thread starts on the first job and gets its `Worker` (the index and its RAG) then.

Index updates
    `slimrag add` and `compact` (from any process) end by replacing ``manifest.json``; `remove`
    only commits tombstones to the SQLite catalog. Before each job the session catches the index up
    (`Index.catch_up`: the manifest's inode and mtime, the thread's connection's ``PRAGMA
    data_version``; microseconds when nothing moved): a new delta part is mapped and appended, a
    removal re-reads the liveness mask, a compaction switches the generation in. Nothing is
    reopened, so what the index built up (recomputed rows, decoded text) is kept, and answers
    follow the index without a restart. A job already running finishes on the view it started
    with (a catch-up waits for the searches in flight).

Chunks awaiting vectors
    An index served before its last vector answers at once: keyword search covers what has no
    vector (`slimrag.index.query`). `create_app` starts one `Backfill` that embeds the rest in the
    background and stops it at shutdown; each of its steps reaches the workers as any add does.

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
from collections.abc import AsyncGenerator, Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from slimrag.config import GenerationConfig
from slimrag.index.core import Index
from slimrag.llm.base import Delta, Generator, LoadReport
from slimrag.prompt import Prompt
from slimrag.rag.pipeline import RAG
from slimrag.rag.plan import PlanningCache
from slimrag.rag.session import Session

T = TypeVar("T")


class _Serialized(Generator):
    """A generator that is not thread-safe, as the workers share it: its streams take turns
    through one lock (held from the first piece asked for until the stream ends or is closed)."""

    thread_safe = True

    def __init__(self, inner: Generator) -> None:
        self.inner, self.name, self._lock = inner, inner.name, threading.Lock()
        self.default_repetition_penalty = inner.default_repetition_penalty
        self.shadows_prefix_cache = inner.shadows_prefix_cache
        self.copies, self.default_answer_mode = inner.copies, inner.default_answer_mode

    def load(self) -> LoadReport | None:
        return self.inner.load()

    def close(self) -> None:
        self.inner.close()

    def planning_cache(self) -> PlanningCache | None:
        return self.inner.planning_cache()

    def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
        with self._lock:
            yield from self.inner.stream(prompt, config)


def shared(llm: Generator) -> Generator:
    """``llm`` as every worker may call it at once: itself when thread-safe, else taking turns."""
    return llm if llm.thread_safe else _Serialized(llm)


def serving(served: RAG) -> Session:
    """The session of a server over ``served``: its index (the one open for the process), its
    generator as every thread may call it (:func:`shared`), and each thread's `RAG` with the served
    settings and the one mirror of a remote prefix cache (False: the served RAG keeps none)."""

    def rag(index: Index, llm: Generator) -> RAG:
        return RAG(index, llm, system=served.system, generation=served.generation, mode=served.mode,
                   shadow=served.shadow if served.shadow is not None else False, answer=served.answer_mode)

    return Session(served.index, shared(served.llm), rag)


@dataclass
class Worker:
    """What a job gets: the session's one `Index` and this thread's `RAG` over it."""

    index: Index
    rag: RAG
    #: Set when the request of the job running now was abandoned (its client left): a long job
    #: checks it between steps and raises `Abandoned` (see `Workers.run`).
    stop: threading.Event = field(default_factory=threading.Event)


class Abandoned(Exception):
    """A job stopped early because its request was abandoned (`Worker.stop` was set)."""


_Job = tuple[Callable[[Worker], Any], Future[Any], threading.Event]


class Workers:
    """A fixed set of threads running blocking work over one `Session` (see the module header).
    Threads start on first use and stop with :meth:`stop`. ``session``: the server's, shared by
    its pools (default: one of this pool's own over ``served``, :func:`serving`)."""

    def __init__(self, served: RAG, threads: int, session: Session | None = None) -> None:
        if threads < 1:
            raise ValueError(f"workers must be >= 1, got {threads}")
        self.served, self.n = served, threads
        self.session = session if session is not None else serving(served)
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

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

    async def stream(self, job: Callable[[Worker], Iterator[T]]) -> AsyncGenerator[T, None]:
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
        """Let the threads finish their jobs and end (each closes its catalog connection; the
        session's index stays open for its owner to close)."""
        with self._lock:
            threads, self._threads = self._threads, []
        for _ in threads:
            self._jobs.put(None)
        for t in threads:
            t.join(timeout)

    def _loop(self) -> None:
        try:
            while (item := self._jobs.get()) is not None:
                job, fut, stop = item
                if not fut.set_running_or_notify_cancel():
                    continue
                try:
                    rag = self.session.rag()  # the index caught up first (module header)
                    fut.set_result(job(Worker(rag.index, rag, stop)))
                except Exception as exc:  # handed to the waiting request, which answers it
                    fut.set_exception(exc)
        finally:
            self.session.release_thread()
