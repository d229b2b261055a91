"""LEANN side of ``bench/index.py``, run with the Python of a separate LEANN environment.

    /path/to/leann-venv/bin/python bench/leann_driver.py build  WORKDIR MODEL_DIR
    /path/to/leann-venv/bin/python bench/leann_driver.py search WORKDIR --queries Q.json --k 10 --complexity 64

LEANN (PyPI ``leann`` + ``leann-backend-hnsw``) pins its own torch, transformers and faiss fork, so
it lives in its own virtual environment and this script imports nothing from slimrag. Everything
crosses over as files in WORKDIR, written by ``bench/index.py``:

- ``texts.json`` (passage texts, row order) and ``vectors.npy`` (their unit-norm MiniLM embeddings)
  in WORKDIR; the query texts in a JSON list (``--queries``). ``build`` writes ``WORKDIR/leann/``.
- ``build`` indexes the *same* vectors as every other system (``build_index_from_arrays``, passage
  id = row number) with the HNSW backend in compact + recompute mode (LEANN's default: CSR graph,
  no embeddings kept; every node the search touches is re-embedded from its text by LEANN's
  embedding server with the same model folder). Build time therefore excludes embedding the corpus,
  as for the other systems.
- ``search`` runs one query at a time (the way LEANN answers a user), after one warm-up query
  that starts the embedding server; the latency of a query covers query embedding, graph walk and
  recomputation: returned rows, their scores, per-query seconds.

Each command prints its result as one JSON line after ``RESULT ``.

Peak memory is the process's ``VmHWM`` (peak resident set) from ``/proc/self/status``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

INDEX_NAME = "corpus.leann"


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def build(workdir: Path, model_dir: str, m: int, ef_construction: int) -> dict:
    import numpy as np
    from leann import LeannBuilder

    texts = json.loads((workdir / "texts.json").read_text())
    vectors = np.load(workdir / "vectors.npy").astype(np.float32)
    out = workdir / "leann"
    out.mkdir(exist_ok=True)
    rss_before = _status_kib("VmRSS")
    t0 = time.perf_counter()
    builder = LeannBuilder(
        backend_name="hnsw", embedding_model=model_dir, embedding_mode="sentence-transformers",
        is_compact=True, is_recompute=True, M=m, efConstruction=ef_construction,
        distance_metric="mips",
    )
    for i, text in enumerate(texts):
        builder.add_text(text, metadata={"id": str(i)})
    builder.build_index_from_arrays(str(out / INDEX_NAME), [str(i) for i in range(len(texts))], vectors)
    seconds = time.perf_counter() - t0
    files = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()}
    return {"build_s": seconds, "peak_rss_kib": _status_kib("VmHWM"), "rss_before_kib": rss_before,
            "files": files, "M": m, "efConstruction": ef_construction}


def search(workdir: Path, queries_file: Path, k: int, complexity: int) -> dict:
    from leann import LeannSearcher

    queries = json.loads(queries_file.read_text())
    searcher = LeannSearcher(str(workdir / "leann" / INDEX_NAME), recompute_embeddings=True, use_daemon=False)
    try:
        searcher.search("warm-up query for the embedding server", top_k=k, complexity=complexity)
        rows, scores, seconds = [], [], []
        for q in queries:
            t0 = time.perf_counter()
            res = searcher.search(q, top_k=k, complexity=complexity)
            seconds.append(time.perf_counter() - t0)
            rows.append([int(r.id) for r in res])
            scores.append([float(r.score) for r in res])
            print(f"leann query {len(seconds)}/{len(queries)}: {seconds[-1]:.2f} s", file=sys.stderr, flush=True)
    finally:
        searcher.cleanup()
    return {"rows": rows, "scores": scores, "seconds": seconds, "complexity": complexity, "k": k}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("workdir", type=Path)
    b.add_argument("model_dir")
    b.add_argument("--M", type=int, default=32, help="HNSW M (LEANN's default graph degree 32)")
    b.add_argument("--ef-construction", type=int, default=200, help="LEANN's HNSW default 200")
    s = sub.add_parser("search")
    s.add_argument("workdir", type=Path)
    s.add_argument("--queries", type=Path, required=True, help="JSON list of query texts")
    s.add_argument("--k", type=int, default=10)
    s.add_argument("--complexity", type=int, default=64, help="LEANN's search default 64 (efSearch)")
    args = ap.parse_args()
    if args.cmd == "build":
        out = build(args.workdir, args.model_dir, args.M, args.ef_construction)
    else:
        out = search(args.workdir, args.queries, args.k, args.complexity)
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
