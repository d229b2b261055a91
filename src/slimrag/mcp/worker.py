"""`IndexWorker`: the one thread that holds the MCP server's open index (and, once asked, its RAG).

Why a thread of its own: an `Index` is not thread-safe and its SQLite connection belongs to the
thread that opened it, while the MCP SDK runs each synchronous tool on whichever worker thread
anyio picks. So every tool hands its work to this single thread and waits for it; calls are
served one at a time, in order. A long ``ask`` therefore delays a ``search`` that arrives during
it; an agent calls tools one after another, so serving them in order costs nothing in practice.

What it keeps between calls, so each is paid once:

- the index, opened at start; its embedder is loaded right after, on this thread, while the
  client is still initializing (the first search then does not wait for it);
- the generator, built and loaded on the first ``ask`` only (`slimrag.llm.backends`: the
  embedded model takes seconds to load; a search-only session never pays for it);
- the `RAG` over both.

Changes by another process (``slimrag add`` in a shell) are picked up the way the HTTP server's
workers do: before each call `Index.version()` is compared with the token seen after the last
one, and when it moved the index is reopened with the same embedder object (no model reload)
and the RAG rebuilt over it with the same generator.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from slimrag.index.follow import FollowedIndex

if TYPE_CHECKING:
    from slimrag.index.core import Index
    from slimrag.llm.base import Generator
    from slimrag.rag.pipeline import RAG

T = TypeVar("T")

log = logging.getLogger("slimrag.mcp")


def _log_failure(future: Future[None]) -> None:
    exc = future.exception()
    if exc is not None:
        log.warning("loading the embedder failed: %s; searches that need it will fail the same way", exc)


class IndexWorker:
    """Runs callables against one open `Index` on one dedicated thread (see the module header).

    path: the index folder. llm: the generator's spec for `make_generator` (``{"llm": None}`` for
    the embedded model, or ``{"llm": URL, "model": ..., "api_key": ...}``). max_tokens: the
    longest answer. Opening fails here, in the caller, when ``path`` is not an index.
    """

    def __init__(self, path: str | Path, llm: dict[str, Any], max_tokens: int) -> None:
        self.path = Path(path)
        self._spec = dict(llm)
        self._max_tokens = max_tokens
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="slimrag-mcp")
        self._followed = FollowedIndex(self.path)
        self._generator: Generator | None = None
        self._rag: RAG | None = None
        self._pool.submit(self._followed.current).result()
        # Not waited for: the first call queues behind it. A failure is logged here and met again,
        # with its message, by the first call that needs the embedder.
        self._pool.submit(self._warm).add_done_callback(_log_failure)

    def _warm(self) -> None:
        self._followed.current().embedder.load()

    def _run(self, fn: Callable[[Index], T], writes: bool) -> T:
        idx = self._followed.current()
        try:
            return fn(idx)
        finally:
            # Our own write moved the token without making this handle stale (a writer re-reads
            # the manifest under the lock, so it also took in any earlier outside write). After a
            # read the token is left as it was: an outside write during it is seen next call.
            if writes:
                self._followed.mark_seen()

    def call(self, fn: Callable[[Index], T], *, writes: bool = False) -> T:
        """``fn(index)`` run on the worker thread; its result, or its exception re-raised here.
        ``writes``: ``fn`` changes the index (see `_run`)."""
        return self._pool.submit(self._run, fn, writes).result()

    def rag(self) -> RAG:
        """The RAG over the current index, building the generator on first use. Only for
        callables running on the worker thread (inside `call`)."""
        from slimrag.llm.backends import make_generator
        from slimrag.rag.pipeline import RAG, default_generation

        index = self._followed.index
        assert index is not None, "called inside `call`, on the open index"
        if self._generator is None:
            options = dict(self._spec)
            generator = make_generator(options.pop("llm"), **options)
            generator.load()
            self._generator = generator
        if self._rag is None or self._rag.index is not index:  # rebuilt over a reopened index
            self._rag = RAG(index, self._generator,
                            generation=default_generation(self._generator, self._max_tokens))
        return self._rag

    def close(self) -> None:
        """Close the index and stop the thread."""
        self._pool.submit(self._followed.close).result()
        self._pool.shutdown(wait=True)
