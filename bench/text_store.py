"""The text store (issue 17, item 4): how many bytes an index folder takes per byte of the text its
documents yield, by part, before and after the compact catalog, and whether keyword search changed.

    python -m bench.text_store build --tag before --out DIR   # with the code under test on PYTHONPATH
    python -m bench.text_store upgrade --src DIR --out DIR2   # the new code: open, compact, measure
    python -m bench.text_store keyword --a DIR --b DIR2       # BM25 top-k of many queries, a against b
    python -m bench.text_store stores                         # the design choices, catalog only
    python -m bench.text_store details --legacy DIR --fresh DIR3 --out DIR4  # keyword index options

Corpora (``--corpora``):

- ``pydocs``: all paragraphs of the Python 3.11 documentation sources (`bench.datasets`), one
  source per paragraph: many tiny documents, the hardest case for per-document bookkeeping.
- ``pydocs_files``: the same documentation as its 497 files (``.rst.txt``), as a user would index
  the folder: long documents, chunks that overlap.
- ``disfl_qa``: the 1,204 distinct disfl_qa passages, one source per passage (as
  `bench.qa_workload` builds them).
- ``pydoc_modules``: the demo corpus (`slimrag.demo.MODULES` rendered by ``pydoc``), 38 long
  files: the case where chunks overlap (windows of 200 tokens overlapping by 40).

Text bytes: the UTF-8 bytes of the text each document yields (for these plain-text inputs, the
text given or the file's text). Vectors come from the default embedder (all-MiniLM-L6-v2) through
a cache kept in ``bench/data/emb-textstore-CORPUS.npz``, so the flat and slim builds, and the
before and after runs, embed each chunk once; the build times reported therefore exclude embedding
whenever the cache was warm (``cached`` in the JSON), which isolates what the catalog costs.

Writes JSON under ``bench/results/text_store-*.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

RESULTS = Path(__file__).resolve().parent / "results"
DATA = Path(__file__).resolve().parent / "data"
CORPORA = ("pydocs", "pydocs_files", "disfl_qa", "pydoc_modules")


# -- corpora --------------------------------------------------------------------------------------
def corpus(name: str) -> tuple[Any, int]:
    """(inputs for `Index.build`, text bytes the documents yield)."""
    if name == "pydocs":
        from bench.datasets import python_doc_paragraphs

        pairs = python_doc_paragraphs()
        return pairs, sum(len(t.encode()) for _, t in pairs)
    if name == "pydocs_files":
        from bench.datasets import python_docs_dir

        folder = python_docs_dir()
        files = sorted(folder.rglob("*.txt"))
        return folder, sum(len(f.read_text(encoding="utf-8", errors="replace").encode()) for f in files)
    if name == "disfl_qa":
        from bench.datasets import disfl_qa

        texts = sorted({x.context for x in disfl_qa()})
        pairs = [(f"disfl_qa/{i:04d}.txt", t) for i, t in enumerate(texts)]
        return pairs, sum(len(t.encode()) for _, t in pairs)
    if name == "pydoc_modules":
        from slimrag.demo import write_corpus

        folder = DATA / "pydoc_modules"
        write_corpus(folder)
        files = sorted(folder.glob("*.txt"))
        return folder, sum(len(f.read_text(encoding="utf-8").encode()) for f in files)
    raise SystemExit(f"unknown corpus {name!r}; choose from {', '.join(CORPORA)}")


# -- an embedder that remembers ------------------------------------------------------------------
def cached_embedder(name: str) -> Any:
    """The default embedder behind a text-keyed cache persisted in ``bench/data`` (same
    ``record()``, so the index opens later with the plain default embedder)."""
    from slimrag.embed.base import Embedder
    from slimrag.embed.registry import default_embedder

    inner = default_embedder()
    path = DATA / f"emb-textstore-{name}.npz"

    class Cached(Embedder):
        def __init__(self) -> None:
            self.inner = inner
            self.model_id, self.kind, self.batch_cap = inner.model_id, inner.kind, inner.batch_cap
            self.memo: dict[bytes, np.ndarray] = {}
            self.misses = 0
            if path.is_file():
                z = np.load(path)
                self.memo = dict(zip((k.tobytes() for k in z["keys"].view(np.uint8).reshape(-1, 20)), z["vecs"],
                                     strict=True))
            self.dim = inner.dim or (len(next(iter(self.memo.values()))) if self.memo else 0)

        def record(self) -> dict[str, Any]:
            return inner.record()

        def lengths(self, texts: Sequence[str]) -> np.ndarray:
            return inner.lengths(texts)

        def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
            keys = [hashlib.sha1(t.encode()).digest() for t in texts]
            todo = [i for i, k in enumerate(keys) if k not in self.memo]
            if todo:
                self.misses += len(todo)
                got = inner.embed_batch([texts[i] for i in todo])
                for i, v in zip(todo, got, strict=True):
                    self.memo[keys[i]] = np.asarray(v, np.float32)
                self.dim = got.shape[1]
            return np.stack([self.memo[k] for k in keys])

        def save(self) -> None:
            if not self.misses:
                return
            keys = np.frombuffer(b"".join(self.memo), dtype=np.uint8).reshape(-1, 20)  # S20 would drop trailing NULs
            tmp = path.with_suffix(".tmp.npz")
            np.savez(tmp, keys=keys, vecs=np.stack(list(self.memo.values())))
            tmp.rename(path)

    return Cached()


# -- measuring a folder ---------------------------------------------------------------------------
def folder_parts(root: Path) -> dict[str, int]:
    """Bytes on disk by part: catalog (with any WAL), generation folders, delta, the rest."""
    parts = {"catalog": 0, "generation": 0, "delta": 0, "other": 0}
    for p in root.rglob("*"):
        if not p.is_file():
            continue
        rel = p.relative_to(root).parts
        key = ("catalog" if rel[0].startswith("catalog.sqlite") else "generation" if rel[0].startswith("gen-")
               else "delta" if rel[0] == "delta" else "other")
        parts[key] += p.stat().st_size
    parts["total"] = sum(parts.values())
    return parts


def row(tag: str, name: str, storage: str, root: Path, text_bytes: int, seconds: float, **extra: Any) -> dict:
    from slimrag import Index

    with Index.open(root) as idx:
        counts = idx.catalog.counts()
    parts = folder_parts(root)
    return {"tag": tag, "corpus": name, "storage": storage, "path": str(root), "text_bytes": text_bytes,
            "documents": counts["documents"], "chunks": counts["chunks"], "bytes": parts,
            "ratio": parts["total"] / text_bytes, "catalog_ratio": parts["catalog"] / text_bytes,
            "seconds": round(seconds, 2), **extra}


def cmd_build(args: argparse.Namespace) -> list[dict]:
    from slimrag import Index

    rows = []
    for name in args.corpora:
        inputs, text_bytes = corpus(name)
        emb = cached_embedder(name)
        cached = not emb.misses and bool(emb.memo)
        for storage in args.storage:
            out = Path(args.out) / f"{name}-{storage}.slimrag"
            t0 = time.perf_counter()
            Index.build(inputs, out, storage=storage, embedder=emb, overwrite=True).close()
            dt = time.perf_counter() - t0
            emb.save()
            rows.append(row(args.tag, name, storage, out, text_bytes, dt, cached=cached and not emb.misses))
            cached = True
            print(json.dumps(rows[-1]), flush=True)
    return rows


def cmd_upgrade(args: argparse.Namespace) -> list[dict]:
    """Copy each index of ``--src`` to ``--out``, open it with this code and compact it."""
    from slimrag import Index

    rows = []
    for name in args.corpora:
        _, text_bytes = corpus(name)
        for storage in args.storage:
            src = Path(args.src) / f"{name}-{storage}.slimrag"
            out = Path(args.out) / src.name
            if out.exists():
                shutil.rmtree(out)
            shutil.copytree(src, out)
            t0 = time.perf_counter()
            with Index.open(out, cached_embedder(name)) as idx:
                idx.compact()
                idx.catalog.upgrade()  # the catalog's own upgrade, for indexes whose compact does not
            rows.append(row(args.tag, name, storage, out, text_bytes, time.perf_counter() - t0))
            print(json.dumps(rows[-1]), flush=True)
    return rows


def queries(name: str, n: int, seed: int = 0) -> list[str]:
    """Seeded keyword queries: 4 to 12 words cut from random chunks' texts, plus single words."""
    import random

    inputs, _ = corpus(name)
    rng = random.Random(seed)
    texts = [t for _, t in inputs] if isinstance(inputs, list) else \
        [p.read_text(encoding="utf-8", errors="replace") for p in sorted(Path(inputs).rglob("*.txt"))]
    out = []
    for _ in range(n):
        words = rng.choice(texts).split()
        a = rng.randrange(max(1, len(words) - 4))
        out.append(" ".join(words[a: a + rng.randint(1, 12)]))
    return out


def cmd_keyword(args: argparse.Namespace) -> list[dict]:
    """Compare `Index.search(mode="keyword")` of two folders of the same corpus on many queries."""
    from slimrag import Index

    rows = []
    for name in args.corpora:
        for storage in args.storage:
            a, b = (Path(x) / f"{name}-{storage}.slimrag" for x in (args.a, args.b))
            qs = queries(name, args.queries)
            same = ties = 0
            times = {"a": 0.0, "b": 0.0}
            with Index.open(a) as ia, Index.open(b) as ib:
                for q in qs:
                    t0 = time.perf_counter()
                    ra = ia.catalog.keyword_search(q, args.k)
                    t1 = time.perf_counter()
                    rb = ib.catalog.keyword_search(q, args.k)
                    times["a"] += t1 - t0
                    times["b"] += time.perf_counter() - t1
                    if ra == rb:
                        same += 1
                    elif [round(s, 9) for _, s in ra] == [round(s, 9) for _, s in rb]:
                        ties += 1  # same scores, equal-score rows in another order
            rows.append({"corpus": name, "storage": storage, "queries": len(qs), "k": args.k,
                         "identical": same, "same_scores_other_tie_order": ties,
                         "ms_per_query_a": 1000 * times["a"] / len(qs), "ms_per_query_b": 1000 * times["b"] / len(qs)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def prepared(name: str) -> tuple[list[Any], int]:
    """The corpus read, hashed and chunked as `Index.add` does it (no embedding)."""
    from slimrag.config import IndexConfig
    from slimrag.ingest.chunker import default_chunker
    from slimrag.ingest.source import PreparedDoc, iter_inputs, prepare

    inputs, text_bytes = corpus(name)
    cfg = IndexConfig()
    chunker = default_chunker(cfg.chunk_tokens, cfg.chunk_overlap)
    root = Path(inputs) if isinstance(inputs, Path) else None
    docs = [d for d in (prepare(i, None, chunker) for i in iter_inputs(inputs, root, cfg.ignore,
                                                                        cfg.max_file_bytes, []))
            if isinstance(d, PreparedDoc) and d.pieces]
    return docs, text_bytes


def write_catalog(path: Path, docs: list[Any], layout: str) -> float:
    """Write ``docs`` into a new catalog in commits of 2,048 chunks (the writer's); seconds."""
    import sqlite3

    from slimrag.catalog import Catalog
    from slimrag.catalog.schema import LEGACY_SCHEMA
    from slimrag.types import Chunk, Document

    for p in path.parent.glob(path.name + "*"):
        p.unlink()
    if layout == "legacy":
        db = sqlite3.connect(path)
        db.executescript(LEGACY_SCHEMA)
        db.close()
    t0 = time.perf_counter()
    cat = Catalog(path, keyword_detail=layout.partition("-")[2] or "none")
    next_id, batch = 0, []
    for d in docs:
        chunks = [Chunk(next_id + i, d.doc_id, d.source, i, p.text, {**p.metadata, "ordinal": i})
                  for i, p in enumerate(d.pieces)]
        next_id += len(chunks)
        batch.append((Document(d.doc_id, d.source, d.mtime, d.size), chunks))
        if sum(len(c) for _, c in batch) >= 2048 or d is docs[-1]:
            with cat.transaction():
                for doc, _ in batch:
                    cat.put_document(doc)
                cat.put_chunks([c for _, cs in batch for c in cs])
            batch = []
    cat.upgrade() if layout != "legacy" else None  # what compaction does: merge, vacuum
    dt = time.perf_counter() - t0
    cat.close()
    return dt


def cmd_stores(args: argparse.Namespace) -> list[dict]:
    """Catalog only: the legacy layout against the compact one (FTS5 detail none and full, and
    the postings index): bytes by part, write seconds, keyword latency and top-k identity
    (ids and scores) against legacy."""
    from slimrag.catalog import Catalog

    rows = []
    work = Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    for name in args.corpora:
        docs, text_bytes = prepared(name)
        chunk_bytes = sum(len(p.text.encode()) for d in docs for p in d.pieces)
        qs = queries(name, args.queries)
        ref: list[list[tuple[int, float]]] = []
        for layout in ("legacy", *args.layouts):
            path = work / f"{name}-{layout}.sqlite"
            secs = write_catalog(path, docs, layout)
            cat = Catalog(path)
            parts = cat.part_bytes()
            t0 = time.perf_counter()
            got = [cat.keyword_search(q, args.k) for q in qs]
            ms = 1000 * (time.perf_counter() - t0) / len(qs)
            ref = ref or got
            cat.close()
            rows.append({"corpus": name, "layout": layout, "documents": len(docs), "chunks": sum(len(d.pieces) for d in docs),
                         "text_bytes": text_bytes, "chunk_text_bytes": chunk_bytes, "file_bytes": path.stat().st_size,
                         "parts": parts, "ratio": path.stat().st_size / text_bytes, "write_s": round(secs, 2),
                         "keyword_ms": round(ms, 2), "queries": len(qs),
                         "same_topk_as_legacy": sum(a == b for a, b in zip(ref, got, strict=True))})
            print(json.dumps(rows[-1]), flush=True)
    return rows


#: keyword-index variants of `cmd_details`: name -> (FTS5 detail, columnsize)
VARIANTS = {"full": ("full", True), "none+cs": ("none", True), "none": ("none", False), "column+cs": ("column", True)}


def cmd_details(args: argparse.Namespace) -> list[dict]:
    """The keyword index's FTS5 options, side by side on whole folders: each variant is a copy of
    the fresh slim folder (``--fresh``) with its keyword index recreated (`VARIANTS`), merged and
    vacuumed; the legacy folder (``--legacy``) is the reference. Queries run interleaved (each
    query on every catalog in turn, the order rotating), so load changes hit all alike."""
    import sqlite3

    from slimrag.catalog import Catalog
    from slimrag.catalog.upgrade import set_keyword_detail

    rows = []
    for name in args.corpora:
        _, text_bytes = corpus(name)
        legacy = Path(args.out) / f"{name}-legacy.slimrag"  # a copy: opening must not change the original
        if legacy.exists():
            shutil.rmtree(legacy)
        shutil.copytree(Path(args.legacy) / f"{name}-slim.slimrag", legacy)
        folders = {"legacy": legacy}
        for var, (detail, colsize) in VARIANTS.items():
            out = Path(args.out) / f"{name}-{var}.slimrag"
            if out.exists():
                shutil.rmtree(out)
            shutil.copytree(Path(args.fresh) / f"{name}-slim.slimrag", out)
            cat = Catalog(out / "catalog.sqlite")
            with cat.transaction():
                set_keyword_detail(cat.db, detail, colsize)
                cat.db.execute("INSERT INTO chunks_fts(chunks_fts) VALUES('optimize')")
            cat.db.execute("VACUUM")
            cat.close()
            folders[var] = out
        qs = queries(name, args.queries)
        cats = {v: Catalog(p / "catalog.sqlite") for v, p in folders.items()}
        for c in cats.values():  # warm: page cache and decoded blocks
            for q in qs[:20]:
                c.keyword_search(q, args.k)
        times: dict[str, list[float]] = {v: [] for v in cats}
        got: dict[str, list[Any]] = {v: [] for v in cats}
        order = list(cats)
        for i, q in enumerate(qs):
            for v in order[i % len(order):] + order[: i % len(order)]:
                t0 = time.perf_counter()
                got[v].append(cats[v].keyword_search(q, args.k))
                times[v].append(time.perf_counter() - t0)
        for c in cats.values():
            c.close()
        base = float(np.median(times["legacy"]))
        for v, p in folders.items():
            parts = folder_parts(p)
            with sqlite3.connect(p / "catalog.sqlite") as db:
                fts = db.execute("SELECT sql FROM sqlite_schema WHERE name='chunks_fts'").fetchone()[0]
            t = np.array(times[v]) * 1000
            rows.append({"corpus": name, "variant": v, "fts5": fts.split("USING", 1)[1].strip(),
                         "text_bytes": text_bytes, "bytes": parts, "ratio": parts["total"] / text_bytes,
                         "catalog_ratio": parts["catalog"] / text_bytes, "queries": len(qs), "k": args.k,
                         "median_ms": round(float(np.median(t)), 2), "p95_ms": round(float(np.percentile(t, 95)), 2),
                         "median_vs_legacy": round(float(np.median(t)) / 1000 / base, 2),
                         "same_topk_as_legacy": sum(a == b for a, b in zip(got["legacy"], got[v], strict=True))})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--tag", required=True)
    b.add_argument("--out", required=True)
    u = sub.add_parser("upgrade")
    u.add_argument("--tag", default="upgraded")
    u.add_argument("--src", required=True)
    u.add_argument("--out", required=True)
    k = sub.add_parser("keyword")
    k.add_argument("--a", required=True)
    k.add_argument("--b", required=True)
    k.add_argument("--queries", type=int, default=500)
    k.add_argument("--k", type=int, default=10)
    st = sub.add_parser("stores")
    st.add_argument("--tag", default="stores")
    st.add_argument("--out", default=str(DATA / "text_store_catalogs"))
    st.add_argument("--queries", type=int, default=200)
    st.add_argument("--k", type=int, default=10)
    st.add_argument("--layouts", type=lambda s: s.split(","), default=["compact-none", "compact-full", "compact-postings"],
                    help="compared with legacy, which always runs first")
    dt = sub.add_parser("details")
    dt.add_argument("--tag", default="details")
    dt.add_argument("--legacy", required=True, help="folder of legacy slim indexes (build under the old code)")
    dt.add_argument("--fresh", required=True, help="folder of slim indexes built by this code")
    dt.add_argument("--out", required=True)
    dt.add_argument("--queries", type=int, default=300)
    dt.add_argument("--k", type=int, default=10)
    for p in (b, u, k, st, dt):
        p.add_argument("--corpora", type=lambda s: s.split(","), default=list(CORPORA))
        p.add_argument("--storage", type=lambda s: s.split(","), default=["flat", "slim"])
    args = ap.parse_args(argv)
    load0 = os.getloadavg()
    rows = {"build": cmd_build, "upgrade": cmd_upgrade, "keyword": cmd_keyword, "stores": cmd_stores,
            "details": cmd_details}[args.cmd](args)
    RESULTS.mkdir(exist_ok=True)
    tag = getattr(args, "tag", "keyword")
    out = RESULTS / f"text_store-{args.cmd}-{tag}.json"
    out.write_text(json.dumps({"rows": rows, "load_before": load0, "load_after": os.getloadavg(),
                               "python": sys.version.split()[0], "machine": platform.machine()}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
