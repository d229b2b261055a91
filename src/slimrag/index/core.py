"""`Index`: the public face of one index folder — build, open, add, remove, compact, search.

Every write follows the same path (see `slimrag.index.layout` for the on-disk rules):
read and hash files → skip unchanged ones → parse and chunk → embed in batches → in one SQLite
transaction: replace changed documents, insert chunks → write a delta part → switch the manifest
→ commit. `build` is "create an empty index, add, compact", so a build and an incremental add
share one code path and one set of tests. Everything from "skip unchanged" on is `Index.write`,
which also takes documents chunked and embedded elsewhere (`slimrag.index.distributed` feeds it
from a Ray cluster), so dedup, chunk ids and crash safety do not depend on where the work ran.

Search reads vectors from the current generation plus the delta parts; removed chunks are masked
until `compact` writes a generation holding only live vectors.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from slimrag.catalog import Catalog
from slimrag.config import IndexConfig, SearchConfig
from slimrag.embed.base import Embedder
from slimrag.errors import IndexFormatError
from slimrag import files
from slimrag.index import layout
from slimrag.index.flat import FlatVectors
from slimrag.index.slim import SlimArtifacts, SlimConfig, build_slim, slim_bytes
from slimrag.index.slim.store import SlimVectors
from slimrag.ingest.chunker import Chunker, ChunkText, default_chunker
from slimrag.ingest.crawl import Skipped
from slimrag.ingest.source import Inputs, PreparedDoc, iter_inputs, prepare
from slimrag.types import Chunk, Document, Hit

log = logging.getLogger("slimrag.index")

#: chunks embedded and committed per transaction during add/build; bounds memory for big folders
COMMIT_CHUNKS = 2048


@dataclass
class AddReport:
    """What an `add` (or `build`) did."""

    added: int = 0
    updated: int = 0
    unchanged: int = 0
    chunks: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    seconds: float = 0.0

    def skip(self, source: str, reason: str) -> None:
        """Record a document passed over, with one warning line (the same wherever it was parsed)."""
        log.warning("skipped %s: %s", source, reason)
        self.skipped.append(Skipped(source, reason))


def embed_input(chunk: Chunk | ChunkText) -> str:
    """The text the embedder sees for a chunk: its heading (when not already at the start) and text.
    One function, so the slim index's recomputation embeds exactly what the build embedded."""
    heading = chunk.metadata.get("heading") or ""
    if heading and not chunk.text.lstrip("# ").startswith(heading):
        return f"{heading}\n{chunk.text}"
    return chunk.text


def _embedder_record(embedder: Embedder) -> dict[str, Any]:
    rec: dict[str, Any] = {"id": embedder.model_id, "dim": int(embedder.dim), "normalized": True,
                           "kind": "remote" if embedder.model_id.startswith("remote:") else "local"}
    for attr in ("base_url", "model"):
        if hasattr(embedder, attr):
            rec[attr] = getattr(embedder, attr)
    return rec


def _default_embedder(rec: dict[str, Any] | None) -> Embedder:
    if rec and rec.get("kind") == "remote":
        from slimrag.embed.remote import RemoteEmbedder

        return RemoteEmbedder(rec["base_url"], rec["model"], dim=rec.get("dim"))
    from slimrag.embed.local import LocalEmbedder

    return LocalEmbedder()


class Index:
    """One index folder. Not thread-safe for writes; open one `Index` per thread for reads."""

    def __init__(self, root: Path, embedder: Embedder | None = None) -> None:
        self.root = Path(root)
        self.manifest = layout.read_manifest(self.root)
        self.config = IndexConfig(**{k: tuple(v) if k == "ignore" else v
                                     for k, v in self.manifest["config"].items()})
        rec = self.manifest["embedder"]
        self.embedder = embedder if embedder is not None else _default_embedder(rec)
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
               slim: SlimConfig | None = None) -> Index:
        """Create an empty index folder."""
        out = Path(out)
        if out.exists():
            if not overwrite:
                raise IndexFormatError(f"{out} already exists; use `add` to update it or overwrite=True")
            if not (out / layout.MANIFEST).is_file() and any(out.iterdir()):
                raise IndexFormatError(f"{out} is a non-empty folder that is not an index; refusing to delete it")
            shutil.rmtree(out)
        config = config or IndexConfig()
        embedder = embedder or _default_embedder(None)
        if not embedder.dim:
            embedder.embed_batch(["dimension probe"])
        out.mkdir(parents=True)
        Catalog(out / layout.CATALOG).close()
        layout.write_generation(out, 0, {"ids": layout.narrow_ids(np.zeros(0, np.int64)),
                                         "vectors": np.zeros((0, embedder.dim), config.dtype)})
        now = time.time()
        files.write_json_atomic(out / layout.MANIFEST, {
            "format": layout.FORMAT_VERSION, "storage": config.storage, "gen_kind": "flat",
            "slim": (slim or SlimConfig()).to_dict(), "embedder": _embedder_record(embedder),
            "config": asdict(config), "generation": 0, "delta_parts": [], "next_chunk_id": 0, "next_part": 0,
            "source_root": str(Path(source_root).resolve()) if source_root else None,
            "created": now, "updated": now,
        })
        return cls(out, embedder)

    @classmethod
    def build(cls, source: Inputs, out: str | Path, *, storage: str | None = None, embedder: Embedder | None = None,
              config: IndexConfig | None = None, overwrite: bool = False,
              slim: SlimConfig | None = None) -> Index:
        """Build an index at ``out`` from a folder, files, or ``(source, text)`` pairs, then compact it.
        storage: "flat" (exact vectors), "slim" (graph + PQ codes, embeddings recomputed at query
        time), or "auto" (slim from ``IndexConfig.auto_slim_chunks`` chunks on)."""
        config = config or IndexConfig(storage=storage or "flat")
        if storage is not None and storage != config.storage:
            config = IndexConfig(**{**asdict(config), "storage": storage})
        root = Path(source) if isinstance(source, (str, Path)) and Path(source).is_dir() else None
        idx = cls.create(out, embedder=embedder, config=config, source_root=root, overwrite=overwrite, slim=slim)
        idx.last_report = idx.add(source)
        idx.compact()
        return idx

    @classmethod
    def open(cls, path: str | Path, embedder: Embedder | None = None) -> Index:
        """Open an existing index folder (vectors are memory-mapped; the embedder loads on first query)."""
        return cls(Path(path), embedder)

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
        d_ids, d_vecs = layout.read_delta_parts(self.root, self.manifest["delta_parts"])
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
        self.vectors.set_live(np.asarray(self.catalog.live_ids(), dtype=np.int64))

    def _recompute(self, chunk_ids: np.ndarray) -> np.ndarray:
        """Exact embeddings of stored chunks, recomputed from their text (the slim index keeps none)."""
        chunks = self.catalog.chunks(chunk_ids)
        missing = [int(i) for i in chunk_ids if int(i) not in chunks]
        if missing:
            raise IndexFormatError(f"chunks {missing[:5]} are in the index but not in the catalog; run compact()")
        return self.embedder.embed([embed_input(chunks[int(i)]) for i in chunk_ids],
                                   batch_size=self.config.embed_batch)

    def _live_vectors(self) -> tuple[np.ndarray, np.ndarray]:
        """(chunk ids, exact float32 vectors) of every live row, sorted by id. A slim generation has
        no stored vectors, so its live rows are re-embedded here, in batches."""
        v = self.vectors
        if isinstance(v, FlatVectors):
            ids, vecs = v.ids[v.live], np.asarray(v.vectors)[v.live].astype(np.float32)
        else:
            gen_ids = v.gen_ids[v.live[: v.n_gen]]
            parts = [self._recompute(gen_ids[s: s + COMMIT_CHUNKS]) for s in range(0, len(gen_ids), COMMIT_CHUNKS)]
            d_live = v.live[v.n_gen:]
            ids = np.concatenate([gen_ids, v.delta.ids[d_live]])
            vecs = np.concatenate([*parts, np.asarray(v.delta.vectors, dtype=np.float32)[d_live]]) if len(ids) \
                else np.zeros((0, self.embedder.dim), np.float32)
        order = np.argsort(ids, kind="stable")
        return ids[order], vecs[order]

    @property
    def chunker(self) -> Chunker:
        if self._chunker is None:
            self._chunker = default_chunker(self.config.chunk_tokens, self.config.chunk_overlap)
        return self._chunker

    # -- updates --------------------------------------------------------------------------------
    def add(self, inputs: Inputs) -> AddReport:
        """Add or update documents. Unchanged files (same content hash at the same source) are
        skipped; changed ones are replaced. Bad files are skipped with one warning each."""
        report = AddReport()
        return self.write(self._prepare(inputs, report), report)

    def _prepare(self, inputs: Inputs, report: AddReport) -> Iterator[PreparedDoc]:
        """Read, hash and chunk inputs lazily; an unchanged document is passed on unparsed."""
        root = Path(self.manifest["source_root"]) if self.manifest.get("source_root") else None
        for item in iter_inputs(inputs, root, self.config.ignore, self.config.max_file_bytes, report.skipped):
            doc = prepare(item, self.stored_doc_id(item.source), self.chunker)
            if isinstance(doc, Skipped):
                report.skip(doc.source, doc.reason)
            else:
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
        Raises ValueError for vectors of the wrong shape."""
        t0 = time.perf_counter()
        report = report if report is not None else AddReport()
        dim = int(self.manifest["embedder"]["dim"])
        pending: list[tuple[Document, bool, list[Chunk], np.ndarray | None]] = []
        n_pending = 0
        next_id = max(self.manifest["next_chunk_id"], self.catalog.max_chunk_id() + 1)
        seen: set[str] = set()
        for d in docs:
            if d.source in seen:
                continue
            seen.add(d.source)
            old_id = self.stored_doc_id(d.source)
            if old_id == d.doc_id:
                report.unchanged += 1
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

    def _commit(self, docs: list[tuple[Document, bool, list[Chunk], np.ndarray | None]], next_id: int,
                report: AddReport) -> None:
        chunks = [c for _, _, cs, _ in docs for c in cs]
        todo = [embed_input(c) for _, _, cs, v in docs if v is None for c in cs]
        fresh = self.embedder.embed(todo, batch_size=self.config.embed_batch) if todo else None
        parts, used = [], 0
        for _, _, cs, v in docs:  # given vectors where a document has them, fresh ones in order otherwise
            if v is None:
                assert fresh is not None
                v, used = fresh[used: used + len(cs)], used + len(cs)
            parts.append(v)
        vecs = np.concatenate(parts)
        ids = np.array([c.chunk_id for c in chunks], dtype=np.int64)
        self.catalog.begin()
        try:
            for doc, replaced, _, _ in docs:
                if replaced:
                    self.catalog.delete_document(doc.source)
                self.catalog.put_document(doc)
            self.catalog.put_chunks(chunks)
            part = layout.write_delta_part(self.root, self.manifest["next_part"], ids,
                                           vecs.astype(self.config.dtype))
            manifest = {**self.manifest, "delta_parts": [*self.manifest["delta_parts"], part],
                        "next_part": self.manifest["next_part"] + 1, "next_chunk_id": next_id,
                        "updated": time.time()}
            files.write_json_atomic(self.root / layout.MANIFEST, manifest)
            self.catalog.commit()
        except BaseException:
            self.catalog.rollback()
            raise
        self.manifest = manifest
        report.added += sum(1 for _, r, _, _ in docs if not r)
        report.updated += sum(1 for _, r, _, _ in docs if r)
        report.chunks += len(chunks)
        self._load_vectors()

    def remove(self, sources: str | Sequence[str]) -> int:
        """Remove documents by source (as stored, see `documents()`); returns chunks removed.
        Their vectors are masked at once and dropped at the next `compact`."""
        sources = [sources] if isinstance(sources, str) else list(sources)
        removed: list[int] = []
        self.catalog.begin()
        try:
            for s in sources:
                removed += self.catalog.delete_document(s)
            self.catalog.commit()
        except BaseException:
            self.catalog.rollback()
            raise
        self.vectors.set_live(np.asarray(self.catalog.live_ids(), dtype=np.int64))
        return len(removed)

    def compact(self) -> None:
        """Write a new generation holding only live chunks (current generation + delta), switch
        the manifest atomically, then delete what the old manifest named. A crash at any point
        leaves the previous generation in use and no chunk lost.

        The kind follows ``IndexConfig.storage`` ("auto": slim from ``auto_slim_chunks`` live
        chunks on). Building a slim generation needs every live vector once: delta rows have them,
        rows of a previous slim generation are re-embedded (the price of storing no embeddings)."""
        ids, vecs = self._live_vectors()
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
        manifest = {**self.manifest, "generation": gen, "gen_kind": storage, "delta_parts": [],
                    "updated": time.time()}
        files.write_json_atomic(self.root / layout.MANIFEST, manifest)
        self.manifest = manifest
        self.catalog.clear_tombstones()
        layout.collect_garbage(self.root, manifest)
        self._load_vectors()

    # -- search ---------------------------------------------------------------------------------
    def search(self, query: str, k: int = 5, mode: str = "vector", source: str | None = None,
               config: SearchConfig | None = None) -> list[Hit]:
        """Top-k chunks for ``query``. mode: "vector", "keyword" or "hybrid" (reciprocal rank fusion);
        source: optional glob on the stored source path (``docs/*.md``)."""
        cfg = config or SearchConfig(k=k, mode=mode)
        if cfg.mode == "keyword":
            ranked = self.catalog.keyword_search(query, cfg.k, source)
        elif cfg.mode == "vector":
            ranked = self._vector(query, cfg.k, source)
        else:
            n = max(cfg.candidates, cfg.k)
            ranked = rrf([self._vector(query, n, source), self.catalog.keyword_search(query, n, source)],
                         cfg.rrf_k)[: cfg.k]
        return self._hits(ranked)

    def search_batch(self, queries: Sequence[str], k: int = 5, source: str | None = None) -> list[list[Hit]]:
        """Vector search for many queries at once: one embedder call, and for a slim index one
        recomputation batch per rerank wave shared by all queries."""
        ranked = self._vectors(list(queries), k, source)
        return [self._hits(r) for r in ranked]

    def _vector(self, query: str, k: int, source: str | None) -> list[tuple[int, float]]:
        return self._vectors([query], k, source)[0]

    def _vectors(self, queries: list[str], k: int, source: str | None) -> list[list[tuple[int, float]]]:
        q = self.embedder.embed(queries)
        allow = None
        if source is not None:
            allow = np.isin(self.vectors.ids, np.asarray(self.catalog.live_ids(source), dtype=np.int64))
        ids, scores = self.vectors.search(q, k, allow)
        return [[(int(i), float(s)) for i, s in zip(ids[r], scores[r], strict=True)] for r in range(len(queries))]

    def _hits(self, ranked: list[tuple[int, float]]) -> list[Hit]:
        chunks = self.catalog.chunks([i for i, _ in ranked])
        return [Hit(i, s, chunks[i].text, chunks[i].source, chunks[i].metadata) for i, s in ranked if i in chunks]

    # -- inspection -----------------------------------------------------------------------------
    def documents(self) -> list[Document]:
        """All stored documents."""
        return self.catalog.documents()

    def stats(self) -> dict[str, Any]:
        """Counts, bytes on disk per component, embedder and config."""
        gen = layout.gen_dir(self.root, self.manifest["generation"])
        files = {p.name: p.stat().st_size for p in sorted(gen.iterdir())}
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
            "bytes": {"catalog": cat, "generation": sum(files.values()), "generation_files": files,
                      "delta": layout.folder_bytes(self.root / layout.DELTA) if (self.root / layout.DELTA).exists()
                      else 0, "total": layout.folder_bytes(self.root)},
            "embedder": self.manifest["embedder"],
            "config": self.manifest["config"],
        }


def rrf(lists: list[list[tuple[int, float]]], k: int = 60) -> list[tuple[int, float]]:
    """Reciprocal rank fusion: score(d) = sum over lists of 1 / (k + rank), rank from 1.
    Ties are broken by chunk id so the fused order is deterministic."""
    scores: dict[int, float] = {}
    for ranked in lists:
        for rank, (cid, _) in enumerate(ranked, 1):
            scores[cid] = scores.get(cid, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
