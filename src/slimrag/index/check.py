"""`Index.check`: does every live chunk have exactly one vector, and every vector its chunk?

The catalog (chunks) and the vector files (a generation plus delta parts, named by the manifest)
are two stores switched one after the other, so their agreement is the index's main invariant.
The check, run under the writer lock (a stable state, and the recovery of an interrupted write
already applied, see `IndexState.refresh`):

- reads the chunk ids of every vector row: the generation's ``ids.npy`` and each delta part
  (a part that is missing or unreadable is listed in ``bad_parts``);
- compares them with the catalog's live chunk ids and tombstones:
  ``missing``: live chunks with no vector row, *awaiting vectors* (`slimrag.index.coverage`): a
  state, not a problem. A build stores all text before it embeds, and an interrupted write (Ctrl-C,
  SIGKILL) leaves its stored chunks so; keyword search finds them, hybrid search covers them
  (`slimrag.index.query`), and the next `add`, `sync`, ``build --resume`` or ``check --repair``
  embeds them. (A bad part's chunks are awaiting vectors too, its part being the problem);
  ``duplicates``: live chunks with more than one row (returned twice);
  ``orphans``: rows whose chunk is neither stored nor removed since the last compaction;
  ``tombstoned``: rows of removed chunks, masked, dropped by the next compaction (normal);
- runs SQLite's ``integrity_check`` and the keyword index's own check (``sqlite_errors``).

Repair (``repair=True``, still under the lock; it also runs when the only finding is chunks
awaiting vectors): bad parts leave the manifest; chunks awaiting vectors are embedded from their
stored text into a new delta part; duplicates and orphans are dropped by a
compaction (which keeps one row per live chunk); a disagreeing keyword index is rebuilt from the
chunks table. Damage inside SQLite's own pages cannot be repaired here: rebuild the index. The
report of the state found carries a `Repair` with what was done and the state after it.

A part of `Index` (`slimrag.index.state`): built on the open index's state and its writer, whose
compaction a repair runs.

Cost: reads every id array (4 bytes a row at most) and the catalog's ids; the integrity checks
read the whole SQLite file. Seconds for a million chunks; meant for tests, after crashes, and cron.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from slimrag.catalog.keyword import KeywordDamage
from slimrag.errors import IndexFormatError
from slimrag.index.state import embed_input
from slimrag.index.store import layout

if TYPE_CHECKING:
    from slimrag.index.state import IndexState
    from slimrag.index.writer import IndexWriter

log = logging.getLogger("slimrag.index")


@dataclass(frozen=True)
class Repair:
    """What ``check(repair=True)`` did, and the state it left."""

    dropped_parts: tuple[str, ...] = ()
    reembedded: int = 0
    compacted: bool = False
    rebuilt_keyword_index: bool = False
    after: CheckReport | None = None


@dataclass(frozen=True)
class CheckReport:
    """The agreement of an index's catalog and vectors (see the module header for each field)."""

    chunks: int
    vector_rows: int
    missing: tuple[int, ...] = ()
    duplicates: tuple[int, ...] = ()
    orphans: tuple[int, ...] = ()
    tombstoned: int = 0
    bad_parts: tuple[str, ...] = ()
    sqlite_errors: tuple[str, ...] = ()
    #: delta parts of an interrupted write that taking the lock rolled back (recovery, not damage)
    rolled_back: tuple[str, ...] = ()
    repair: Repair | None = field(default=None)

    @property
    def ok(self) -> bool:
        """No live chunk has two vectors, no vector lacks its chunk, every delta part reads, SQLite
        is sound. Chunks awaiting vectors (``missing``) are a state, not a problem: see `awaiting`."""
        return not (self.duplicates or self.orphans or self.bad_parts or self.sqlite_errors)

    @property
    def awaiting(self) -> int:
        """Live chunks awaiting vectors (``len(missing)``): searchable by keyword, embedded by the
        next add, sync, ``build --resume`` or ``check --repair``."""
        return len(self.missing)

    def problems(self) -> list[str]:
        """One line per kind of problem, for people (empty when `ok`)."""
        def ids(xs: tuple[int, ...]) -> str:
            return ", ".join(map(str, xs[:10])) + (", ..." if len(xs) > 10 else "")
        out = []
        if self.bad_parts:
            out.append(f"{len(self.bad_parts)} delta part(s) missing or unreadable: {', '.join(self.bad_parts)}")
        if self.duplicates:
            out.append(f"{len(self.duplicates)} live chunk(s) with more than one vector: {ids(self.duplicates)}")
        if self.orphans:
            out.append(f"{len(self.orphans)} vector(s) without a chunk: {ids(self.orphans)}")
        out += [f"sqlite: {e}" for e in self.sqlite_errors]
        return out


class IndexChecker:
    """The `check` method of `Index` (see the module header)."""

    def __init__(self, state: IndexState, writer: IndexWriter) -> None:
        self.state = state
        self.writer = writer

    def check(self, repair: bool = False) -> CheckReport:
        """Check that catalog and vectors agree (and SQLite's integrity); with ``repair``, fix what
        was found and embed chunks awaiting vectors (see the module header). Holds the writer lock, so it waits for a writer busy
        with the index (`IndexBusyError` after ``lock_wait``). Returns the state found; with
        ``repair`` its ``repair.after`` is the state left."""
        st = self.state
        before = len(st.rolled_back)
        with st.locked():
            found = self._inspect(tuple(st.rolled_back[before:]))
            if not repair or (found.ok and not found.missing):
                return found
            done = self._repair(found)
            return CheckReport(**{**found.__dict__, "repair": done})

    def _inspect(self, rolled_back: tuple[str, ...] = ()) -> CheckReport:
        st = self.state
        gen = layout.read_generation(st.root, st.manifest.generation)
        id_parts = [np.asarray(gen["ids"], dtype=np.int64)]
        bad: list[str] = []
        for name in st.manifest.delta_parts:
            try:
                id_parts.append(layout.read_delta_part(st.root / layout.DELTA / name, mmap=True)[0])
            except IndexFormatError:
                bad.append(name)
        rows = np.concatenate(id_parts)
        uniq, counts = np.unique(rows, return_counts=True)
        live = np.asarray(st.catalog.live_ids(), dtype=np.int64)
        dead = np.asarray(st.catalog.tombstone_ids(), dtype=np.int64)
        return CheckReport(
            chunks=len(live), vector_rows=len(rows),
            missing=_ints(np.setdiff1d(live, uniq)),
            duplicates=_ints(np.intersect1d(uniq[counts > 1], live)),
            orphans=_ints(np.setdiff1d(uniq, np.union1d(live, dead))),
            tombstoned=int(np.isin(rows, dead).sum()),
            bad_parts=tuple(bad), sqlite_errors=tuple(st.catalog.integrity_errors()),
            rolled_back=rolled_back)

    def _repair(self, found: CheckReport) -> Repair:
        st = self.state
        rebuilt = any(isinstance(e, KeywordDamage) for e in found.sqlite_errors)
        if rebuilt:
            st.catalog.rebuild_keyword_index()
        if found.bad_parts:
            st.switch(st.manifest.changed(delta_parts=[p for p in st.manifest.delta_parts
                                                       if p not in found.bad_parts]))
        missing = self._inspect().missing  # bad parts' chunks are missing now
        if missing:
            self._reembed(missing)
        compacted = bool(found.duplicates or found.orphans)
        if compacted:
            self.writer.compact()
        after = self._inspect()
        log.warning("%s: repaired: %d part(s) dropped, %d chunk(s) embedded%s%s; %s", st.root,
                    len(found.bad_parts), len(missing), ", compacted" if compacted else "",
                    ", keyword index rebuilt" if rebuilt else "", "clean" if after.ok else "; ".join(after.problems()))
        return Repair(tuple(found.bad_parts), len(missing), compacted, rebuilt, after)

    def _reembed(self, chunk_ids: tuple[int, ...]) -> None:
        """Embed the stored text of ``chunk_ids`` into one new delta part (as `add` would have)."""
        st = self.state
        chunks = st.catalog.chunks(list(chunk_ids))
        vecs = st.embedder.embed([embed_input(chunks[i]) for i in chunk_ids], batch_size=st.config.embed_batch)
        seq = layout.next_part(st.root, st.manifest.next_part)
        part = layout.write_delta_part(st.root, seq, np.asarray(chunk_ids, np.int64), vecs.astype(st.config.dtype))
        st.switch(st.manifest.changed(delta_parts=(*st.manifest.delta_parts, part), next_part=seq + 1))


def _ints(a: np.ndarray) -> tuple[int, ...]:
    return tuple(int(x) for x in a)
