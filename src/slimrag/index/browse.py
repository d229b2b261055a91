"""Read-only browsing of an index: a chunk shown in its document, and the index's status.

What a citation needs that search does not give: the passage's neighbours (the chunks of the same
source just before and after it, by ordinal), the document it came from and its page; and what a
status panel shows: counts, bytes on disk, when the index last changed, how it stores vectors and
which embedder it uses. Both read the catalog and the folder only: no embedder is loaded, no lock
is taken, so they are as cheap as a SQLite lookup and a few ``stat`` calls.

`stats` (counts and bytes by component, for `slimrag info`) lives here too: it reads the same.
A part of `Index` built on its state (`slimrag.index.state`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from slimrag.errors import NotFoundError, RequestError
from slimrag.index.store import layout
from slimrag.types import Excerpt

if TYPE_CHECKING:
    from slimrag.index.state import IndexState

#: The most neighbours `IndexBrowse.passage` returns on each side; more is a document reader's job.
MAX_AROUND = 20


class IndexBrowse:
    """The browsing methods of `Index` (see the module header); any thread (its own catalog connection)."""

    def __init__(self, state: IndexState) -> None:
        self.state = state

    def passage(self, chunk_id: int, around: int = 1) -> Excerpt:
        """Chunk ``chunk_id`` with up to ``around`` (0..`MAX_AROUND`) chunks of the same source
        before and after it, in reading order. Raises `NotFoundError` (a `KeyError`) for an id
        that is not stored (never assigned, or removed), `RequestError` for a bad ``around``."""
        if not 0 <= around <= MAX_AROUND:
            raise RequestError(f"around must be between 0 and {MAX_AROUND}, got {around}")
        catalog = self.state.catalog
        chunk = catalog.chunks([chunk_id]).get(int(chunk_id))
        if chunk is None:
            raise NotFoundError(f"chunk {chunk_id} is not in this index (never added, or removed since); "
                                "search again for current ids")
        near = catalog.chunks_of(chunk.source, chunk.ordinal - around, chunk.ordinal + around)
        return Excerpt(chunk, before=tuple(c for c in near if c.ordinal < chunk.ordinal),
                       after=tuple(c for c in near if c.ordinal > chunk.ordinal))

    def status(self) -> dict[str, Any]:
        """What a status panel shows: ``documents``, ``chunks``, ``bytes`` (the whole folder on
        disk), ``updated`` (Unix time of the last change: the newest mtime of the manifest, which
        every add and compact replaces, and of the catalog and its WAL, which a remove writes),
        ``storage`` (as configured: flat, slim or auto) and ``gen_kind`` (what the current
        generation is), ``embedder`` (its id), ``path``, and ``embedded`` (chunks with a vector;
        the others await theirs: `slimrag.index.coverage`)."""
        st, m = self.state, self.state.manifest
        counts = st.catalog.counts()
        cov = st.coverage()
        stamps = [t for p in (st.root / layout.MANIFEST, *st.root.glob(layout.CATALOG + "*"))
                  if (t := _mtime(p)) is not None]
        return {
            "path": str(st.root),
            "documents": counts["documents"],
            "chunks": counts["chunks"],
            "bytes": layout.folder_bytes(st.root),
            "updated": max(stamps, default=m.updated),
            "storage": m.storage,
            "gen_kind": m.gen_kind,
            "embedder": m.embedder["id"],
            "embedded": cov.embedded,
        }

    def stats(self) -> dict[str, Any]:
        """Counts, bytes on disk per component, embedder and config, and ``coverage``: the live
        chunks with a vector and those awaiting theirs (`Coverage.to_dict`; ``share`` is what
        ``slimrag info`` prints as embedded)."""
        st, m = self.state, self.state.manifest
        gen = layout.gen_dir(st.root, m.generation)
        gen_files = {p.name: p.stat().st_size for p in sorted(gen.iterdir())}
        cat = sum(p.stat().st_size for p in st.root.glob(layout.CATALOG + "*") if layout.stored(p))
        delta = st.root / layout.DELTA
        return {
            "path": str(st.root),
            "storage": m.storage,
            "gen_kind": m.gen_kind,
            "slim_bytes": st.vectors.generation_bytes(gen),
            "generation": m.generation,
            "counts": {**st.catalog.counts(), "vectors": len(st.vectors),
                       "live_vectors": int(st.vectors.live.sum()), "delta_parts": len(m.delta_parts)},
            "bytes": {"catalog": cat, "generation": sum(gen_files.values()), "generation_files": gen_files,
                      "delta": layout.folder_bytes(delta) if delta.exists() else 0,
                      "total": layout.folder_bytes(st.root)},
            "coverage": st.coverage().to_dict(),
            "embedder": m.embedder,
            "config": m["config"],
        }


def _mtime(path: Path) -> float | None:
    """``path``'s mtime, or None when it is gone (the WAL file vanishes when its last connection closes)."""
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return None
