"""`FollowedIndex`: one read handle on an index folder that follows what other processes write.

Why. The router's planner (`slimrag.route.planner`) and the MCP server's worker
(`slimrag.mcp.worker`) each keep one `Index` open on a thread of their own, while ``slimrag add``
in a shell may change the folder beside them. Before each use the index's version token
(`Index.version`: the manifest's inode and mtime, the catalog's SQLite ``data_version``) is compared
with the one seen after the last (re)open; when it moved, the index is reopened with the same
embedder object, so the model is not loaded again. A check costs a stat and a pragma.

Not thread-safe: call it from the one thread that owns the handle (an `Index`'s SQLite connection
belongs to the thread that opened it).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slimrag.index.core import Index


class FollowedIndex:
    """The index at ``path``, opened on first use and reopened when another process changed it."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._index: Index | None = None
        self._seen: tuple[int, int, int] | None = None

    @property
    def index(self) -> Index | None:
        """The handle as last opened, without a version check (for code already running on it)."""
        return self._index

    def current(self) -> Index:
        """The index, (re)opened first when it is not open or its version moved since."""
        if self._index is None or self._index.version() != self._seen:
            self._reopen()
        assert self._index is not None
        return self._index

    def mark_seen(self) -> None:
        """Take the present version as seen: a write through this handle moved the token without
        making the handle stale (a writer re-reads the manifest under the lock)."""
        if self._index is not None:
            self._seen = self._index.version()

    def close(self) -> None:
        """Close the handle (a later `current` opens it again)."""
        if self._index is not None:
            self._index.close()
            self._index = None

    def _reopen(self) -> None:
        from slimrag.index.core import Index  # the facade's imports: only once a handle is wanted

        old = self._index
        self._index = Index.open(self.path, embedder=old.embedder if old is not None else None)
        if old is not None:
            old.close()
        self._seen = self._index.version()
