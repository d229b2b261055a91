"""Benchmark: the slim recompute cache of a served index across another process's ``add`` (issue 32).

``python -m bench.shared_cache [--docs 3000] [--queries 60] [--threads 8]``

A slim index of ``--docs`` short documents (`bench.crash.docs`, embedded by `bench.crash.HashEmbedder`:
row counts do not depend on the embedder, and this one costs nothing), then ``--queries`` vector
searches, run from ``--threads`` threads at once, in steps, counting the rows each step re-embeds
(texts embedded less the queries):

1. ``first``: the one index a session holds (`slimrag.rag.session`), cold cache;
2. ``again``: the same queries on it (the cache as it always worked);
3. ``after add, caught up``: ANOTHER PROCESS adds 5 documents (a delta part; the generation stays);
   the session's index catches up in place (`Index.catch_up`) and runs the same queries: the same
   searcher and cache (what ``serve`` and ``mcp`` do now);
4. ``after add, reopened``: a handle opened again after the add, as each server worker did before
   the session: it finds the generation's cache in the process (`vcache.shared`), but builds a
   searcher of its own (its unpacked codes, once per handle);
5. ``after add, private``: a reopen with a cache of its own, as every reopen had before both;
6. ``after add, a handle per thread``: what ``serve``'s search pool did before the session: each
   of the ``--threads`` threads opens its own handle after the add (sharing the process's cache)
   and searches its share of the queries; the seconds include the opens.

With ``--repeats N`` (default 5) the warm steps after the add (caught up, reopened, a handle per
thread) run N more times in turn, and the table's seconds are each one's median (load is noisy:
compare them as ratios of one run). Prints a table and writes ``bench/results/shared_cache.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from bench.crash import HashEmbedder, docs
from slimrag.index.core import Index
from slimrag.index.store.slim import PQConfig, SlimConfig, vcache
from slimrag.rag.session import Session

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


REPO = Path(__file__).resolve().parents[1]
#: the other process: ``slimrag add`` of 5 documents far from every query
ADD = ("import sys; from bench.crash import HashEmbedder; from slimrag.index.core import Index\n"
       "with Index.open(sys.argv[1], HashEmbedder()) as idx:\n"
       "    idx.add([(f'b/{i}.txt', f'{i}{i}{i}{i} 0000 9999 {i}') for i in range(5)])\n")


#: the warm steps after the add whose seconds are compared (medians over ``--repeats``)
WARM = ("after add, caught up", "after add, reopened", "after add, a handle per thread")


def run_step(idx: Index, emb: Counting, queries: list[str], threads: int = 1) -> dict[str, float]:
    """The queries' vector searches on ``idx`` from ``threads`` threads: rows recomputed, seconds."""
    before, t0 = emb.texts, time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda q: idx.search(q, k=10, mode="vector"), queries))
    return {"rows_recomputed": emb.texts - before - len(queries), "seconds": time.perf_counter() - t0}


def per_thread_step(root: Path, emb: Counting, queries: list[str], threads: int) -> dict[str, float]:
    """Step 6 of the module header: a handle per thread, opened after the add, as workers did."""
    before, t0 = emb.texts, time.perf_counter()

    def worker(share: list[str]) -> None:
        with Index.open(root, emb) as own:
            for q in share:
                own.search(q, k=10, mode="vector")

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(worker, [queries[i::threads] for i in range(threads)]))
    return {"rows_recomputed": emb.texts - before - len(queries), "seconds": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=3000)
    ap.add_argument("--queries", type=int, default=60)
    ap.add_argument("--threads", type=int, default=8, help="searches at once (serve's search pool)")
    ap.add_argument("--repeats", type=int, default=5, help="turns of the warm steps after the add (medians)")
    args = ap.parse_args()
    queries = [f"uniq{i} a{i}" for i in range(0, args.docs, max(1, args.docs // args.queries))][: args.queries]
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "i"
        Index.build(docs("a", args.docs, 1), root, embedder=HashEmbedder(), storage="slim",
                    slim=SlimConfig(pq=PQConfig(m=16))).close()
        emb = Counting()
        session = Session(Index.open(root, emb))
        idx = session.current()
        searcher = idx.state.vectors.searcher
        rows["first"] = run_step(idx, emb, queries, args.threads)
        rows["again"] = run_step(idx, emb, queries, args.threads)
        subprocess.run([sys.executable, "-c", ADD, str(root)], check=True, cwd=REPO)
        caught_up = session.current()  # the catch-up: the new delta part mapped in place
        assert caught_up is idx and idx.state.vectors.searcher is searcher and len(idx.state.vectors) > args.docs
        rows["after add, caught up"] = run_step(idx, emb, queries, args.threads)
        with Index.open(root, emb) as reopened:
            rows["after add, reopened"] = run_step(reopened, emb, queries, args.threads)
        real = vcache.shared
        vcache.shared = lambda folder, build, budget, dim: vcache.VectorCache(budget, dim)  # as before: private
        try:
            with Index.open(root, emb) as private:
                rows["after add, private"] = run_step(private, emb, queries, args.threads)
        finally:
            vcache.shared = real
        rows["after add, a handle per thread"] = per_thread_step(root, emb, queries, args.threads)
        turns: dict[str, list[float]] = {k: [rows[k]["seconds"]] for k in WARM}
        for _ in range(args.repeats):  # in turn, so that load drifting hits each alike
            turns[WARM[0]].append(run_step(idx, emb, queries, args.threads)["seconds"])
            with Index.open(root, emb) as reopened:
                turns[WARM[1]].append(run_step(reopened, emb, queries, args.threads)["seconds"])
            turns[WARM[2]].append(per_thread_step(root, emb, queries, args.threads)["seconds"])
        for k, times in turns.items():
            rows[k]["seconds"] = float(np.median(times))
        session.close()
    print(f"{'step':<32} {'rows recomputed':>16} {'seconds':>9}")
    for name, r in rows.items():
        print(f"{name:<32} {int(r['rows_recomputed']):>16} {r['seconds']:>9.3f}")
    out = {"docs": args.docs, "queries": len(queries), "threads": args.threads, "repeats": args.repeats, "steps": rows,
           "after_add_recomputes_no_more": rows["after add, caught up"]["rows_recomputed"]
           <= rows["again"]["rows_recomputed"]}
    print(json.dumps(out))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
