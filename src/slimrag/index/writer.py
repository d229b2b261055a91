"""The write path of an `Index`: add, write, remove, compact.

Every write follows the same path (see `slimrag.index.store.layout` for the on-disk rules), in two
phases (progressive indexing: questions before the last vector):

1. text: read and hash files → skip unchanged ones → parse and chunk → in one SQLite transaction
   per `COMMIT_CHUNKS` chunks: replace changed documents, insert chunks and their keyword
   postings (and, for chunks that came with vectors, write their delta part and switch the
   manifest) → commit. From each commit on, keyword search finds those chunks; once the last
   one is in, the whole folder is answerable by keyword search and evidence answers.
2. vectors (`embed_awaiting`): every live chunk without a vector row (this write's, and any an
   earlier, interrupted write left) is read back from the catalog in id order, embedded
   `EMBED_PART_CHUNKS` at a time, and each batch written as a delta part and committed by the
   manifest switch alone (no catalog change is needed: see `slimrag.index.coverage`).

A write of at most one embedder batch (``IndexConfig.embed_batch`` chunks, 64) in all is
embedded before its only commit instead, as chunks given with vectors are: storing its text
first would make nothing searchable sooner than that one batch's embedding does, and the write
stays all or nothing (a one-file edit seen by `watch` is never committed without its vectors).

A crash or Ctrl-C anywhere leaves an index that answers: chunks committed in phase 1 and not yet
embedded are "awaiting vectors" (`Index.coverage`, `check` reports them and `check(repair=True)`
embeds them), hybrid search covers them by keyword (and embeds its best few candidates itself,
`slimrag.index.query`), and the next `add`, `sync` or `build --resume` embeds them. The cost
against embedding inside each transaction: each chunk's text is read back from the catalog once
(decompressing a block, ~0.1 ms a chunk against ~90 ms to embed it on a CPU). `Index.build` is
"create an empty index, add, compact", so a build and an incremental add share one code path and
one set of tests. Everything from "skip unchanged" on is
`IndexWriter.write`, which also takes documents chunked and embedded elsewhere
(`slimrag.index.distributed` feeds it from a Ray cluster), so dedup, chunk ids and crash safety
do not depend on where the work ran.

One writer at a time: every write operation (`write`/`add`, `remove`, `compact`, and `build`
and `check(repair=True)` around them) holds the index's writer lock (`slimrag.index.store.lock`: an OS
file lock, released by the kernel if the process dies) and, right after taking it, re-reads the
manifest (`IndexState.refresh`: appending the parts another writer added, reopening the vectors
after another's compaction, or re-reading only the liveness mask after another's remove). Chunk ids, delta part numbers and the vectors a compaction
keeps therefore always come from the current state, never from the one this handle opened. A
second writer waits (`Index.lock_wait`, default `lock.DEFAULT_WAIT_S`) and then raises
`IndexBusyError`; `locked()` holds the lock across several writes. Searches take no lock.

Append-only commits: a commit writes its delta part and appends it to the open view
(`IndexState.committed`: the part's vectors memory-mapped, its ids appended, the rows of replaced
chunks masked). Nothing stored earlier is read again, so a commit costs the same at a thousand
chunks and at a million.

Removed chunks are masked at once (tombstones in the catalog) and their vectors stay on disk
until `compact` writes a generation holding only live vectors. A slim generation is updated, not
rebuilt (`slimrag.index.store.slim.update`: new rows inserted into the graph, few rows re-embedded);
``compact(rebuild=True)`` rebuilds it from every live vector, re-embedding them all.

Knobs: `AUTO_COMPACT_SHARE` (default 0.05): a write compacts a slim index once its delta rows
reach this share of its graph rows (see `_auto_compact`; 0 turns the policy off).
`COMMIT_CHUNKS` (default 2048) chunks per text transaction. It bounds the memory of an add over a
big folder (the chunks of one transaction are held at once) and how much text an interrupted add
loses. `EMBED_PART_CHUNKS` (default 512, `STEP_BATCHES` embedder batches of 64) chunks per delta
part of the embedding phase: an interrupted add loses at most that much embedding (~45 s of a
MiniLM on two CPU cores at ~11 chunks/s; with 2048, measured on the Python docs, a kill in the
first 3 minutes of embedding kept nothing), and a big build writes N / 512 parts (40 for the
Python docs' 20,582 chunks), which its compaction merges; smaller values write more, smaller
parts.

A part of `Index` (see `slimrag.index.state`): built on the open index's `IndexState`, it reads
and changes nothing else.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path

import numpy as np

from slimrag.index.coverage import Coverage
from slimrag.index.progress import current_tracker
from slimrag.index.report import AddReport
from slimrag.index.sources import Removal, match_sources
from slimrag.index.state import IndexState, embed_input
from slimrag.index.store import layout, vectors
from slimrag.index.store import manifest as manifest_file
from slimrag.ingest.chunker import Chunker, default_chunker
from slimrag.ingest.crawl import Skipped
from slimrag.ingest.outcome import ADDED, UNCHANGED, UPDATED
from slimrag.ingest.source import InputItem, Inputs, PreparedDoc, iter_inputs, prepare
from slimrag.types import Chunk, Document

log = logging.getLogger("slimrag.index")

#: chunks stored per text transaction during add/build; bounds memory for big folders
COMMIT_CHUNKS = 2048
#: chunks embedded per delta part of the embedding phase: what a kill can lose (module header)
EMBED_PART_CHUNKS = 512
#: a write compacts a slim index once its delta holds this share of the graph's rows (0: never)
AUTO_COMPACT_SHARE = 0.05

_Pending = tuple[Document, bool, list[Chunk], np.ndarray | None]  # doc, replaces a stored one, chunks, vectors
_Looked = tuple[PreparedDoc, str | None]  # a document and the doc_id stored at its source (None: not stored)


class IndexWriter:
    """The write methods of `Index` (see the module header), on its `IndexState`. Not
    thread-safe: one writer per index."""

    def __init__(self, state: IndexState) -> None:
        self.state = state
        self._chunker: Chunker | None = None

    def locked(self) -> AbstractContextManager[None]:
        """`IndexState.locked`: hold the writer lock over a ``with`` block."""
        return self.state.locked()

    @property
    def chunker(self) -> Chunker:
        """The chunker of this index's ``chunk_tokens``/``chunk_overlap``, made on first use."""
        if self._chunker is None:
            self._chunker = default_chunker(self.state.config.chunk_tokens, self.state.config.chunk_overlap)
        return self._chunker

    def add(self, inputs: Inputs) -> AddReport:
        """Add or update documents. Unchanged files (same content hash at the same source) are
        skipped; changed ones are replaced. Bad files are skipped with one warning each."""
        report = AddReport()
        return self._locked_write(self._prepare(inputs, report), report)

    def _prepare(self, inputs: Inputs, report: AddReport) -> Iterator[_Looked]:
        """Read, hash and chunk inputs lazily; an unchanged document is passed on unparsed. Under
        a progress display (`slimrag.index.progress`) the crawl is listed first, for its total.
        Each document comes with the doc_id stored at its source, read once, for `prepare` (skip
        an unchanged file unparsed) and for `_write` (unchanged, replace or add): this generator
        runs only as `_write` consumes it, under the writer lock (see `_write`)."""
        config = self.state.config
        tracker = current_tracker()
        items: Iterable[InputItem] = iter_inputs(inputs, self.state.manifest.source_path, config.ignore,
                                                 config.max_file_bytes, report.skipped)
        if tracker.counts_files:
            items = list(items)
            tracker.start(len(items) + len(report.skipped), done=len(report.skipped))
        for item in items:
            stored = self.stored_doc_id(item.source)
            doc = prepare(item, stored, self.chunker)
            if isinstance(doc, Skipped):
                report.skip(doc.source, doc.reason, doc.kind)
                tracker.file()
            else:
                tracker.file(len(doc.pieces))
                yield doc, stored

    def stored_doc_id(self, source: str) -> str | None:
        """The content hash stored for ``source``, or None when it is not in the index."""
        old = self.state.catalog.document(source)
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

        def looked_up() -> Iterator[_Looked]:
            # ``docs`` were prepared before the lock (on Ray workers, by a script): each stored id
            # is read here, as `_write` takes the document (``docs`` itself is first iterated
            # there too, under the lock).
            for d in docs:
                yield d, self.stored_doc_id(d.source)

        return self._locked_write(looked_up(), report)

    def _locked_write(self, docs: Iterable[_Looked], report: AddReport | None) -> AddReport:
        with self.locked():
            report = self._write(docs, report)
            self._auto_compact()
            return report

    def _auto_compact(self) -> None:
        """The automatic compaction policy of `write` (and `add`): a slim index whose delta rows
        reach `AUTO_COMPACT_SHARE` of its graph rows is compacted at once. Delta rows are exact
        float32 vectors, ~20x the bytes of a graph row (1,536 against ~76 at d=384), so at 5% the
        index is ~1.9x its compact size; the incremental update that folds them in re-embeds at
        most 2% of the rows (`slimrag.index.store.slim.update`), so compacting early costs little."""
        if AUTO_COMPACT_SHARE and self.state.vectors.wants_compaction(AUTO_COMPACT_SHARE):
            self._compact()

    def _write(self, docs: Iterable[_Looked], report: AddReport | None) -> AddReport:
        """`write` under the lock. Each document comes with the doc_id stored at its source, read
        by the lazy ``docs`` as this loop takes it, so under the writer lock that this write holds
        (one catalog query per document: `_prepare` reads it before parsing, and it is not read
        again here). It is still what the catalog holds when it is used: no other writer runs
        while the lock is held (`IndexState.locked` also refreshes the view first), and this
        write's own commits only store sources taken earlier, while a later document of an
        earlier source is passed over (the first is kept)."""
        t0 = time.perf_counter()
        report = report if report is not None else AddReport()
        dim = self.state.manifest.dim
        pending: list[_Pending] = []
        n_pending = 0
        stored_any = False
        next_id = max(self.state.manifest.next_chunk_id, self.state.catalog.max_chunk_id() + 1)
        seen: set[str] = set()
        for d, old_id in docs:
            if d.source in seen:
                continue
            seen.add(d.source)
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
                self._store(pending, next_id, report)
                pending, n_pending, stored_any = [], 0, True
        here = 0
        if pending:
            if not stored_any and n_pending <= self.state.config.embed_batch:
                pending, here = self._embedded(pending)  # a small write: all or nothing, in one commit
            self._store(pending, next_id, report, here)
        report.searchable_s = time.perf_counter() - t0
        report.embedded += here + self._embed_awaiting()
        report.seconds += time.perf_counter() - t0
        return report

    def _store(self, docs: list[_Pending], next_id: int, report: AddReport, embedded_here: int = 0) -> None:
        """Phase 1, one transaction: store documents and chunks (text and keyword postings); for
        chunks that came with vectors (Ray ingest), write their delta part too; switch the
        manifest (its ``next_chunk_id``, and that part); commit. The other chunks await vectors
        (`embed_awaiting`). A failure rolls the catalog back; a delta part it may leave is named by
        no manifest (or rolled back by `IndexState.refresh`) and collected later. ``embedded_here``:
        how many of the given vectors `_embedded` computed (the progress display counted them)."""
        st = self.state
        chunks = [c for _, _, cs, _ in docs for c in cs]
        given = [(c.chunk_id, v[i]) for _, _, cs, v in docs if v is not None for i, c in enumerate(cs)]
        replaced: list[int] = []
        part = None
        with st.catalog.transaction():
            for doc, is_update, _, _ in docs:
                if is_update:
                    replaced += st.catalog.delete_document(doc.source)
                st.catalog.put_document(doc)
            st.catalog.put_chunks(chunks)
            manifest = st.manifest.changed(next_chunk_id=next_id)
            if given:
                ids = np.array([i for i, _ in given], dtype=np.int64)
                vecs = np.stack([v for _, v in given]).astype(st.config.dtype)
                seq = layout.next_part(st.root, st.manifest.next_part)
                part = layout.write_delta_part(st.root, seq, ids, vecs)
                manifest = manifest.changed(delta_parts=(*manifest.delta_parts, part), next_part=seq + 1)
            manifest_file.write(st.root, manifest)  # inside the transaction: see slimrag.index.store.layout
        dead = np.asarray(replaced, dtype=np.int64)
        if part is not None:
            st.committed(manifest, part, ids, dead)
        else:
            st.stored_text(manifest, dead)
        tracker = current_tracker()
        tracker.stored(len(chunks))
        tracker.chunks(len(given) - embedded_here)  # given vectors: done without embedding
        for doc, is_update, _, _ in docs:
            report.note(UPDATED if is_update else ADDED, doc.source)
        report.chunks += len(chunks)

    def _embedded(self, docs: list[_Pending]) -> tuple[list[_Pending], int]:
        """``docs`` with vectors computed for those that have none (one embedder call), and how
        many chunks that embedded."""
        todo = [embed_input(c) for _, _, cs, v in docs if v is None for c in cs]
        if not todo:
            return docs, 0
        tracker = current_tracker()
        tracker.embedding(len(todo))
        fresh = tracker.embed(self.state.embedder, todo, self.state.config.embed_batch)
        out, used = [], 0
        for doc, is_update, cs, v in docs:
            if v is None:
                v, used = fresh[used: used + len(cs)], used + len(cs)
            out.append((doc, is_update, cs, v))
        return out, len(todo)

    def coverage(self) -> Coverage:
        """`IndexState.coverage`: live chunks, and how many have a vector."""
        return self.state.coverage()

    def embed_awaiting(self, limit: int | None = None) -> int:
        """Phase 2 on its own (`build --resume`, `check(repair=True)`, a server catching up):
        embed every live chunk that has no vector yet (at most ``limit``, the lowest ids first),
        `EMBED_PART_CHUNKS` at a time, each batch a delta part committed by a manifest switch;
        returns the chunks embedded. Interrupted, it keeps the batches committed so far. Holds the
        writer lock (a caller that must let other writers in passes a ``limit`` and calls again)."""
        with self.locked():
            return self._embed_awaiting(limit)

    def _embed_awaiting(self, limit: int | None = None) -> int:
        st = self.state
        todo = st.awaiting()[:limit]
        if not len(todo):
            return 0
        tracker = current_tracker()
        tracker.embedding(len(todo))
        none = np.zeros(0, np.int64)
        for s in range(0, len(todo), EMBED_PART_CHUNKS):
            ids = todo[s: s + EMBED_PART_CHUNKS]
            chunks = st.catalog.chunks(ids)
            vecs = tracker.embed(st.embedder, [embed_input(chunks[int(i)]) for i in ids], st.config.embed_batch)
            seq = layout.next_part(st.root, st.manifest.next_part)
            part = layout.write_delta_part(st.root, seq, ids, vecs.astype(st.config.dtype))
            manifest = st.manifest.changed(delta_parts=(*st.manifest.delta_parts, part), next_part=seq + 1)
            manifest_file.write(st.root, manifest)  # the commit: the chunks are in the catalog already
            st.committed(manifest, part, ids, none)
        return len(todo)

    def remove(self, paths: str | Sequence[str], *, cwd: Path | None = None) -> int:
        """Remove documents; returns the number of chunks removed. ``paths`` are read as a user
        types them (`slimrag.index.sources`): a stored name (see `documents()`), a path relative
        to ``cwd`` (default: the current folder) or to the indexed folder, an absolute path, a
        folder (every document under it) or a glob (``'notes/*.md'``). A path matching nothing
        is logged as a warning; `remove_matching` says which. Vectors are masked at once and
        dropped at the next `compact`."""
        return self.remove_matching(paths, cwd=cwd).chunks

    def remove_matching(self, paths: str | Sequence[str], *, cwd: Path | None = None, warn: bool = True) -> Removal:
        """`remove`, returning what each path matched. Names are matched under the writer lock,
        against the documents stored then. ``warn``: log each path that matched nothing (a caller
        that reports `Removal.nothing` itself, as the CLI does, passes False)."""
        paths = [paths] if isinstance(paths, str) else list(paths)
        with self.locked():
            names = [d.source for d in self.state.catalog.documents()]
            match = match_sources(paths, names, self.state.manifest.source_root, cwd)
            for arg in match.nothing if warn else ():
                log.warning("%s: nothing stored matches %r; nothing removed for it", self.state.root, arg)
            chunks = self.remove_sources(match.sources)
        return Removal(match.sources, match.nothing, chunks)

    def remove_sources(self, sources: Sequence[str]) -> int:
        """Remove documents by their exact stored names (no path reading: for callers that took
        the names from `documents()`, such as `sync`), in one transaction; returns chunks removed."""
        removed: list[int] = []
        catalog = self.state.catalog
        with self.locked():
            if sources:
                with catalog.transaction():
                    for s in sources:
                        removed += catalog.delete_document(s)
            self.state.vectors.kill(np.asarray(removed, dtype=np.int64))
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
        every row of a slim generation (the price of storing no embeddings). The catalog is then
        brought to its smallest form (`Catalog.upgrade`: an index built before the compact text
        store is converted, its keyword index merged).
        A chunk id present twice (a generation and a delta part, left by the race of unlocked
        writers of older versions) is kept once."""
        with self.locked():
            self._compact(rebuild)

    def _compact(self, rebuild: bool = False) -> None:
        st = self.state
        gen, kind = vectors.write_next_generation(st.root, st.manifest, st.vectors, rebuild)
        st.switch(st.manifest.changed(generation=gen, gen_kind=kind, delta_parts=()))
        st.catalog.clear_tombstones()
        layout.collect_garbage(st.root, st.manifest)
        st.catalog.upgrade()  # the catalog at its smallest: a legacy one converted, blocks repacked
