"""Which candidate graph should feed the slim prune? faiss HNSW level 0, NN-descent, NSG, Vamana, exact k-NN.

The slim build (``slimrag.index.store.slim``) gives every row a candidate pool, then robust-prunes it
with the degree-preserving budget (``graph.py``). ``pool.py`` chose faiss's HNSW level 0 for the
pool without comparing it to the other near-linear graphs issue 18 names; this benchmark makes that
comparison, on the same vectors, at equal threads (one), with the same prune and search on top.

Candidates (each a per-partition builder, installed with ``pool.set_runner`` so the build's own
partitioning and merge run unchanged; at the N measured here a build is one partition):

- ``exact``: the exact ``candidates`` (48) nearest neighbours (``knn.exact_knn``, ``n^2 d`` flops):
  the best pool there is, the reference for the others (only at small N by default).
- ``hnsw``: today's pool, faiss ``IndexHNSWFlat`` (M=16, efConstruction 64); each row's level-0
  list (<= 32 ids, chosen by HNSW's diversity heuristic while inserting).
- ``hnsw-knn``: the same index, then an HNSW search for each row's 48 nearest (efSearch 64).
- ``nndescent``: faiss ``IndexNNDescentFlat`` (K=32, faiss's defaults S=10, R=100, L=K+50,
  10 iterations): each row's approximate 32 nearest neighbours.
- ``nndescent-6``: the same with K=24 and 6 iterations (half the joins).
- ``nsg``: faiss ``IndexNSGFlat`` (R=32, over an NN-descent k-NN graph of GK=64, faiss's defaults):
  NSG's MRNG-pruned lists (<= 32), the closest library relative of Vamana.
- ``vamana``: DiskANN's own in-memory build (``diskannpy.build_memory_index``: insertion by greedy
  search plus robust prune, L=64, R=32, alpha 1.2, L2 on the unit vectors, one thread); its graph
  file is parsed for the lists. diskannpy pins numpy 1.25 (slimrag uses numpy 2), so it is not a
  project dependency: unpack its wheel into a folder and pass ``--diskann FOLDER`` (the build runs
  under numpy 2 here; only the graph file is read back). Without it the candidate is skipped.

For each candidate a child process (so its peak RSS is its own) builds the pool with
``pool.candidate_pool`` and records wall and CPU seconds and its peak RSS (``VmHWM``: the pool's peak,
after the imports and the input are loaded: ``base_rss_mib`` is that level), then **pool
quality**: the share of each row's true 10 nearest neighbours (brute force, a seeded sample of
1,000 rows) present in its candidate list. Then the same child runs ``build_slim`` with that pool
(a runner that hands back the lists just built) and saves the generation; the parent searches it
with the default ``SearchConfig`` (``bench.slim_scale.evaluate``: the searcher's recompute reads
the true rows) and reports recall@10 against exact search, median rows recomputed, mean degree and
bytes per vector; and recall@10 at a fixed rerank depth of 20 (``recall=0``, no calibrated stop),
where a weaker graph shows sooner.

To keep every candidate on the same code while others edit the tree, run it from an archive of
one commit (``git archive HEAD src bench``, ``PYTHONPATH`` to it, ``SLIM_GRAPHS_COMMIT`` naming it).

Corpora: the stand-in embedder's law (``bench.slim_scale.write_vectors``, 200 queries from the same
law) at each ``--n``, and ``pydocs3000``: 3,000 real MiniLM passages of the Python docs with 1,000
real self-queries, read from ``bench.index``'s embedding cache in ``bench/data`` (skipped when
absent).

    OMP_NUM_THREADS=1 nice -n 10 python -m bench.slim_graphs --n 30000,100000 --real \
        --diskann /tmp/dk/site

``--partition-rows 50000`` splits the pools into k-means partitions with overlap 2 (the regime past
250k rows, where every row is inserted into two partitions' graphs and its pool is twice as wide);
``--merge`` adds a run's corpora to the JSON already there.

Prints a table and writes bench/results/slim_graphs.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results"
DATA = Path(__file__).parent / "data"
WORK = Path(os.environ.get("SLIM_GRAPHS_WORK", "/tmp/slim_graphs"))
CANDIDATES = ("exact", "hnsw", "hnsw-knn", "nndescent", "nndescent-6", "nsg", "vamana")
#: the GraphConfig pool each candidate's first step runs with (its own runner installed for "hnsw")
_POOL_OF = {"exact": "exact", "hnsw-knn": "hnsw-knn"}
SAMPLE = 1000
TRUE_K = 10


# -- the candidate builders (run in the child) -------------------------------------------------
def _nndescent(k: int, iters: int):
    def local(v: np.ndarray) -> np.ndarray:
        import faiss

        index = faiss.IndexNNDescentFlat(v.shape[1], k, faiss.METRIC_INNER_PRODUCT)
        index.nndescent.iter = iters
        index.add(v)
        return faiss.vector_to_array(index.nndescent.final_graph).reshape(len(v), k).astype(np.int64)
    return local


def _nsg(v: np.ndarray) -> np.ndarray:
    import faiss

    index = faiss.IndexNSGFlat(v.shape[1], 32, faiss.METRIC_INNER_PRODUCT)
    index.build_type = 1  # the k-NN graph by NN-descent; 0 would be brute force (n^2)
    index.add(v)
    g = index.nsg.get_final_graph()
    return faiss.rev_swig_ptr(g.data, g.N * g.K).copy().reshape(g.N, g.K).astype(np.int64)  # -1 padded


def _vamana(v: np.ndarray) -> np.ndarray:
    import diskannpy

    with tempfile.TemporaryDirectory(dir=WORK) as folder:
        diskannpy.build_memory_index(v, distance_metric="l2", index_directory=folder, complexity=64,
                                     graph_degree=32, num_threads=1, alpha=1.2, use_pq_build=False)
        raw = np.fromfile(Path(folder) / "ann", dtype=np.uint8)
    # DiskANN's in-memory graph file: u64 file size, u32 max degree, u32 start, u64 frozen points,
    # then per node a u32 count and that many u32 ids.
    width = int(raw[8:12].view(np.uint32)[0])
    words = raw[24:].view(np.uint32)
    out = np.full((len(v), width), -1, dtype=np.int64)
    pos = 0
    for row in range(len(v)):
        k = int(words[pos])
        out[row, :k] = words[pos + 1 : pos + 1 + k]
        pos += 1 + k
    if pos != len(words):
        raise RuntimeError(f"DiskANN graph file has {len(words) - pos} words past {len(v)} nodes")
    return out


_LOCAL = {"nndescent": _nndescent(32, 10), "nndescent-6": _nndescent(24, 6), "nsg": _nsg, "vamana": _vamana}


def _runner_of(local):
    """A `pool.PartitionRunner` building each partition's lists with ``local`` (vectors -> local ids)."""
    from slimrag.index.store.slim.pool import to_global
    from slimrag.index.store.slim.rows import RowReader

    def run(x, parts, config, knn):
        for rows in parts:
            reader = RowReader(x)
            v = np.ascontiguousarray(reader.take(rows))
            reader.done()
            yield to_global(rows, local(v))
    return run


def _rss_mib() -> float:
    """This process's peak RSS (``VmHWM``, MiB). Not ``ru_maxrss``: Linux carries the parent's
    high-water mark into a child across fork + exec, so a child of a parent that once held 1 GB
    would report 1 GB whatever it did."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status (this benchmark needs Linux)")


def child(name: str, path: str, sample_path: str, out: str, partition_rows: str) -> None:
    """Build ``name``'s pool over the vectors at ``path`` (partitions of ``partition_rows``, 0: the
    default), score it, build the slim generation on it into ``out``; write stats to ``out``.json."""
    import faiss

    faiss.omp_set_num_threads(1)
    from slimrag.index.store.slim import SlimConfig, build_slim, slim_bytes
    from slimrag.index.store.slim import pool as pool_mod
    from slimrag.index.store.slim.graph import GraphConfig

    x = np.load(path, mmap_mode="r")
    sample = np.load(sample_path)  # rows (SAMPLE,), then their true 10 nearest (SAMPLE, 10)
    rows, truth = sample[:, 0], sample[:, 1:]
    stats: dict = {"candidate": name, "base_rss_mib": _rss_mib()}
    split = {"partition_rows": int(partition_rows)} if int(partition_rows) else {}
    config = GraphConfig(pool=_POOL_OF.get(name, "hnsw"), **split)
    if name in _LOCAL:
        pool_mod.set_runner(_runner_of(_LOCAL[name]))
    t0, c0 = time.perf_counter(), time.process_time()
    pool = pool_mod.candidate_pool(x, config, stats)
    stats["pool_s"], stats["pool_cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
    stats["pool_peak_rss_mib"] = _rss_mib()
    got = pool[rows]
    hit = (got[:, :, None] == truth[:, None, :]).any(axis=1).sum(axis=1)
    stats["pool_quality"] = float(hit.mean() / TRUE_K)
    valid = (pool >= 0) & (pool != np.arange(len(pool))[:, None])
    stats["pool_width"] = float(valid.sum(axis=1).mean())

    # The prune gets the pool just scored (merged already: one partition here).
    pool_mod.set_runner(lambda x_, parts, cfg, knn: [pool])
    slim = SlimConfig(graph=GraphConfig(pool="hnsw", partition_rows=max(len(x), 1000)))
    build: dict = {}
    t0, c0 = time.perf_counter(), time.process_time()
    art = build_slim(x, slim, stats=build)
    stats["slim_s"], stats["slim_cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
    stats["phases_cpu_s"] = {k[:-6]: v for k, v in build.items() if k.endswith("_cpu_s") and k != "pool_cpu_s"}
    stats["peak_rss_mib"] = _rss_mib()
    art.save(out)
    stats["bytes_per_vector"] = slim_bytes(out)["total_per_vector"]
    stats["mean_degree"] = art.graph.n_edges / art.n
    Path(out + ".json").write_text(json.dumps(stats))


# -- the parent --------------------------------------------------------------------------------
def sample_truth(x: np.ndarray, seed: int = 0) -> np.ndarray:
    """A seeded sample of rows and each one's exact 10 nearest other rows: (SAMPLE, 11) int64."""
    rows = np.sort(np.random.default_rng(seed).choice(len(x), min(SAMPLE, len(x)), replace=False))
    xq = np.asarray(x[rows], dtype=np.float32)
    best_i = np.full((len(rows), TRUE_K), -1, dtype=np.int64)
    best_s = np.full((len(rows), TRUE_K), -np.inf, dtype=np.float32)
    for start in range(0, len(x), 8192):
        s = xq @ np.asarray(x[start : start + 8192], dtype=np.float32).T
        s[rows[:, None] == np.arange(start, start + s.shape[1])[None, :]] = -np.inf
        ids = np.concatenate([best_i, np.broadcast_to(np.arange(start, start + s.shape[1]), s.shape)], axis=1)
        sc = np.concatenate([best_s, s], axis=1)
        top = np.argpartition(-sc, TRUE_K - 1, axis=1)[:, :TRUE_K]
        best_i, best_s = np.take_along_axis(ids, top, axis=1), np.take_along_axis(sc, top, axis=1)
    return np.concatenate([rows[:, None], best_i], axis=1)


def corpora(ns: list[int], real: bool) -> list[tuple[str, Path, np.ndarray]]:
    """(name, corpus .npy path, queries) of each corpus to measure."""
    from bench.slim_scale import write_vectors

    out = []
    if real:
        docs, queries = sorted(DATA.glob("emb-pydocs-first3000-*.npy")), sorted(DATA.glob("emb-pydocs-selfq-*.npy"))
        if len(docs) == 1 and len(queries) == 1:
            out.append(("pydocs3000", docs[0], np.load(queries[0]).astype(np.float32)))
        else:
            warnings.warn(f"--real: need one emb-pydocs-first3000-*.npy and one emb-pydocs-selfq-*.npy in {DATA} "
                          f"(found {len(docs)}, {len(queries)}; `python -m bench.index` writes them); skipped",
                          stacklevel=2)
    for n in ns:
        path, qpath = write_vectors(n, 200)
        out.append((f"synthetic{n}", path, np.load(qpath)))
    return out


def run_candidate(name: str, path: Path, sample_path: Path, out: Path, diskann: str | None, parts: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    if name == "vamana" and diskann:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (diskann, env.get("PYTHONPATH")) if p)
    res = subprocess.run([sys.executable, "-m", "bench.slim_graphs", "--child", name, str(path), str(sample_path),
                          str(out), str(parts)], capture_output=True, text=True, env=env)
    stats_file = Path(str(out) + ".json")
    if res.returncode != 0 or not stats_file.is_file():
        raise RuntimeError(f"{name} failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return json.loads(stats_file.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", default="30000,100000", help="comma-separated N of stand-in vectors")
    ap.add_argument("--real", action="store_true", help="also the 3,000 real MiniLM pydocs passages")
    ap.add_argument("--candidates", default=",".join(CANDIDATES))
    ap.add_argument("--exact-max", type=int, default=30_000, help="skip the exact pool above this N")
    ap.add_argument("--diskann", help="folder holding an unpacked diskannpy wheel (the vamana candidate)")
    ap.add_argument("--partition-rows", type=int, default=0,
                    help="GraphConfig.partition_rows of the pools (0: the default, one partition below 250k)")
    ap.add_argument("--out", default=str(RESULTS / "slim_graphs.json"))
    ap.add_argument("--merge", action="store_true", help="keep the other corpora already in --out")
    ap.add_argument("--child", nargs=5, metavar=("NAME", "PATH", "SAMPLE", "OUT", "PARTS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(*a.child)
        return
    from bench.slim_scale import evaluate, truth_of

    names = [c for c in a.candidates.split(",") if c]
    unknown = set(names) - set(CANDIDATES)
    if unknown:
        raise SystemExit(f"unknown candidates {sorted(unknown)}; choose from {CANDIDATES}")
    if "vamana" in names and not a.diskann:
        warnings.warn("vamana needs --diskann FOLDER (an unpacked diskannpy wheel); skipped", stacklevel=1)
        names.remove("vamana")
    WORK.mkdir(parents=True, exist_ok=True)
    commit = os.environ.get("SLIM_GRAPHS_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    result: dict = {"threads": 1, "corpora": {}}
    if a.merge and Path(a.out).is_file():
        result = json.loads(Path(a.out).read_text())
    load0 = open("/proc/loadavg").read().split()[:3]
    print(f"{'corpus':<22}{'candidate':<13}{'pool s':>8}{'pool cpu':>9}{'pool MiB':>9}{'quality':>8}"
          f"{'width':>6}{'slim s':>8}{'peak MiB':>9}{'deg':>6}{'B/vec':>7}{'recall':>7}{'rows':>6}{'R=20':>7}  load")
    for cname, path, q in corpora([int(s) for s in a.n.split(",") if s], a.real):
        cname += f"/p{a.partition_rows}" if a.partition_rows else ""
        start = open("/proc/loadavg").read().split()[:3]
        x = np.load(path, mmap_mode="r")
        sample_path = WORK / f"sample_{cname.replace('/', '_')}.npy"
        np.save(sample_path, sample_truth(x))
        truth = truth_of(x, q, TRUE_K)
        rows = []
        for name in names:
            if name == "exact" and len(x) > a.exact_max:
                continue
            out = WORK / f"{cname.replace('/', '_')}_{name}"
            s = run_candidate(name, path, sample_path, out, a.diskann, a.partition_rows)
            s.update(evaluate(out, x, q, truth, TRUE_K, {}))
            s["fixed20"] = evaluate(out, x, q, truth, TRUE_K, {"recall": 0})
            s["loadavg"] = open("/proc/loadavg").read().split()[:3]
            rows.append(s)
            print(f"{cname:<22}{name:<13}{s['pool_s']:>8.1f}{s['pool_cpu_s']:>9.1f}{s['pool_peak_rss_mib']:>9.0f}"
                  f"{s['pool_quality']:>8.3f}{s['pool_width']:>6.1f}{s['slim_s']:>8.1f}{s['peak_rss_mib']:>9.0f}"
                  f"{s['mean_degree']:>6.1f}{s['bytes_per_vector']:>7.1f}{s['recall']:>7.3f}{s['rows_median']:>6.0f}"
                  f"{s['fixed20']['recall']:>7.3f}  {' '.join(s['loadavg'])}", flush=True)
        result["corpora"][cname] = {"n": len(x), "queries": len(q), "commit": commit, "partition_rows":
                                    a.partition_rows, "loadavg_before": start,
                                    "loadavg_after": open("/proc/loadavg").read().split()[:3], "candidates": rows}
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(result, indent=1))  # after each corpus: a long run keeps its first
    print(f"load {' '.join(load0)} -> {' '.join(open('/proc/loadavg').read().split()[:3])}; wrote {a.out}")


if __name__ == "__main__":
    main()
