"""`Index`: the public face of one index folder, and its lifecycle: create, build, open, close.

An open `Index` is one state object and the parts that receive it (`slimrag.index.state`):

```
Index ─┬─ IndexState    root, Manifest, Catalog, embedder, VectorStore, writer lock, refresh
       ├─ IndexWriter   (state)           add, write, remove, compact      writer.py
       ├─ IndexQuery    (state)           search, search_batch             query.py
       ├─ IndexChecker  (state, writer)   check [repair]                   check.py
       ├─ IndexSync     (state, writer)   sync                             sync.py
       └─ IndexBrowse   (state)           passage, status, stats           browse.py
```

`Index` builds them with explicit arguments and delegates each public method to one of them; no
part reads another's attributes. Shells (the CLI, ``serve``, ``mcp``, the router) reach an index
through the public methods below only (``source_root``, ``chunks``, ``embed_batches``,
``count_tokens``, ``text_bytes``, ...), never through the parts.

Threads: one `Index` serves a whole process (`slimrag.rag.session`). Searches, browsing and the
read-only views may be called from any number of threads at once (each thread reads the catalog
through a connection of its own, and searches hold the view shared: `slimrag.index.threads`);
`catch_up` follows other processes' writes in place; writes from several threads take the writer
lock in turn, as writers of several processes do. Vectors are a `slimrag.index.store.vectors.VectorStore` of the current
generation plus the delta parts: a flat generation as memory-mapped matrices (`FlatVectors`), a
slim one as graph + PQ codes whose rows are re-embedded from the catalog's text at query time
(`SlimVectors`); see `slimrag.index.store.layout` for the files and `slimrag.index.store.manifest` for the
manifest.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from slimrag.catalog import Catalog
from slimrag.config import IndexConfig, SearchConfig
from slimrag.embed.base import Embedder
from slimrag.embed.registry import default_embedder, from_record
from slimrag.errors import IndexFormatError
from slimrag.index.browse import IndexBrowse
from slimrag.index.check import CheckReport, IndexChecker
from slimrag.index.coverage import Coverage
from slimrag.index.query import IndexQuery
from slimrag.index.replace import replaceable, swap_in
from slimrag.index.report import AddReport
from slimrag.index.sources import Removal
from slimrag.index.state import IndexState
from slimrag.index.store import layout
from slimrag.index.store import manifest as manifest_file
from slimrag.index.store.manifest import Manifest
from slimrag.index.store.slim import SlimConfig
from slimrag.index.store.vectors import VectorStore
from slimrag.index.sync import IndexSync, SyncReport
from slimrag.index.writer import IndexWriter
from slimrag.ingest.chunker import Chunker
from slimrag.ingest.source import Inputs, PreparedDoc
from slimrag.types import Chunk, Document, Excerpt, Hits

log = logging.getLogger("slimrag.index")


class Index:
    """One index folder. One writer at a time, across threads and processes: every write takes
    the folder's writer lock (waiting up to ``lock_wait`` seconds, see `slimrag.index.store.lock`).
    Shared by threads (module header): reads never wait for each other, nor for a writer's work
    (only for the moment its result is put in view)."""

    def __init__(self, root: Path, embedder: Embedder | None = None, *, wait: float | None = None) -> None:
        root = Path(root)
        manifest = manifest_file.read(root)
        rec = manifest.embedder
        embedder = embedder if embedder is not None else from_record(rec)
        if embedder.model_id != rec["id"]:
            raise IndexFormatError(
                f"{root} was built with embedder {rec['id']!r}, not {embedder.model_id!r}; "
                "open it with the same embedder or rebuild")
        self.state = IndexState(root, manifest, embedder, Catalog(root / layout.CATALOG), wait)
        self._writer = IndexWriter(self.state)
        self._query = IndexQuery(self.state)
        self._checker = IndexChecker(self.state, self._writer)
        self._sync = IndexSync(self.state, self._writer)
        self._browse = IndexBrowse(self.state)
        #: what the add of `build` did (set by `build` only)
        self.last_report: AddReport | None = None

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def create(cls, out: str | Path, *, embedder: Embedder | None = None, config: IndexConfig | None = None,
               source_root: str | Path | None = None, overwrite: bool = False,
               slim: SlimConfig | None = None, wait: float | None = None) -> Index:
        """Create an empty index folder. With ``overwrite``, an existing index there (recognised by
        its manifest, `replaceable`) is replaced: the new one is made beside it and swapped in under
        the old one's writer lock (waiting up to ``wait`` seconds for a writer busy with it), so a
        failed create leaves the old index as it was."""
        out = Path(out)
        if not out.exists():
            return cls._create_at(out, embedder, config, source_root, slim, wait)
        if not overwrite:
            raise IndexFormatError(f"{out} already exists; use `add` to update it or overwrite=True")
        fresh = replaceable(out)
        if fresh is None:  # only what an interrupted create leaves: nothing to keep
            shutil.rmtree(out)
            return cls._create_at(out, embedder, config, source_root, slim, wait)
        try:
            idx = cls._create_at(fresh, embedder, config, source_root, slim, wait)
            used = idx.embedder
            idx.close()
            swap_in(fresh, out, wait)
        except BaseException:
            shutil.rmtree(fresh, ignore_errors=True)
            raise
        return cls(out, used, wait=wait)

    @classmethod
    def _create_at(cls, out: Path, embedder: Embedder | None, config: IndexConfig | None,
                   source_root: str | Path | None, slim: SlimConfig | None, wait: float | None) -> Index:
        """An empty index in ``out``, a folder that does not exist or is empty."""
        config = config or IndexConfig()
        embedder = embedder or default_embedder()
        if (warning := config.window_warning(embedder.model_id, embedder.max_tokens)) is not None:
            log.warning(warning)
        if not embedder.dim:
            embedder.embed_batch(["dimension probe"])
        out.mkdir(parents=True, exist_ok=True)
        Catalog(out / layout.CATALOG).close()
        layout.write_generation(out, 0, {"ids": layout.narrow_ids(np.zeros(0, np.int64)),
                                         "vectors": np.zeros((0, embedder.dim), config.dtype)})
        manifest_file.write(out, manifest_file.new(
            storage=config.storage, embedder=embedder.record(), config=config, slim=slim or SlimConfig(),
            source_root=str(Path(source_root).resolve()) if source_root else None))
        return cls(out, embedder, wait=wait)

    @classmethod
    def build(cls, source: Inputs, out: str | Path, *, storage: str | None = None, embedder: Embedder | None = None,
              config: IndexConfig | None = None, overwrite: bool = False,
              slim: SlimConfig | None = None, wait: float | None = None, resume: bool = False) -> Index:
        """Build an index at ``out`` from a folder, files, or ``(source, text)`` pairs, then compact it.
        The text of every file is stored before anything is embedded (`slimrag.index.writer`), so
        ``out`` answers keyword and evidence queries while the vectors fill in, and a build
        interrupted then (Ctrl-C, a kill) leaves an index that answers.

        resume: when ``out`` is already an index (an interrupted build's), finish it instead:
        `add` ``source`` to it (files stored already are skipped unread, chunks awaiting vectors
        embedded) and compact; the index keeps its own config and storage (``storage``, ``config``
        and ``slim`` are for a new index only). Without an index at ``out`` it builds one.
        storage: "flat" (exact vectors), "slim" (graph + PQ codes, embeddings recomputed at query
        time), or "auto" (slim from ``IndexConfig.auto_slim_chunks`` chunks on). The add and the
        compaction run under one hold of the writer lock; ``wait``: see `Index`.

        overwrite: replace an index at ``out`` (only an index: `replaceable`). The new one is built
        in a hidden sibling folder and swapped in when its build has succeeded; until then the old
        index stays whole and searchable, and a build that fails (an embedder error, an
        interrupt) is deleted, leaving the old one as it was."""
        config = config or IndexConfig(storage=storage or "flat")
        if storage is not None and storage != config.storage:
            config = IndexConfig(**{**asdict(config), "storage": storage})
        root = Path(source) if isinstance(source, (str, Path)) and Path(source).is_dir() else None
        out = Path(out)
        if resume and (out / layout.MANIFEST).is_file():
            return cls._resume(source, out, embedder, wait)
        fresh = replaceable(out) if overwrite and out.exists() else None
        if fresh is None:
            idx = cls.create(out, embedder=embedder, config=config, source_root=root, overwrite=overwrite,
                             slim=slim, wait=wait)
            with idx.locked():
                idx.last_report = idx.add(source)
                idx.compact()
            return idx
        try:
            idx = cls._create_at(fresh, embedder, config, root, slim, wait)
            try:
                with idx.locked():
                    report = idx.add(source)
                    idx.compact()
            finally:
                idx.close()
            swap_in(fresh, out, wait)
        except BaseException:
            shutil.rmtree(fresh, ignore_errors=True)
            raise
        idx = cls(out, idx.embedder, wait=wait)
        idx.last_report = report
        return idx

    @classmethod
    def _resume(cls, source: Inputs, out: Path, embedder: Embedder | None, wait: float | None) -> Index:
        """`build` with ``resume`` of the index at ``out``: add and compact under one hold of the
        writer lock (no compaction when nothing was written and the generation holds everything)."""
        idx = cls(out, embedder, wait=wait)
        with idx.locked():
            idx.last_report = idx.add(source)
            if idx.manifest.delta_parts or idx.catalog.counts()["tombstones"]:
                idx.compact()
        return idx

    @classmethod
    def open(cls, path: str | Path, embedder: Embedder | None = None, *, wait: float | None = None) -> Index:
        """Open an existing index folder (vectors are memory-mapped; the embedder loads on first query).
        wait: seconds a write through this handle waits for another writer before `IndexBusyError`
        (default ``$SLIMRAG_WAIT`` or `slimrag.index.store.lock.DEFAULT_WAIT_S`, 300 s); also settable
        later as ``lock_wait``."""
        return cls(Path(path), embedder, wait=wait)

    def close(self) -> None:
        """Close the catalog and unmap the vectors (`IndexState.close`)."""
        self.state.close()

    def release_thread(self) -> None:
        """Close the calling thread's catalog connection (a worker thread done with the index;
        its next use opens another). Threads that end release theirs anyway."""
        self.state.catalogs.release()

    def catch_up(self) -> bool:
        """Follow what other processes wrote since the last call, in place: new delta parts
        mapped, removals masked, a compaction's generation switched in, the caches of recomputed
        rows kept (`IndexState.catch_up`). A stat and a pragma when nothing changed; True when the
        view moved. Searches never need it for this handle's own writes."""
        return self.state.catch_up()

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the state, read-only views -------------------------------------------------------------
    @property
    def root(self) -> Path:
        """The index folder."""
        return self.state.root

    @property
    def manifest(self) -> Manifest:
        """The manifest in force for this handle."""
        return self.state.manifest

    @property
    def config(self) -> IndexConfig:
        """The build configuration."""
        return self.state.config

    @property
    def catalog(self) -> Catalog:
        """The SQLite catalog (this thread's connection): documents, chunks, keyword index."""
        return self.state.catalog

    @property
    def source_root(self) -> str | None:
        """The folder the index was built from (absolute), against which stored names are relative;
        None for an index built from single files."""
        return self.state.manifest.source_root

    @property
    def embedder(self) -> Embedder:
        """The embedder of this index (loads its model on first use)."""
        return self.state.embedder

    @property
    def vectors(self) -> VectorStore:
        """The vector store of the current generation and delta."""
        return self.state.vectors

    @property
    def lock_wait(self) -> float | None:
        """Seconds a write waits for another writer (None: `lock.default_wait()`)."""
        return self.state.lock_wait

    @lock_wait.setter
    def lock_wait(self, seconds: float | None) -> None:
        self.state.lock_wait = seconds

    @property
    def rolled_back(self) -> list[str]:
        """Delta parts of interrupted writes this handle dropped from the manifest."""
        return self.state.rolled_back

    @property
    def bad_parts(self) -> list[str]:
        """Delta parts the manifest names that could not be read (see `check`)."""
        return self.state.bad_parts

    @property
    def chunker(self) -> Chunker:
        """The chunker of this index's ``chunk_tokens``/``chunk_overlap``, made on first use."""
        return self._writer.chunker

    def version(self) -> tuple[int, int, int]:
        """A cheap, hashable token that changes when another process changes this index: the
        manifest file's (inode, mtime in ns), replaced by a rename at every add and compact, and
        the calling thread's catalog connection's SQLite ``data_version``, which moves when another
        connection commits (a remove). A stat and a pragma: microseconds. Compare tokens taken on
        one thread, for equality only. Writes through this same `Index` on the same thread move
        the manifest part but not ``data_version``."""
        st = (self.root / layout.MANIFEST).stat()
        return st.st_ino, st.st_mtime_ns, self.catalog.data_version()

    # -- writing (IndexWriter) ------------------------------------------------------------------
    def locked(self) -> AbstractContextManager[None]:
        """Hold the writer lock over a ``with`` block (`IndexState.locked`)."""
        return self.state.locked()

    def add(self, inputs: Inputs) -> AddReport:
        """`IndexWriter.add`: add or update documents; unchanged files are skipped."""
        return self._writer.add(inputs)

    def write(self, docs: Iterable[PreparedDoc], report: AddReport | None = None) -> AddReport:
        """`IndexWriter.write`: store documents prepared (chunked, maybe embedded) elsewhere."""
        return self._writer.write(docs, report)

    def stored_doc_id(self, source: str) -> str | None:
        """The content hash stored for ``source``, or None when it is not in the index."""
        return self._writer.stored_doc_id(source)

    def remove(self, paths: str | Sequence[str], *, cwd: Path | None = None) -> int:
        """`IndexWriter.remove`: remove documents as a user names them; returns chunks removed."""
        return self._writer.remove(paths, cwd=cwd)

    def remove_matching(self, paths: str | Sequence[str], *, cwd: Path | None = None, warn: bool = True) -> Removal:
        """`IndexWriter.remove_matching`: `remove`, returning what each path matched."""
        return self._writer.remove_matching(paths, cwd=cwd, warn=warn)

    def remove_sources(self, sources: Sequence[str]) -> int:
        """`IndexWriter.remove_sources`: remove documents by their exact stored names."""
        return self._writer.remove_sources(sources)

    def compact(self, rebuild: bool = False) -> None:
        """`IndexWriter.compact`: write a generation of the live chunks and switch to it."""
        self._writer.compact(rebuild)

    # -- reading (IndexQuery, IndexBrowse) ------------------------------------------------------
    def search(self, query: str, k: int = 5, mode: str | None = None, source: str | None = None,
               config: SearchConfig | None = None) -> Hits:
        """`IndexQuery.search`: top-k chunks for ``query``, best first, with the search's best vector
        similarity (`Hits.similarity`)."""
        return self._query.search(query, k, mode, source, config)

    def search_batch(self, queries: Sequence[str], k: int = 5, source: str | None = None,
                     config: SearchConfig | None = None) -> list[Hits]:
        """`IndexQuery.search_batch`: vector search for many queries at once."""
        return self._query.search_batch(queries, k, source, config)

    def coverage(self) -> Coverage:
        """Live chunks and how many have a vector; the others await theirs, found by keyword
        search meanwhile (`slimrag.index.coverage`)."""
        return self.state.coverage()

    @property
    def last_coverage(self) -> Coverage | None:
        """What the last `search` of this handle covered (`IndexQuery.last_coverage`), None before one."""
        return self._query.last_coverage

    def embed_awaiting(self, limit: int | None = None) -> int:
        """`IndexWriter.embed_awaiting`: embed the chunks awaiting vectors (at most ``limit``);
        returns how many."""
        return self._writer.embed_awaiting(limit)

    def documents(self) -> list[Document]:
        """All stored documents."""
        return self.catalog.documents()

    def chunks(self, chunk_ids: Iterable[int]) -> dict[int, Chunk]:
        """The stored chunks of ``chunk_ids`` by id (ids not in the index are left out)."""
        return self.catalog.chunks(list(chunk_ids))

    def text_bytes(self) -> dict[str, Any]:
        """The text store: ``bytes`` of text the documents yielded, the catalog's bytes by part
        (``catalog_parts``: text, keyword index, documents, other, free) and whether it has the
        ``compact`` layout."""
        catalog = self.catalog
        return {"bytes": catalog.text_bytes(), "catalog_parts": catalog.part_bytes(), "compact": catalog.compact}

    # -- the embedder ---------------------------------------------------------------------------
    @property
    def embedding(self) -> tuple[str, int]:
        """The embedder's model id and the width of its vectors."""
        return self.embedder.model_id, self.embedder.dim

    def load_embedder(self) -> None:
        """Load the embedder's model now (else on the first query that needs it)."""
        self.embedder.load()

    def embed_batches(self, texts: Sequence[str]) -> Iterator[np.ndarray]:
        """Embeddings of ``texts`` as the index makes them (its embedder, ``embed_batch`` texts
        per call), one batch at a time, so a caller may stop between batches."""
        step = self.config.embed_batch
        for start in range(0, len(texts), step):
            yield self.embedder.embed(texts[start:start + step], batch_size=step, progress=False)

    def count_tokens(self, text: str) -> int:
        """``text``'s length in the chunker's tokens (the embedder's tokenizer)."""
        return self._writer.chunker.count(text)

    def passage(self, chunk_id: int, around: int = 1) -> Excerpt:
        """`IndexBrowse.passage`: a chunk with its neighbours in its document."""
        return self._browse.passage(chunk_id, around)

    def status(self) -> dict[str, Any]:
        """`IndexBrowse.status`: what a status panel shows."""
        return self._browse.status()

    def stats(self) -> dict[str, Any]:
        """`IndexBrowse.stats`: counts, bytes on disk per component, embedder and config."""
        return self._browse.stats()

    # -- upkeep (IndexChecker, IndexSync) -------------------------------------------------------
    def check(self, repair: bool = False) -> CheckReport:
        """`IndexChecker.check`: do catalog and vectors agree; with ``repair``, fix what was found."""
        return self._checker.check(repair)

    def sync(self, folder: str | Path, paths: Iterable[str | Path] | None = None) -> SyncReport:
        """`IndexSync.sync`: make the index hold exactly the readable files of ``folder``."""
        return self._sync.sync(folder, paths)
