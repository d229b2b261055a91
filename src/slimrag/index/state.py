"""`IndexState`: what an open index holds, in one object that its parts receive.

An `Index` is a state object and five parts built on it (`slimrag.index.core`): the writer, the
query, the checker, the sync and the browser. Each part takes the state (and the checker and the
sync the writer) as constructor arguments and reads nothing else, so no part declares another's
attributes. The state holds:

- ``root``, the folder; ``manifest``, the typed `Manifest` in force; ``catalog``, the SQLite store;
  ``embedder``; ``vectors``, the `VectorStore` of the manifest's generation and delta parts;
- the writer lock of this handle (`locked`), and what keeps the in-memory view current with the
  folder (`refresh`, `reload`, `switch`, `committed`, `stored_text`);
- which live chunks await vectors (`awaiting`, `coverage`: derived from the catalog and the
  vectors, see `slimrag.index.coverage`; cached until either changes).

Keeping current with other writers (`refresh`, on entry to `locked`; see `slimrag.index.writer`):
the manifest is re-read. When another process only appended delta parts (same generation, the
known parts a prefix of the new list), the new parts alone are mapped and appended; any other
change (a compaction) reopens the vectors. A folder replaced whole (a ``build --force`` swapped
in: the catalog file's identity or the manifest's ``created`` stamp differs) reopens every thread's
catalog and the vectors, whatever its generation and parts read like. When only the catalog moved
(another process removed documents: SQLite's ``data_version`` changed), only the liveness mask is
re-read. The writes of this handle update the view themselves (`committed`, `switch`), so a
commit never re-reads what is stored.

Shared by threads (`slimrag.index.threads`): ``catalog`` is the calling thread's own connection
(`ThreadCatalogs`), and the vector view changes (`refresh`, `reload`, `committed`, `stored_text`,
`switch`, `close`) hold `guard` alone while searches hold it shared. A reader that is not writing
keeps current with `catch_up`: a stat of the manifest and a pragma of its thread's connection;
when either moved, `refresh` without the roll-back (a reader may see a writer between its manifest
switch and its catalog commit, which is no interrupted write: the part's rows stay masked until the
commit moves ``data_version``). While this handle holds the writer lock, catch-up waits for the
write's end (the writing thread updates the view itself).

Recovery of an interrupted write (`refresh` again): a write killed between its manifest switch and
its catalog commit leaves a last delta part whose chunks the catalog never received; it is
dropped from the manifest under the lock (`_roll_back_uncommitted`) and listed in ``rolled_back``.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slimrag.catalog import Catalog
from slimrag.config import IndexConfig
from slimrag.embed.base import Embedder
from slimrag.errors import IndexFormatError
from slimrag.index.coverage import Coverage, awaiting_ids, counts_key
from slimrag.index.store import layout, vectors
from slimrag.index.store import manifest as manifest_file
from slimrag.index.store.flat import FlatVectors
from slimrag.index.store.lock import WriterLock
from slimrag.index.store.manifest import Manifest
from slimrag.index.store.vectors import VectorStore
from slimrag.index.threads import ReadWrite, ThreadCatalogs
from slimrag.ingest.chunker import ChunkText
from slimrag.types import Chunk

log = logging.getLogger("slimrag.index")


def embed_input(chunk: Chunk | ChunkText) -> str:
    """The text the embedder sees for a chunk: its heading (when not already at the start) and text.
    One function, so the slim index's recomputation embeds exactly what the build embedded."""
    heading = chunk.metadata.get("heading") or ""
    if heading and not chunk.text.lstrip("# ").startswith(heading):
        return f"{heading}\n{chunk.text}"
    return chunk.text


@dataclass(frozen=True)
class StoredText:
    """Exact embeddings of stored chunks by id, recomputed from their text: the
    `slimrag.index.store.recompute.Recompute` a slim store reranks with, reading the calling
    thread's catalog. An object of its own rather than the bound `IndexState.recompute`: the state
    holds the store, so a bound method would close a reference cycle, and an unclosed index would
    hold its files until a collection."""

    catalogs: ThreadCatalogs
    embedder: Embedder
    batch: int

    def __call__(self, chunk_ids: np.ndarray) -> np.ndarray:
        chunks = self.catalogs.get().chunks(chunk_ids)
        missing = [int(i) for i in chunk_ids if int(i) not in chunks]
        if missing:
            raise IndexFormatError(f"chunks {missing[:5]} are in the index but not in the catalog; run compact()")
        return self.embedder.embed([embed_input(chunks[int(i)]) for i in chunk_ids], batch_size=self.batch)


class IndexState:
    """The state of one open index folder (module header), shared by the threads of a process."""

    def __init__(self, root: Path, manifest: Manifest, embedder: Embedder, catalog: Catalog,
                 lock_wait: float | None = None) -> None:
        self.root = Path(root)
        self.manifest = manifest
        self.embedder = embedder
        self.catalogs = ThreadCatalogs(self.root / layout.CATALOG, catalog)
        #: held shared by searches, alone by every change of the vector view (module header)
        self.guard = ReadWrite()
        #: seconds a write waits for another writer (None: `lock.default_wait()`)
        self.lock_wait = lock_wait
        #: delta parts of interrupted writes this handle dropped from the manifest
        self.rolled_back: list[str] = []
        #: delta parts the manifest names that could not be read when the vectors were loaded
        self.bad_parts: list[str] = []
        self._lock_owner: int | None = None  # the thread inside `locked`
        self._verified_part: str | None = None  # the last delta part known to be committed in the catalog
        # per connection (each thread's: `data_version` values compare on one connection only),
        # its data_version when the liveness mask was last read through it or after
        self._seen_data: weakref.WeakKeyDictionary[Catalog, int] = weakref.WeakKeyDictionary()
        self._seen_file = self._manifest_file()  # (inode, mtime) of the manifest the view follows
        self._catalog_file = self._file_id(layout.CATALOG)
        self._awaiting: tuple[tuple[int, ...], np.ndarray] | None = None  # (key, ids) of `awaiting`
        self.vectors: VectorStore
        self.reload()

    @property
    def config(self) -> IndexConfig:
        """The build configuration recorded in the manifest."""
        return self.manifest.config

    @property
    def catalog(self) -> Catalog:
        """The calling thread's connection to the catalog (`ThreadCatalogs`)."""
        return self.catalogs.get()

    # -- the vector view ------------------------------------------------------------------------
    def reload(self) -> None:
        """Open the vectors of the current manifest from disk (a generation switch, or another
        process's compaction), and read the liveness mask."""
        recompute = StoredText(self.catalogs, self.embedder, self.config.embed_batch)
        with self.guard.writing():
            self.vectors, self.bad_parts = vectors.open_store(self.root, self.manifest, recompute)
            self._read_live()

    def _read_live(self) -> None:
        catalog = self.catalog
        self._seen_data[catalog] = catalog.data_version()  # before the read: a commit in between is seen later
        live = np.asarray(catalog.live_ids(), dtype=np.int64)
        with self.guard.writing():
            self.vectors.set_live(live)

    def close(self) -> None:
        """Close the catalog and let go of the vectors' mappings: a closed index holds no file of
        its folder, even while the object lives on (its searches then raise). Other threads'
        catalogs close at their next use or when their thread ends (`ThreadCatalogs.close`)."""
        with self.guard.writing():
            self.catalogs.close()
            self.vectors = FlatVectors(np.zeros(0, np.int64), np.zeros((0, self.vectors.dim), np.float32))

    def recompute(self, chunk_ids: np.ndarray) -> np.ndarray:
        """Exact embeddings of stored chunks, recomputed from their text (the slim index keeps none)."""
        return StoredText(self.catalogs, self.embedder, self.config.embed_batch)(chunk_ids)

    def awaiting(self) -> np.ndarray:
        """Live chunk ids with no vector row yet, ascending (`slimrag.index.coverage`): what
        `IndexWriter.embed_awaiting` embeds. Cached while the catalog's counts, its largest id,
        the live rows and SQLite's ``data_version`` stay the same."""
        return self._awaiting_now()[1]

    def _awaiting_now(self) -> tuple[tuple[int, ...], np.ndarray]:
        """(key, ids) of `awaiting`, one pair: another thread may replace the cached one meanwhile."""
        catalog = self.catalog
        counts = counts_key(catalog, self.vectors)
        key = (*counts, catalog.data_version())
        held = self._awaiting
        if held is None or held[0] != key:
            held = self._awaiting = (key, awaiting_ids(catalog, self.vectors, counts))
        return held

    def coverage(self) -> Coverage:
        """Live chunks and how many of them have a vector (`Coverage`)."""
        key, ids = self._awaiting_now()
        return Coverage(key[0], key[0] - len(ids))

    def switch(self, manifest: Manifest) -> None:
        """Make ``manifest`` the folder's (atomic replace) and this handle's, and reopen the
        vectors from it (a new generation, or parts dropped or added by a repair)."""
        manifest_file.write(self.root, manifest)
        with self.guard.writing():
            self.manifest = manifest
            self.reload()

    def committed(self, manifest: Manifest, part: str, ids: np.ndarray, replaced: np.ndarray) -> None:
        """After a commit of this handle: ``manifest`` (already written) names the new ``part``
        holding ``ids``; ``replaced`` are the chunk ids the commit deleted. The part is mapped and
        appended, the replaced rows masked: nothing stored earlier is read."""
        with self.guard.writing():
            self.manifest = manifest
            self._verified_part = part
            vectors.append_part(self.vectors, self.root, part, ids)
            self.vectors.kill(replaced)

    def stored_text(self, manifest: Manifest, replaced: np.ndarray) -> None:
        """After a text-only commit of this handle (chunks stored, no vectors: they await
        them): ``manifest`` (already written) is in force, the rows of the ``replaced`` chunks
        are masked."""
        with self.guard.writing():
            self.manifest = manifest
            self.vectors.kill(replaced)

    # -- the writer lock ------------------------------------------------------------------------
    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the writer lock of this index over a ``with`` block, so several writes (adds, a
        remove, a compact) run with no other writer in between. Writes take the lock themselves;
        inside this block they reuse it. Waits up to ``lock_wait`` seconds for another writer, then
        raises `IndexBusyError`. On entry the view is brought up to date (`refresh`). Another
        thread of this handle waits here as another process does (flock: one open file each)."""
        if self._lock_owner == threading.get_ident():  # nested: build -> add -> write, check -> compact, ...
            yield
            return
        lock = WriterLock(self.root, self.lock_wait)
        lock.acquire()
        try:
            with self.guard.writing():  # a catch-up in flight ends first; later ones wait for the write
                self._lock_owner = threading.get_ident()
                self.refresh()
            yield
        finally:
            self._lock_owner = None
            lock.release()

    def refresh(self, roll_back: bool = True) -> None:
        """Catch up with other writers (module header). A small JSON read and a pragma when
        nothing changed. ``roll_back``: drop the parts of interrupted writes (only under the
        writer lock: a reader's `catch_up` passes False)."""
        with self.guard.writing():
            self._seen_file = self._manifest_file()  # before the read: a later switch is seen later
            catalog_file = self._file_id(layout.CATALOG)
            fresh = manifest_file.read(self.root)
            replaced = catalog_file != self._catalog_file or fresh.created != self.manifest.created
            if replaced:  # a ``build --force`` swapped in: its generation and parts may read like
                # the old ones', so nothing of the old view is kept (no part known committed either)
                self._catalog_file, self._verified_part = catalog_file, None
                self.catalogs.renew()
                self._seen_data.clear()
            if roll_back and fresh.delta_parts and fresh.delta_parts[-1] != self._verified_part:
                fresh = self._roll_back_uncommitted(fresh)
            old, self.manifest = self.manifest, fresh
            if replaced:
                self.reload()
            elif fresh == old:
                if self.catalog.data_version() != self._seen_data.get(self.catalog):
                    self._read_live()
            elif (fresh.generation, fresh.gen_kind) == (old.generation, old.gen_kind) \
                    and fresh.delta_parts[:len(old.delta_parts)] == old.delta_parts:
                self.bad_parts += vectors.append_parts(self.vectors, self.root, fresh.delta_parts[len(old.delta_parts):])
                self._read_live()
            else:
                self.reload()

    def catch_up(self) -> bool:
        """For a reader: follow what other processes wrote since the last look (module header),
        in place. A stat and a pragma when nothing moved. True when the manifest file or the
        catalog's ``data_version`` moved and the view was re-read (it may come out the same);
        False when nothing moved, when this handle is writing (its writing thread keeps the view
        current), or when the folder is missing for a moment (between `swap_in`'s two renames:
        the next call catches up). A folder replaced under the handle (a ``build --force``
        swapped in) is reopened whole: every thread's catalog and the vectors (`refresh`)."""
        if self._lock_owner is not None:  # this handle is writing (a backfill step): no hold taken per job
            return False
        catalog = self.catalog
        try:
            if self._manifest_file() == self._seen_file and catalog.data_version() == self._seen_data.get(catalog):
                return False
        except FileNotFoundError:  # between swap_in's renames: nothing moved yet
            return False
        with self.guard.writing():
            if self._lock_owner is not None:  # this handle is writing: its thread keeps the view current
                return False
            try:
                self.refresh(roll_back=False)
            except FileNotFoundError:  # the folder went mid-read: look again, whole, at the next call
                self._seen_file = self._catalog_file = (-1, -1)
                return False
        return True

    def _manifest_file(self) -> tuple[int, int]:
        st = os.stat(self.root / layout.MANIFEST)
        return st.st_ino, st.st_mtime_ns

    def _file_id(self, name: str) -> tuple[int, int]:
        st = os.stat(self.root / name)
        return st.st_dev, st.st_ino

    def _roll_back_uncommitted(self, manifest: Manifest) -> Manifest:
        """Recovery of a write killed between its manifest switch and its catalog commit: the
        manifest names a last delta part whose chunks the catalog never received (neither stored
        nor tombstoned; ids are never reused, so one id decides). Such parts are dropped from the
        manifest (their files are collected by the next compaction), so no vector is left
        without its chunk. Runs under the lock, once per new last part: one small read."""
        dropped = []
        while manifest.delta_parts:
            last = manifest.delta_parts[-1]
            try:
                ids, _ = layout.read_delta_part(self.root / layout.DELTA / last, mmap=True)
            except IndexFormatError:
                break  # missing or unreadable: damage, not an interrupted write; `check(repair=True)` fixes it
            if len(ids) == 0 or self.catalog.has_chunk_id(int(ids.max())):
                break
            dropped.append(last)
            manifest = manifest.changed(delta_parts=manifest.delta_parts[:-1])
        if dropped:
            manifest_file.write(self.root, manifest)
            log.warning("%s: rolled back delta part(s) %s of a write interrupted before its commit",
                        self.root, ", ".join(dropped))
            self.rolled_back += dropped
        self._verified_part = manifest.delta_parts[-1] if manifest.delta_parts else None
        return manifest
