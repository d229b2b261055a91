"""`FollowedIndex`: the one `Index` a long-running process keeps open on a folder, kept current
with what other processes write.

Why. A server (`slimrag.rag.session`, under ``serve`` and ``mcp``) and the router's planner
(`slimrag.route.planner`) each keep an index open for their whole life, while ``slimrag add`` in a
shell may change the folder beside them. Reopening on every change threw away what an open index
has built up (a slim index's cache of recomputed rows, the catalog's decoded blocks) and made a
server open one index per worker thread. Instead the index is opened once, on first use (or given
open), and `current` catches it up in place (`Index.catch_up`: a stat and a pragma when nothing
moved; new delta parts mapped, removals masked, a compaction's generation switched in when
something did). A folder rebuilt with another embedder (``build --force``; its manifest's
embedder record differs) is the one case that reopens: the index is closed and opened again.

Thread-safe: `current` may be called from any thread (the open is guarded by a lock; an `Index`
serves many threads, `slimrag.index.threads`).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slimrag.embed.base import Embedder
    from slimrag.index.core import Index


class FollowedIndex:
    """The index at ``path`` (or the open ``index`` given), opened on first use and caught up
    with other processes' writes before each use."""

    def __init__(self, path: str | Path | Index, embedder: Embedder | None = None) -> None:
        self._index: Index | None = None
        if isinstance(path, (str, Path)):
            self.path = Path(path)
        else:
            self._index, self.path = path, path.root
        #: the embedder record of the open index's manifest when it was opened
        self._record: dict[str, Any] | None = None if self._index is None else self._index.manifest.embedder
        self._embedder = embedder
        self._opening = threading.Lock()

    @property
    def index(self) -> Index | None:
        """The handle, without a catch-up (None before the first `current`)."""
        return self._index

    def current(self) -> Index:
        """The index, opened first when it is not open, then caught up (`Index.catch_up`)."""
        index = self._index
        if index is None:
            with self._opening:
                if self._index is None:
                    from slimrag.index.core import Index  # the facade's imports: only once a handle is wanted

                    self._index = Index.open(self.path, embedder=self._embedder)
                    self._record = self._index.manifest.embedder
                return self._index
        if index.catch_up() and index.manifest.embedder != self._record:
            # the folder was rebuilt with another embedder (``build --force``): the open handle's
            # embedder no longer matches its vectors; open the new index and close the old one
            with self._opening:
                if self._index is index:
                    self._index = None
                    index.close()
            return self.current()
        return index

    def close(self) -> None:
        """Close the handle (a later `current` opens it again)."""
        with self._opening:
            if self._index is not None:
                self._index.close()
                self._index = None
