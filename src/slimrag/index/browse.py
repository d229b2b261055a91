"""Read-only browsing of an index: a chunk shown in its document, and the index's status.

What a citation needs that search does not give: the passage's neighbours (the chunks of the same
source just before and after it, by ordinal), the document it came from and its page; and what a
status panel shows: counts, bytes on disk, when the index last changed, how it stores vectors and
which embedder it uses. Both read the catalog and the folder only: no embedder is loaded, no lock
is taken, so they are as cheap as a SQLite lookup and a few ``stat`` calls.

Why a mixin: see `slimrag.index.writer`; the attributes of `Index` it reads are declared below.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slimrag.errors import NotFoundError, RequestError
from slimrag.index import layout
from slimrag.types import Excerpt

if TYPE_CHECKING:
    from slimrag.catalog import Catalog

#: The most neighbours `IndexBrowse.passage` returns on each side; more is a document reader's job.
MAX_AROUND = 20


class IndexBrowse:
    """The browsing methods of `Index` (see the module header). One `Index` per thread."""

    # Set by `Index.__init__`; declared here so this file type-checks on its own.
    root: Path
    catalog: Catalog
    manifest: dict[str, Any]

    def passage(self, chunk_id: int, around: int = 1) -> Excerpt:
        """Chunk ``chunk_id`` with up to ``around`` (0..`MAX_AROUND`) chunks of the same source
        before and after it, in reading order. Raises `NotFoundError` (a `KeyError`) for an id
        that is not stored (never assigned, or removed), `RequestError` for a bad ``around``."""
        if not 0 <= around <= MAX_AROUND:
            raise RequestError(f"around must be between 0 and {MAX_AROUND}, got {around}")
        chunk = self.catalog.chunks([chunk_id]).get(int(chunk_id))
        if chunk is None:
            raise NotFoundError(f"chunk {chunk_id} is not in this index (never added, or removed since); "
                                "search again for current ids")
        near = self.catalog.chunks_of(chunk.source, chunk.ordinal - around, chunk.ordinal + around)
        return Excerpt(chunk, before=tuple(c for c in near if c.ordinal < chunk.ordinal),
                       after=tuple(c for c in near if c.ordinal > chunk.ordinal))

    def status(self) -> dict[str, Any]:
        """What a status panel shows: ``documents``, ``chunks``, ``bytes`` (the whole folder on
        disk), ``updated`` (Unix time of the last change: the newest mtime of the manifest, which
        every add and compact replaces, and of the catalog and its WAL, which a remove writes),
        ``storage`` (as configured: flat, slim or auto) and ``gen_kind`` (what the current
        generation is), ``embedder`` (its id) and ``path``."""
        counts = self.catalog.counts()
        stamps = [t for p in (self.root / layout.MANIFEST, *self.root.glob(layout.CATALOG + "*"))
                  if (t := _mtime(p)) is not None]
        return {
            "path": str(self.root),
            "documents": counts["documents"],
            "chunks": counts["chunks"],
            "bytes": _bytes_on_disk(self.root),
            "updated": max(stamps, default=float(self.manifest.get("updated", 0.0))),
            "storage": self.manifest["storage"],
            "gen_kind": self.manifest.get("gen_kind", "flat"),
            "embedder": self.manifest["embedder"]["id"],
        }


def _mtime(path: Path) -> float | None:
    """``path``'s mtime, or None when it is gone (the WAL file vanishes when its last connection closes)."""
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return None


def _bytes_on_disk(root: Path) -> int:
    """Total size of the files under ``root``. A file or folder that a concurrent compaction's
    garbage collection deletes while it is counted is skipped (`os.walk` ignores a folder that
    vanished), so a status never fails for that; the total is then off by what was being freed."""
    total = 0
    for folder, _, names in os.walk(root):
        for name in names:
            try:
                total += os.stat(os.path.join(folder, name), follow_symlinks=False).st_size
            except FileNotFoundError:
                continue
    return total
