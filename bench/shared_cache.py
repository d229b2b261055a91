"""Benchmark: the slim recompute cache across handles, one per generation per process (issue 32).

``python -m bench.shared_cache [--docs 3000] [--queries 60]``

A slim index of ``--docs`` short documents (`bench.crash.docs`, embedded by `bench.crash.HashEmbedder`:
row counts do not depend on the embedder, and this one costs nothing), then ``--queries`` vector
searches in four steps, counting the rows each step re-embeds (texts embedded less the queries):

1. ``first``: a fresh handle, cold cache;
2. ``again``: the same queries on the same handle (the cache as it always worked);
3. ``after add, shared``: another handle adds 5 documents (a delta part; the generation stays),
   then a new handle is opened, as a server worker does when the index changed on disk, and runs the
   same queries: it shares the generation's cache (`slimrag.index.store.slim.vcache.shared`);
4. ``after add, private``: the same, with a cache of its own, as every reopen had before.

Prints a table and writes ``bench/results/shared_cache.json``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.crash import HashEmbedder, docs
from slimrag.index.core import Index
from slimrag.index.store.slim import PQConfig, SlimConfig, vcache

RESULTS = Path(__file__).resolve().parent / "results" / "shared_cache.json"


class Counting(HashEmbedder):
    """`HashEmbedder` counting the texts it embeds."""

    def __init__(self) -> None:
        super().__init__()
        self.texts = 0
        self._lock = threading.Lock()

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            self.texts += len(texts)
        return super().embed_batch(texts)


def run_step(idx: Index, emb: Counting, queries: list[str]) -> dict[str, float]:
    before, t0 = emb.texts, time.perf_counter()
    for q in queries:
        idx.search(q, k=10, mode="vector")
    return {"rows_recomputed": emb.texts - before - len(queries), "seconds": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=3000)
    ap.add_argument("--queries", type=int, default=60)
    args = ap.parse_args()
    queries = [f"uniq{i} a{i}" for i in range(0, args.docs, max(1, args.docs // args.queries))][: args.queries]
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "i"
        Index.build(docs("a", args.docs, 1), root, embedder=HashEmbedder(), storage="slim",
                    slim=SlimConfig(pq=PQConfig(m=16))).close()
        emb = Counting()
        with Index.open(root, emb) as idx:
            rows["first"] = run_step(idx, emb, queries)
            rows["again"] = run_step(idx, emb, queries)
            with Index.open(root, HashEmbedder()) as writer:
                writer.add([(f"b/{i}.txt", f"{i}{i}{i}{i} 0000 9999 {i}") for i in range(5)])
            with Index.open(root, emb) as reopened:
                rows["after add, shared"] = run_step(reopened, emb, queries)
            real = vcache.shared
            vcache.shared = lambda folder, build, budget, dim: vcache.VectorCache(budget, dim)  # as before: private
            try:
                with Index.open(root, emb) as private:
                    rows["after add, private"] = run_step(private, emb, queries)
            finally:
                vcache.shared = real
    print(f"{'step':<22} {'rows recomputed':>16} {'seconds':>9}")
    for name, r in rows.items():
        print(f"{name:<22} {int(r['rows_recomputed']):>16} {r['seconds']:>9.3f}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"docs": args.docs, "queries": len(queries), "steps": rows}, indent=1))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
