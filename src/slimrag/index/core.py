"""`Index`: the public face of one index folder, and its lifecycle: create, build, open, close,
documents, stats.

The methods are grouped by concept in three files: this one (lifecycle and the loading of the
vector store), `slimrag.index.writer` (add, write, remove, compact: the write path and its crash
safety) and `slimrag.index.query` (vector, keyword and hybrid search). `Index` inherits the last
two as mixins, so callers hold one object and ``slimrag.index.core.Index`` stays its import path.

Vectors are read from the current generation plus the delta parts: a flat generation as one
memory-mapped matrix (`FlatVectors`), a slim one as graph + PQ codes whose rows are re-embedded
from the catalog's text at query time (`SlimVectors`); see `slimrag.index.layout` for the files.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from slimrag import files
from slimrag.catalog import Catalog
from slimrag.config import IndexConfig
from slimrag.embed.base import Embedder
from slimrag.embed.registry import default_embedder, from_record
from slimrag.errors import IndexFormatError
from slimrag.index import layout
from slimrag.index.browse import IndexBrowse
from slimrag.index.check import IndexChecker
from slimrag.index.flat import FlatVectors
from slimrag.index.lock import WriterLock
from slimrag.index.query import IndexQuery
from slimrag.index.slim import SlimArtifacts, SlimConfig, slim_bytes
from slimrag.index.slim.store import SlimVectors
from slimrag.index.sync import IndexSync
from slimrag.index.writer import IndexWriter, embed_input
from slimrag.ingest.chunker import Chunker
from slimrag.ingest.source import Inputs
from slimrag.types import Document

log = logging.getLogger("slimrag.index")


class Index(IndexWriter, IndexQuery, IndexChecker, IndexBrowse, IndexSync):
    """One index folder. One writer at a time, across threads and processes: every write takes
    the folder's writer lock (waiting up to ``lock_wait`` seconds, see `slimrag.index.lock`).
    An `Index` object is not thread-safe; open one per thread (reads never lock)."""

    def __init__(self, root: Path, embedder: Embedder | None = None, *, wait: float | None = None) -> None:
        self.root = Path(root)
        self.lock_wait = wait
        self._lock = None
        self._verified_part = None
        self.rolled_back = []
        self.manifest = layout.read_manifest(self.root)
        self.config = IndexConfig(**{k: tuple(v) if k == "ignore" else v
                                     for k, v in self.manifest["config"].items()})
        rec = self.manifest["embedder"]
        self.embedder = embedder if embedder is not None else from_record(rec)
        if self.embedder.model_id != rec["id"]:
            raise IndexFormatError(
                f"{root} was built with embedder {rec['id']!r}, not {self.embedder.model_id!r}; "
                "open it with the same embedder or rebuild")
        self.catalog = Catalog(self.root / layout.CATALOG)
        self._chunker: Chunker | None = None
        self._load_vectors()

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def create(cls, out: str | Path, *, embedder: Embedder | None = None, config: IndexConfig | None = None,
               source_root: str | Path | None = None, overwrite: bool = False,
               slim: SlimConfig | None = None, wait: float | None = None) -> Index:
        """Create an empty index folder. With ``overwrite``, an existing index there is deleted
        first, under its writer lock (waiting up to ``wait`` seconds for a writer busy with it)."""
        out = Path(out)
        if out.exists():
            if not overwrite:
                raise IndexFormatError(f"{out} already exists; use `add` to update it or overwrite=True")
            if not (out / layout.MANIFEST).is_file() and not _unfinished_index(out):
                raise IndexFormatError(f"{out} is a non-empty folder that is not an index; refusing to delete it")
            if (out / layout.MANIFEST).is_file():
                with WriterLock(out, wait):
                    shutil.rmtree(out)
            else:
                shutil.rmtree(out)
        config = config or IndexConfig()
        embedder = embedder or default_embedder()
        if not embedder.dim:
            embedder.embed_batch(["dimension probe"])
        out.mkdir(parents=True)
        Catalog(out / layout.CATALOG).close()
        layout.write_generation(out, 0, {"ids": layout.narrow_ids(np.zeros(0, np.int64)),
                                         "vectors": np.zeros((0, embedder.dim), config.dtype)})
        now = time.time()
        files.write_json_atomic(out / layout.MANIFEST, {
            "format": layout.FORMAT_VERSION, "storage": config.storage, "gen_kind": "flat",
            "slim": (slim or SlimConfig()).to_dict(), "embedder": embedder.record(),
            "config": asdict(config), "generation": 0, "delta_parts": [], "next_chunk_id": 0, "next_part": 0,
            "source_root": str(Path(source_root).resolve()) if source_root else None,
            "created": now, "updated": now,
        })
        return cls(out, embedder, wait=wait)

    @classmethod
    def build(cls, source: Inputs, out: str | Path, *, storage: str | None = None, embedder: Embedder | None = None,
              config: IndexConfig | None = None, overwrite: bool = False,
              slim: SlimConfig | None = None, wait: float | None = None) -> Index:
        """Build an index at ``out`` from a folder, files, or ``(source, text)`` pairs, then compact it.
        storage: "flat" (exact vectors), "slim" (graph + PQ codes, embeddings recomputed at query
        time), or "auto" (slim from ``IndexConfig.auto_slim_chunks`` chunks on). The add and the
        compaction run under one hold of the writer lock; ``wait``: see `Index`."""
        config = config or IndexConfig(storage=storage or "flat")
        if storage is not None and storage != config.storage:
            config = IndexConfig(**{**asdict(config), "storage": storage})
        root = Path(source) if isinstance(source, (str, Path)) and Path(source).is_dir() else None
        idx = cls.create(out, embedder=embedder, config=config, source_root=root, overwrite=overwrite, slim=slim,
                         wait=wait)
        with idx.locked():
            idx.last_report = idx.add(source)
            idx.compact()
        return idx

    @classmethod
    def open(cls, path: str | Path, embedder: Embedder | None = None, *, wait: float | None = None) -> Index:
        """Open an existing index folder (vectors are memory-mapped; the embedder loads on first query).
        wait: seconds a write through this handle waits for another writer before `IndexBusyError`
        (default ``$SLIMRAG_WAIT`` or `slimrag.index.lock.DEFAULT_WAIT_S`, 300 s); also settable
        later as ``lock_wait``."""
        return cls(Path(path), embedder, wait=wait)

    def close(self) -> None:
        """Close the catalog."""
        self.catalog.close()

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- vectors --------------------------------------------------------------------------------
    def _load_vectors(self) -> None:
        gen = layout.read_generation(self.root, self.manifest["generation"])
        d_ids, d_vecs = self._read_delta()
        if self.manifest.get("gen_kind", "flat") == "slim":
            art = SlimArtifacts.load(layout.gen_dir(self.root, self.manifest["generation"]))
            if d_vecs is None:
                d_vecs = np.zeros((0, art.dim), np.float32)
            self.vectors: FlatVectors | SlimVectors = SlimVectors(
                gen["ids"], art, FlatVectors(d_ids, d_vecs), self._recompute,
                SlimConfig.from_dict(self.manifest["slim"]))
        else:
            ids, vecs = np.asarray(gen["ids"], dtype=np.int64), gen["vectors"]  # ids are narrowed on disk
            if d_vecs is not None:
                ids = np.concatenate([ids, d_ids])
                vecs = np.concatenate([np.asarray(vecs), d_vecs.astype(vecs.dtype)])
            self.vectors = FlatVectors(ids, vecs)
        self._seen_data = self.catalog.data_version()  # before the read: a commit in between is seen later
        self.vectors.set_live(np.asarray(self.catalog.live_ids(), dtype=np.int64))

    def _read_delta(self) -> tuple[np.ndarray, np.ndarray | None]:
        """The delta parts the manifest names, concatenated. A missing or unreadable part (damage:
        a crash never leaves one) is skipped with a warning and listed in ``bad_parts``, so the
        index still opens and searches; its chunks have no vector until `check(repair=True)`."""
        good, self.bad_parts = [], []
        for name in self.manifest["delta_parts"]:
            try:
                good.append(layout.read_delta_part(self.root / layout.DELTA / name))
            except (IndexFormatError, FileNotFoundError) as e:
                log.warning("%s; until then its chunks are found by keyword search only", e)
                self.bad_parts.append(name)
        if not good:
            return np.zeros(0, dtype=np.int64), None
        return np.concatenate([i for i, _ in good]), np.concatenate([v for _, v in good])

    def _recompute(self, chunk_ids: np.ndarray) -> np.ndarray:
        """Exact embeddings of stored chunks, recomputed from their text (the slim index keeps none)."""
        chunks = self.catalog.chunks(chunk_ids)
        missing = [int(i) for i in chunk_ids if int(i) not in chunks]
        if missing:
            raise IndexFormatError(f"chunks {missing[:5]} are in the index but not in the catalog; run compact()")
        return self.embedder.embed([embed_input(chunks[int(i)]) for i in chunk_ids],
                                   batch_size=self.config.embed_batch)

    def version(self) -> tuple[int, int, int]:
        """A cheap, hashable token that changes when another process changes this index: the
        manifest file's (inode, mtime in ns), replaced by a rename at every add and compact, and
        the catalog connection's SQLite ``data_version``, which moves when another connection
        commits (a remove). A stat and a pragma: microseconds. Compare tokens for equality only.
        Writes through this same `Index` move the manifest part but not ``data_version``."""
        st = (self.root / layout.MANIFEST).stat()
        return st.st_ino, st.st_mtime_ns, self.catalog.data_version()

    # -- inspection -----------------------------------------------------------------------------
    def documents(self) -> list[Document]:
        """All stored documents."""
        return self.catalog.documents()

    def stats(self) -> dict[str, Any]:
        """Counts, bytes on disk per component, embedder and config."""
        gen = layout.gen_dir(self.root, self.manifest["generation"])
        gen_files = {p.name: p.stat().st_size for p in sorted(gen.iterdir())}
        cat = sum(p.stat().st_size for p in self.root.glob(layout.CATALOG + "*"))
        return {
            "path": str(self.root),
            "storage": self.manifest["storage"],
            "gen_kind": self.manifest.get("gen_kind", "flat"),
            "slim_bytes": slim_bytes(gen) if self.manifest.get("gen_kind") == "slim" else None,
            "generation": self.manifest["generation"],
            "counts": {**self.catalog.counts(), "vectors": len(self.vectors),
                       "live_vectors": int(self.vectors.live.sum()),
                       "delta_parts": len(self.manifest["delta_parts"])},
            "bytes": {"catalog": cat, "generation": sum(gen_files.values()), "generation_files": gen_files,
                      "delta": layout.folder_bytes(self.root / layout.DELTA) if (self.root / layout.DELTA).exists()
                      else 0, "total": layout.folder_bytes(self.root)},
            "embedder": self.manifest["embedder"],
            "config": self.manifest["config"],
        }


#: What a create killed before its first manifest can leave in the folder: the catalog (and its
#: WAL files), the empty generation or its temp folder, a temp manifest, the writer lock.
_UNFINISHED = ("catalog.sqlite*", "gen-*", ".tmp-*", ".manifest.json.*", "delta", "writer.lock")


def _unfinished_index(folder: Path) -> bool:
    """True for an empty folder, or one holding only what an interrupted create leaves (no
    manifest yet), which ``overwrite`` may delete; anything else is someone's data."""
    return all(any(p.match(pat) for pat in _UNFINISHED) for p in folder.iterdir())
