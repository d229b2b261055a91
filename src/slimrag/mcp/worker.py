"""`IndexWorker`: the one thread that runs the MCP server's tools on its `Session`.

Why one thread: the MCP SDK runs each synchronous tool on whichever worker thread anyio picks, in
no set order; an agent expects its calls answered in the order it made them (an ``add_paths``
in place before the ``search`` sent after it). So every tool hands its work to this single thread
and waits for it, and calls are served one at a time, in order. A long ``ask`` therefore delays a
``search`` that arrives during it; an agent calls tools one after another, so serving them in
order costs nothing in practice.

What it keeps between calls, in one `Session` (`slimrag.rag.session`), so each is paid once:

- the index, opened at start and kept current by catching up before each call (another
  process's ``slimrag add`` in a shell is mapped in place, nothing reopened); its embedder is
  loaded right after, on this thread, while the client is still initializing (the first search
  then does not wait for it);
- the generator, built and loaded on the first ``ask`` only (`slimrag.llm.backends`: the
  embedded model takes seconds to load; a search-only session never pays for it);
- the `RAG` over both.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from slimrag.rag.session import Session

if TYPE_CHECKING:
    from slimrag.index.core import Index
    from slimrag.llm.base import Generator
    from slimrag.rag.pipeline import RAG

T = TypeVar("T")

log = logging.getLogger("slimrag.mcp")


def _generator(spec: dict[str, Any]) -> Generator:
    """The generator ``spec`` names, loaded (the session calls it on the first ``ask``)."""
    from slimrag.llm.backends import make_generator

    options = dict(spec)
    generator = make_generator(options.pop("llm"), **options)
    generator.load()
    return generator


def _rag(index: Index, generator: Generator, *, max_tokens: int) -> RAG:
    from slimrag.rag.pipeline import RAG, default_generation

    return RAG(index, generator, generation=default_generation(generator, max_tokens))


def _log_failure(future: Future[None]) -> None:
    exc = future.exception()
    if exc is not None:
        log.warning("loading the embedder failed: %s; searches that need it will fail the same way", exc)


class IndexWorker:
    """Runs callables against the session's `Index` on one dedicated thread (module header).

    path: the index folder. llm: the generator's spec for `make_generator` (``{"llm": None}`` for
    the embedded model, or ``{"llm": URL, "model": ..., "api_key": ...}``). max_tokens: the
    longest answer. Opening fails here, in the caller, when ``path`` is not an index.
    """

    def __init__(self, path: str | Path, llm: dict[str, Any], max_tokens: int) -> None:
        self.path = Path(path)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="slimrag-mcp")
        # module functions, not bound methods: the session refers to nothing that refers back to it
        self.session = Session(self.path, functools.partial(_generator, dict(llm)),
                               functools.partial(_rag, max_tokens=max_tokens))
        self._pool.submit(self.session.current).result()
        # Not waited for: the first call queues behind it. A failure is logged here and met again,
        # with its message, by the first call that needs the embedder.
        self._pool.submit(lambda: self.session.current().load_embedder()).add_done_callback(_log_failure)

    def call(self, fn: Callable[[Index], T]) -> T:
        """``fn(index)`` run on the worker thread, on the index caught up; its result, or its
        exception re-raised here."""
        return self._pool.submit(lambda: fn(self.session.current())).result()

    def rag(self) -> RAG:
        """The RAG over the current index, building the generator on first use. Only for
        callables running on the worker thread (inside `call`)."""
        return self.session.rag()

    def close(self) -> None:
        """Close the index and stop the thread."""
        self._pool.submit(self.session.close).result()
        self._pool.shutdown(wait=True)
