"""The write path of an `Index`: add, write, remove, compact.

Every write follows the same path (see `slimrag.index.layout` for the on-disk rules):
read and hash files → skip unchanged ones → parse and chunk → embed in batches → in one SQLite
transaction: replace changed documents, insert chunks → write a delta part → switch the manifest
→ commit. `Index.build` is "create an empty index, add, compact", so a build and an incremental
add share one code path and one set of tests. Everything from "skip unchanged" on is
`IndexWriter.write`, which also takes documents chunked and embedded elsewhere
(`slimrag.index.distributed` feeds it from a Ray cluster), so dedup, chunk ids and crash safety
do not depend on where the work ran.

One writer at a time: every write operation (`write`/`add`, `remove`, `compact`, and `build`
and `check(repair=True)` around them) holds the index's writer lock (`slimrag.index.lock`: an OS
file lock, released by the kernel if the process dies) and, right after taking it, re-reads the
manifest (reloading the vector view when another writer changed it, or only the liveness mask when
another writer removed documents). Chunk ids, delta part numbers and the vectors a compaction
keeps therefore always come from the current state, never from the one this handle opened. A
second writer waits (`Index.lock_wait`, default `lock.DEFAULT_WAIT_S`) and then raises
`IndexBusyError`; `locked()` holds the lock across several writes. Searches take no lock.

Removed chunks are masked at once (tombstones in the catalog) and their vectors stay on disk
until `compact` writes a generation holding only live vectors. A slim generation is updated, not
rebuilt (`slimrag.index.slim.update`: new rows inserted into the graph, few rows re-embedded);
``compact(rebuild=True)`` rebuilds it from every live vector, re-embedding them all.

Knobs: `AUTO_COMPACT_SHARE` (default 0.05): a write compacts a slim index once its delta rows
reach this share of its graph rows (see `_auto_compact`; 0 turns the policy off).
`COMMIT_CHUNKS` (default 2048) chunks per transaction. It bounds the memory of an add over
a big folder (texts and vectors of one transaction are held at once, ~3 MB of float32 at d=384)
and how much an interrupted add loses; smaller values write more, smaller delta parts.

Why a mixin: `Index` stays the one object callers hold, each public method keeps one signature
and one docstring (a delegating helper would repeat both), and this file holds only the write
path. The mixin is not used on its own; the attributes of `Index` it reads are declared below.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from slimrag import files
from slimrag.errors import IndexFormatError
from slimrag.index import layout
from slimrag.index.lock import WriterLock
from slimrag.index.progress import current_tracker
from slimrag.index.report import AddReport
from slimrag.index.slim import SlimConfig, build_slim
from slimrag.index.sources import Removal, match_sources
from slimrag.ingest.chunker import Chunker, ChunkText, default_chunker
from slimrag.ingest.crawl import Skipped
from slimrag.ingest.outcome import ADDED, UNCHANGED, UPDATED
from slimrag.ingest.source import InputItem, Inputs, PreparedDoc, iter_inputs, prepare
from slimrag.types import Chunk, Document

if TYPE_CHECKING:
    from slimrag.catalog import Catalog
    from slimrag.config import IndexConfig
    from slimrag.embed.base import Embedder
    from slimrag.index.flat import FlatVectors
    from slimrag.index.slim.store import SlimVectors

log = logging.getLogger("slimrag.index")

#: chunks embedded and committed per transaction during add/build; bounds memory for big folders
COMMIT_CHUNKS = 2048
#: a write compacts a slim index once its delta holds this share of the graph's rows (0: never)
AUTO_COMPACT_SHARE = 0.05

_Pending = tuple[Document, bool, list[Chunk], np.ndarray | None]  # doc, replaces a stored one, chunks, vectors


def embed_input(chunk: Chunk | ChunkText) -> str:
    """The text the embedder sees for a chunk: its heading (when not already at the start) and text.
    One function, so the slim index's recomputation embeds exactly what the build embedded."""
    heading = chunk.metadata.get("heading") or ""
    if heading and not chunk.text.lstrip("# ").startswith(heading):
        return f"{heading}\n{chunk.text}"
    return chunk.text


class IndexWriter:
    """The write methods of `Index` (see the module header). Not thread-safe: one writer per index."""

    # Set by `Index.__init__`; declared here so this file type-checks on its own.
    root: Path
    manifest: dict[str, Any]
    config: IndexConfig
    catalog: Catalog
    embedder: Embedder
    vectors: FlatVectors | SlimVectors
    _chunker: Chunker | None
    _load_vectors: Callable[[], None]
    #: seconds a write waits for another writer (None: `lock.default_wait()`); set per `Index`
    lock_wait: float | None
    _lock: WriterLock | None  # held while a write operation of this handle runs
    _seen_data: int  # the catalog's data_version when the liveness mask was last read
    _verified_part: str | None  # the last delta part known to be committed in the catalog
    #: delta parts of interrupted writes this handle dropped from the manifest (see `_refresh`)
    rolled_back: list[str]

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the writer lock of this index over a ``with`` block, so several writes (adds, a
        remove, a compact) run with no other writer in between. Writes take the lock themselves;
        inside this block they reuse it. Waits up to ``lock_wait`` seconds for another writer, then
        raises `IndexBusyError`. On entry the manifest is re-read (see the module header)."""
        if self._lock is not None:  # nested: build -> add -> write, check -> compact, ...
            yield
            return
        lock = WriterLock(self.root, self.lock_wait)
        lock.acquire()
        self._lock = lock
        try:
            self._refresh()
            yield
        finally:
            self._lock = None
            lock.release()

    def _refresh(self) -> None:
        """Catch up with other writers: reload the vectors when the manifest changed, else only
        the liveness mask when another connection committed to the catalog (a remove). A small
        JSON read and a pragma when nothing changed."""
        fresh = layout.read_manifest(self.root)
        if fresh["delta_parts"] and fresh["delta_parts"][-1] != self._verified_part:
            fresh = self._roll_back_uncommitted(fresh)
        if fresh != self.manifest:
            self.manifest = fresh
            self._load_vectors()
        elif self.catalog.data_version() != self._seen_data:
            self._seen_data = self.catalog.data_version()
            self.vectors.set_live(np.asarray(self.catalog.live_ids(), dtype=np.int64))

    def _roll_back_uncommitted(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Recovery of a write killed between its manifest switch and its catalog commit: the
        manifest names a last delta part whose chunks the catalog never received (neither stored
        nor tombstoned; ids are never reused, so one id decides). Such parts are dropped from the
        manifest (their files are collected by the next compaction), so no vector is left
        without its chunk. Runs under the lock, once per new last part: one small read."""
        dropped = []
        while manifest["delta_parts"]:
            last = manifest["delta_parts"][-1]
            try:
                ids, _ = layout.read_delta_part(self.root / layout.DELTA / last)
            except IndexFormatError:
                break  # missing or unreadable: damage, not an interrupted write; `check(repair=True)` fixes it
            if len(ids) == 0 or self.catalog.has_chunk_id(int(ids.max())):
                break
            dropped.append(last)
            manifest = {**manifest, "delta_parts": manifest["delta_parts"][:-1], "updated": time.time()}
        if dropped:
            files.write_json_atomic(self.root / layout.MANIFEST, manifest)
            log.warning("%s: rolled back delta part(s) %s of a write interrupted before its commit",
                        self.root, ", ".join(dropped))
            self.rolled_back += dropped
        self._verified_part = manifest["delta_parts"][-1] if manifest["delta_parts"] else None
        return manifest

    @property
    def chunker(self) -> Chunker:
        """The chunker of this index's ``chunk_tokens``/``chunk_overlap``, made on first use."""
        if self._chunker is None:
            self._chunker = default_chunker(self.config.chunk_tokens, self.config.chunk_overlap)
        return self._chunker

    def add(self, inputs: Inputs) -> AddReport:
        """Add or update documents. Unchanged files (same content hash at the same source) are
        skipped; changed ones are replaced. Bad files are skipped with one warning each."""
        report = AddReport()
        return self.write(self._prepare(inputs, report), report)

    def _prepare(self, inputs: Inputs, report: AddReport) -> Iterator[PreparedDoc]:
        """Read, hash and chunk inputs lazily; an unchanged document is passed on unparsed. Under
        a progress display (`slimrag.index.progress`) the crawl is listed first, for its total."""
        root = Path(self.manifest["source_root"]) if self.manifest.get("source_root") else None
        tracker = current_tracker()
        items: Iterable[InputItem] = iter_inputs(inputs, root, self.config.ignore,
                                                 self.config.max_file_bytes, report.skipped)
        if tracker.counts_files:
            items = list(items)
            tracker.start(len(items) + len(report.skipped), done=len(report.skipped))
        for item in items:
            doc = prepare(item, self.stored_doc_id(item.source), self.chunker)
            if isinstance(doc, Skipped):
                report.skip(doc.source, doc.reason, doc.kind)
                tracker.file()
            else:
                tracker.file(len(doc.pieces))
                yield doc

    def stored_doc_id(self, source: str) -> str | None:
        """The content hash stored for ``source``, or None when it is not in the index."""
        old = self.catalog.document(source)
        return old.doc_id if old is not None else None

    def write(self, docs: Iterable[PreparedDoc], report: AddReport | None = None) -> AddReport:
        """Store prepared documents: the write path of `add`, public for ingest that parses and
        embeds elsewhere. A document whose ``doc_id`` is already stored at its source is counted
        unchanged; one stored with another hash is replaced; a source given twice is taken once.
        Documents are committed in transactions of about `COMMIT_CHUNKS` chunks, chunk ids given
        in input order; ``docs`` is consumed lazily, so a producer can stream. If the iterator
        raises, what was committed stays and the rest is not written (as for an interrupted add).
        Raises ValueError for vectors of the wrong shape. Holds the writer lock throughout: which
        documents are unchanged, and the chunk ids given, are decided against the current state."""
        with self.locked():
            report = self._write(docs, report)
            self._auto_compact()
            return report

    def _auto_compact(self) -> None:
        """The automatic compaction policy of `write` (and `add`): a slim index whose delta rows
        reach `AUTO_COMPACT_SHARE` of its graph rows is compacted at once. Delta rows are exact
        float32 vectors, ~20x the bytes of a graph row (1,536 against ~76 at d=384), so at 5% the
        index is ~1.9x its compact size; the incremental update that folds them in re-embeds at
        most 2% of the rows (`slimrag.index.slim.update`), so compacting early costs little."""
        if (AUTO_COMPACT_SHARE and self.manifest.get("gen_kind") == "slim"
                and cast("SlimVectors", self.vectors).delta_share >= AUTO_COMPACT_SHARE):
            self._compact()

    def _write(self, docs: Iterable[PreparedDoc], report: AddReport | None) -> AddReport:
        t0 = time.perf_counter()
        report = report if report is not None else AddReport()
        dim = int(self.manifest["embedder"]["dim"])
        pending: list[_Pending] = []
        n_pending = 0
        next_id = max(self.manifest["next_chunk_id"], self.catalog.max_chunk_id() + 1)
        seen: set[str] = set()
        for d in docs:
            if d.source in seen:
                continue
            seen.add(d.source)
            old_id = self.stored_doc_id(d.source)
            if old_id == d.doc_id:
                report.note(UNCHANGED, d.source)
                continue
            if not d.pieces:
                report.skip(d.source, "no text")
                continue
            if d.vectors is not None and d.vectors.shape != (len(d.pieces), dim):
                raise ValueError(f"{d.source}: vectors of shape {d.vectors.shape}, expected "
                                 f"({len(d.pieces)}, {dim}) (one row per piece, this index's embedder)")
            chunks = [Chunk(next_id + i, d.doc_id, d.source, i, p.text, {**p.metadata, "ordinal": i})
                      for i, p in enumerate(d.pieces)]
            next_id += len(chunks)
            pending.append((Document(d.doc_id, d.source, d.mtime, d.size), old_id is not None, chunks, d.vectors))
            n_pending += len(chunks)
            if n_pending >= COMMIT_CHUNKS:
                self._commit(pending, next_id, report)
                pending, n_pending = [], 0
        if pending:
            self._commit(pending, next_id, report)
        report.seconds += time.perf_counter() - t0
        return report

    def _commit(self, docs: list[_Pending], next_id: int, report: AddReport) -> None:
        """One transaction: embed what has no vectors, store documents and chunks, write a delta
        part, switch the manifest, commit. A failure rolls the catalog back; the delta part it
        may leave is named by no manifest and collected later."""
        chunks = [c for _, _, cs, _ in docs for c in cs]
        todo = [embed_input(c) for _, _, cs, v in docs if v is None for c in cs]
        tracker = current_tracker()
        fresh = tracker.embed(self.embedder, todo, self.config.embed_batch) if todo else None
        tracker.chunks(len(chunks) - len(todo))  # given vectors (Ray ingest): done without embedding
        parts, used = [], 0
        for _, _, cs, v in docs:  # given vectors where a document has them, fresh ones in order otherwise
            if v is None:
                assert fresh is not None
                v, used = fresh[used: used + len(cs)], used + len(cs)
            parts.append(v)
        vecs = np.concatenate(parts)
        ids = np.array([c.chunk_id for c in chunks], dtype=np.int64)
        with self.catalog.transaction():
            for doc, replaced, _, _ in docs:
                if replaced:
                    self.catalog.delete_document(doc.source)
                self.catalog.put_document(doc)
            self.catalog.put_chunks(chunks)
            seq = layout.next_part(self.root, self.manifest["next_part"])
            part = layout.write_delta_part(self.root, seq, ids, vecs.astype(self.config.dtype))
            manifest = {**self.manifest, "delta_parts": [*self.manifest["delta_parts"], part],
                        "next_part": seq + 1, "next_chunk_id": next_id,
                        "updated": time.time()}
            files.write_json_atomic(self.root / layout.MANIFEST, manifest)
        self.manifest = manifest
        self._verified_part = part
        for doc, replaced, _, _ in docs:
            report.note(UPDATED if replaced else ADDED, doc.source)
        report.chunks += len(chunks)
        self._load_vectors()

    def remove(self, paths: str | Sequence[str], *, cwd: Path | None = None) -> int:
        """Remove documents; returns the number of chunks removed. ``paths`` are read as a user
        types them (`slimrag.index.sources`): a stored name (see `documents()`), a path relative
        to ``cwd`` (default: the current folder) or to the indexed folder, an absolute path, a
        folder (every document under it) or a glob (``'notes/*.md'``). A path matching nothing
        is logged as a warning; `remove_matching` says which. Vectors are masked at once and
        dropped at the next `compact`."""
        return self.remove_matching(paths, cwd=cwd).chunks

    def remove_matching(self, paths: str | Sequence[str], *, cwd: Path | None = None) -> Removal:
        """`remove`, returning what each path matched. Names are matched under the writer lock,
        against the documents stored then."""
        paths = [paths] if isinstance(paths, str) else list(paths)
        with self.locked():
            names = [d.source for d in self.catalog.documents()]
            match = match_sources(paths, names, self.manifest.get("source_root"), cwd)
            for arg in match.nothing:
                log.warning("%s: nothing stored matches %r; nothing removed for it", self.root, arg)
            chunks = self.remove_sources(match.sources)
        return Removal(match.sources, match.nothing, chunks)

    def remove_sources(self, sources: Sequence[str]) -> int:
        """Remove documents by their exact stored names (no path reading: for callers that took
        the names from `documents()`, such as `sync`), in one transaction; returns chunks removed."""
        removed: list[int] = []
        with self.locked():
            if sources:
                with self.catalog.transaction():
                    for s in sources:
                        removed += self.catalog.delete_document(s)
            self.vectors.set_live(np.asarray(self.catalog.live_ids(), dtype=np.int64))
        return len(removed)

    def compact(self, rebuild: bool = False) -> None:
        """Write a new generation holding only live chunks (current generation + delta), switch
        the manifest atomically, then delete what the old manifest named. A crash at any point
        leaves the previous generation in use and no chunk lost.

        The kind follows ``IndexConfig.storage`` ("auto": slim from ``auto_slim_chunks`` live
        chunks on). A slim generation followed by a slim one is *updated*, not rebuilt
        (`SlimVectors.updated`): delta rows are inserted into the graph, removed rows cut out,
        the PQ codebooks kept; only a few graph rows are re-embedded (at most 2% of them, plus the
        whole generation if the new rows' PQ error has drifted). ``rebuild=True`` builds the
        generation from every live vector instead (fresh graph and codebooks), which re-embeds
        every row of a slim generation (the price of storing no embeddings).
        A chunk id present twice (a generation and a delta part, left by the race of unlocked
        writers of older versions) is kept once."""
        with self.locked():
            self._compact(rebuild)

    def _slim_update(self) -> bool:
        """`compact`'s incremental path; False when the next generation is not slim-from-slim."""
        if self.manifest.get("gen_kind") != "slim":
            return False
        store = cast("SlimVectors", self.vectors)
        live = int(store.live.sum())
        storage = self.config.storage
        if live == 0 or storage == "flat" or (storage == "auto" and live < self.config.auto_slim_chunks):
            return False
        upd = store.updated(SlimConfig.from_dict(self.manifest["slim"]))
        log.info("%s: slim generation updated: %s", self.root, upd.stats)
        gen = layout.next_generation(self.root, self.manifest["generation"])
        layout.write_generation(self.root, gen, {"ids": layout.narrow_ids(upd.ids)}, writer=upd.artifacts.save)
        self._switch_generation(gen, "slim")
        return True

    def _compact(self, rebuild: bool = False) -> None:
        if not rebuild and self._slim_update():
            return
        ids, vecs = self.vectors.live_vectors()
        ids, first = np.unique(ids, return_index=True)  # sorted by chunk id, one row per id
        if len(first) != len(vecs):
            vecs = vecs[first]
        storage = self.config.storage
        if storage == "auto":
            storage = "slim" if len(ids) >= self.config.auto_slim_chunks else "flat"
        if storage == "slim" and len(ids) == 0:
            storage = "flat"  # a graph needs at least one row
        gen = layout.next_generation(self.root, self.manifest["generation"])
        if storage == "slim":
            art = build_slim(vecs, SlimConfig.from_dict(self.manifest["slim"]))
            del vecs
            layout.write_generation(self.root, gen, {"ids": layout.narrow_ids(ids)}, writer=art.save)
        else:
            layout.write_generation(self.root, gen, {"ids": layout.narrow_ids(ids),
                                                     "vectors": vecs.astype(self.config.dtype)})
        self._switch_generation(gen, storage)

    def _switch_generation(self, gen: int, storage: str) -> None:
        """Point the manifest at generation ``gen`` with no delta, then collect what it dropped."""
        manifest = {**self.manifest, "generation": gen, "gen_kind": storage, "delta_parts": [],
                    "updated": time.time()}
        files.write_json_atomic(self.root / layout.MANIFEST, manifest)
        self.manifest = manifest
        self.catalog.clear_tombstones()
        layout.collect_garbage(self.root, manifest)
        self._load_vectors()
