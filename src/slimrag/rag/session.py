"""`Session`: what a shell keeps for one index folder in one process: the index, the generator and
a `RAG` over them. The CLI's ``ask`` and ``chat`` (`slimrag.cli.asking`), the HTTP server's worker
pools (`slimrag.serve.workers`) and the MCP server's worker (`slimrag.mcp.worker`) hold one each.

Why one object. Each shell used to write out "open the index, build the generator, make a RAG,
reopen when `Index.version` moves" itself, and the server did it once per worker thread: up to
seven open indexes, seven slim searchers, each reopened (its recomputed rows thrown away) on every
``add`` by another process. A session holds instead:

- **one `Index`**, opened once (or given open) and kept current by catching up in place
  (`slimrag.index.follow.FollowedIndex`, `Index.catch_up`): another process's ``add`` maps its new
  delta part, a ``remove`` re-reads the liveness mask, a compaction switches the generation in. The
  index serves every thread at once (`slimrag.index.threads`), so a slim index keeps one searcher
  and one cache of recomputed rows for the whole process;
- **one generator**, given or built on first need by a factory (an MCP session that only searches
  never loads a model), and built once under a lock however many threads ask;
- **a `RAG` per thread**, made once per thread by the session's ``rag`` factory over the one index
  and the one generator (a RAG keeps small per-answer state, its vocabulary cache among it, that
  its thread's catalog connection fills). Making one costs microseconds; nothing is reloaded.

Thread-safety: every method may be called from any thread. `current` and `rag` catch the index up
first (a stat and a pragma when nothing moved); a catch-up waits for searches in flight, and
searches wait for it, for the few milliseconds of a manifest read and a liveness re-read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from slimrag.index.follow import FollowedIndex
from slimrag.llm.base import Generator

if TYPE_CHECKING:
    from slimrag.embed.base import Embedder
    from slimrag.index.core import Index
    from slimrag.rag.pipeline import RAG

#: builds a thread's `RAG` over the session's index and generator
RagFactory = Callable[["Index", "Generator"], "RAG"]


def plain_rag(index: Index, generator: Generator) -> RAG:
    """A `RAG` with the default settings over ``index`` and ``generator``."""
    from slimrag.rag.pipeline import RAG

    return RAG(index, generator)


class Session:
    """One index folder's index, generator and per-thread `RAG` (module header).

    index: the folder (opened on first use, with ``embedder`` if given) or an open `Index`.
    generator: a `Generator`, or a callable that builds one (called once, on the first `generator`
    or `rag`), or None for a session that only searches. rag: builds a thread's `RAG` over the
    index and the generator (default: `plain_rag`)."""

    def __init__(self, index: str | Path | Index, generator: Generator | Callable[[], Generator] | None = None,
                 rag: RagFactory = plain_rag, *, embedder: Embedder | None = None) -> None:
        self._followed = FollowedIndex(index, embedder)
        self._generator = generator if isinstance(generator, Generator) else None
        self._make = generator if not isinstance(generator, Generator) else None
        self._rag_factory = rag
        self._building = threading.Lock()
        self._threads = threading.local()  # this thread's RAG

    @property
    def path(self) -> Path:
        """The index folder."""
        return self._followed.path

    @property
    def index(self) -> Index | None:
        """The open index without a catch-up (None before the first `current`)."""
        return self._followed.index

    def current(self) -> Index:
        """The index, opened on first use and caught up with other processes' writes."""
        return self._followed.current()

    def generator(self) -> Generator:
        """The session's generator, built on first need (once, whichever thread asks first)."""
        if self._generator is None:
            with self._building:
                if self._generator is None:
                    if self._make is None:
                        raise ValueError("this session has no generator: it was opened for searching only")
                    self._generator = self._make()
        return self._generator

    def rag(self) -> RAG:
        """This thread's `RAG` over the current index and the generator (made on the thread's
        first call)."""
        index = self.current()
        held: RAG | None = getattr(self._threads, "rag", None)
        if held is None or held.index is not index:  # a closed and reopened session: a new index
            held = self._threads.rag = self._rag_factory(index, self.generator())
        return held

    def release_thread(self) -> None:
        """Drop this thread's `RAG` and catalog connection (a worker thread that stops)."""
        self._threads.__dict__.pop("rag", None)
        if self._followed.index is not None:
            self._followed.index.release_thread()

    def close(self) -> None:
        """Close the index (the generator is the caller's to keep or drop)."""
        self._followed.close()
