"""The slim graph at scale: build time by phase, peak RSS, bytes/vector, recall@10 and rows recomputed.

Synthetic text-like vectors (the law of `bench.vectors.text_like`, drawn in blocks so a million
rows never exist as float64) are written to a memory-mapped float32 file, the way the write path
hands a build its vectors; `build_slim` runs in a child process, so its peak RSS
(``ru_maxrss``) is the build's alone, and its peak RSS, anonymous and file-backed, is also
sampled per build step (`StepSampler`). The searcher's ``recompute`` reads the true rows from the
file, so the exact level is exact; truth is brute force over the file in blocks. faiss HNSW
(M=32, efConstruction 40, efSearch 128) over the same vectors is the side-by-side baseline.

    python -m bench.slim_scale --n 100000 --pool auto --faiss
    python -m bench.slim_scale --n 1000000

Prints a table and writes JSON to bench/results/slim_scale_N.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results"
DATA = Path(os.environ.get("SLIM_SCALE_DATA", "/tmp/slim_scale"))


def write_vectors(n: int, nq: int, d: int = 384, seed: int = 0) -> tuple[Path, Path]:
    """Corpus (memmap .npy) and queries of the `bench.vectors.text_like` law, drawn in blocks."""
    DATA.mkdir(parents=True, exist_ok=True)
    path, qpath = DATA / f"x_{n}_{d}_{seed}.npy", DATA / f"q_{n}_{d}_{seed}.npy"
    if path.exists() and qpath.exists():
        return path, qpath
    rng = np.random.default_rng(seed)
    rank = min(96, d)
    mean = rng.normal(size=d)
    mean /= np.linalg.norm(mean)
    basis = np.linalg.qr(rng.normal(size=(d, rank)))[0]
    spectrum = 1.0 / np.sqrt(1.0 + np.arange(rank))
    clusters = max(8, n // 80)
    centers = (rng.normal(size=(clusters, rank)) * spectrum) @ basis.T
    subs = (rng.normal(size=(clusters * 8, rank)) * spectrum) @ basis.T

    def draw(m: int) -> np.ndarray:
        c = rng.integers(0, clusters, m)
        s = c * 8 + rng.integers(0, 8, m)
        x = (0.35 * mean + 0.9 * centers[c] + 0.5 * subs[s]
             + 0.45 * (rng.normal(size=(m, rank)) * spectrum) @ basis.T + 0.04 * rng.normal(size=(m, d)))
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    tmp = path.with_suffix(".tmp.npy")
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(n, d))
    for start in range(0, n, 65536):
        out[start : start + 65536] = draw(min(65536, n - start))
    out.flush()
    del out
    np.save(qpath, draw(nq))
    tmp.rename(path)
    return path, qpath


def truth_of(x: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    """Exact top-k rows of each query, by blocks of the corpus."""
    best_i = np.full((len(q), k), -1, dtype=np.int64)
    best_s = np.full((len(q), k), -np.inf, dtype=np.float32)
    for start in range(0, len(x), 65536):
        s = q @ np.asarray(x[start : start + 65536]).T
        ids = np.concatenate([best_i, np.broadcast_to(np.arange(start, start + s.shape[1]), s.shape)], axis=1)
        sc = np.concatenate([best_s, s], axis=1)
        top = np.argsort(-sc, axis=1, kind="stable")[:, :k]
        best_i, best_s = np.take_along_axis(ids, top, axis=1), np.take_along_axis(sc, top, axis=1)
    return best_i


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


class StepSampler:
    """Peak RSS, anonymous and file-backed, per build step (the innermost ``slimrag`` function the
    main thread is in), sampled every ``period`` s on a thread: which step holds the memory, and
    whether it is memory the build allocated or pages of the mapped vectors."""

    def __init__(self, period: float = 0.2) -> None:
        import threading

        self.steps: dict[str, list[float]] = {}
        self._main = threading.main_thread().ident
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period,), daemon=True)
        self._thread.start()

    def _where(self) -> str:
        from bench.scale import slimrag_step

        return slimrag_step(self._main, "-")

    def _run(self, period: float) -> None:
        while not self._stop.wait(period):
            now = [_status_mib("VmRSS"), _status_mib("RssAnon"), _status_mib("RssFile")]
            key = self._where()
            top = self.steps.setdefault(key, [0.0, 0.0, 0.0])
            self.steps[key] = [max(a, b) for a, b in zip(top, now, strict=True)]

    def stop(self) -> dict[str, dict[str, float]]:
        """Per step: peak ``rss``, ``anon`` and ``file`` MiB, in the order the steps first ran."""
        self._stop.set()
        self._thread.join()
        return {k: {"rss": round(v[0]), "anon": round(v[1]), "file": round(v[2])} for k, v in self.steps.items()}


def child_build(path: str, out: str, config_json: str) -> None:
    """In a child process: build from the memmap, save, print JSON stats (peak RSS included, and
    per build step, `StepSampler`)."""
    from slimrag.index.store.slim import SlimConfig, build_slim, slim_bytes

    x = np.load(path, mmap_mode="r")
    cfg = SlimConfig.from_dict(json.loads(config_json))
    stats: dict = {}
    sampler = StepSampler()
    t0, c0 = time.perf_counter(), time.process_time()
    art = build_slim(x, cfg, stats=stats)
    stats["build_s"], stats["build_cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
    stats["rss_by_step"] = sampler.stop()
    art.save(out)
    stats["bytes"] = slim_bytes(out)
    stats["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    stats["mean_degree"] = art.graph.n_edges / art.n
    stats["pq_error"] = art.pq_error
    print("STATS" + json.dumps(stats))


def child_faiss(path: str, qpath: str, k: int) -> None:
    import faiss

    x = np.load(path, mmap_mode="r")
    q = np.load(qpath)
    t0 = time.perf_counter()
    index = faiss.IndexHNSWFlat(x.shape[1], 32, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = 40
    for start in range(0, len(x), 65536):
        index.add(np.asarray(x[start : start + 65536]))
    build = time.perf_counter() - t0
    index.hnsw.efSearch = 128
    t0 = time.perf_counter()
    ids = np.concatenate([index.search(q[i : i + 1], k)[1] for i in range(len(q))])
    lat = (time.perf_counter() - t0) / len(q)
    print("STATS" + json.dumps({"build_s": build, "ids": ids.tolist(), "latency_ms": lat * 1e3,
                                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def run_child(args: list[str]) -> dict:
    env = dict(os.environ)
    res = subprocess.run([sys.executable, "-m", "bench.slim_scale", *args], capture_output=True, text=True, env=env)
    for line in res.stdout.splitlines():
        if line.startswith("STATS"):
            return json.loads(line[5:])
    raise RuntimeError(f"child failed ({res.returncode}):\n{res.stderr[-3000:]}")


def evaluate(folder: Path, x: np.ndarray, q: np.ndarray, truth: np.ndarray, k: int, search_kw: dict) -> dict:
    from slimrag.config import SearchConfig
    from slimrag.index.store.slim import SlimArtifacts, SlimConfig, SlimSearcher

    art = SlimArtifacts.load(folder)
    spent = [0.0]

    def recompute(rows: np.ndarray) -> np.ndarray:
        t = time.perf_counter()
        out = np.asarray(x[np.sort(rows)], dtype=np.float32)[np.argsort(np.argsort(rows))]
        spent[0] += time.perf_counter() - t
        return out

    searcher = SlimSearcher(art, recompute, SlimConfig(cache_bytes=0), SearchConfig(**search_kw))
    rec, rows, lat = [], [], []
    for i in range(len(q)):
        spent[0] = 0.0
        t = time.perf_counter()
        r = searcher.search(q[i], k)
        lat.append(time.perf_counter() - t - spent[0])
        rec.append(len(set(r.rows.tolist()) & set(truth[i].tolist())) / k)
        rows.append(r.stats.recomputed)
    return {"recall": float(np.mean(rec)), "rows_median": float(np.median(rows)), "rows_mean": float(np.mean(rows)),
            "structure_ms": float(np.median(lat) * 1e3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--nq", type=int, default=200)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--graph", default="{}", help="GraphConfig overrides as JSON")
    ap.add_argument("--pq", default="{}", help="PQConfig overrides as JSON")
    ap.add_argument("--search", default='[{}]', help="JSON list of SearchConfig overrides to evaluate")
    ap.add_argument("--faiss", action="store_true")
    ap.add_argument("--tag", default="")
    ap.add_argument("--child", nargs="*")
    a = ap.parse_args()
    if a.child:
        if a.child[0] == "build":
            child_build(*a.child[1:])
        else:
            child_faiss(a.child[1], a.child[2], int(a.child[3]))
        return
    load0 = open("/proc/loadavg").read().split()[:3]
    path, qpath = write_vectors(a.n, a.nq)
    x, q = np.load(path, mmap_mode="r"), np.load(qpath)
    truth = truth_of(x, q, a.k)
    folder = DATA / f"slim_{a.n}{a.tag}"
    cfg = {"graph": json.loads(a.graph), "pq": json.loads(a.pq)}
    stats = run_child(["--child", "build", str(path), str(folder), json.dumps(cfg)])
    result = {"n": a.n, "config": cfg, "build": stats, "search": []}
    for kw in json.loads(a.search):
        result["search"].append({"knobs": kw, **evaluate(folder, x, q, truth, a.k, kw)})
    if a.faiss:
        f = run_child(["--child", "faiss", str(path), str(qpath), str(a.k)])
        ids = np.array(f.pop("ids"))
        f["recall"] = float(np.mean([len(set(ids[i]) & set(truth[i])) / a.k for i in range(len(q))]))
        result["faiss_hnsw32"] = f
    result["loadavg_before"] = load0
    result["loadavg_after"] = open("/proc/loadavg").read().split()[:3]
    b = stats
    phases = ("pool", "prune", "reverse", "connect", "pq", "calibrate", "stop")
    print(f"n={a.n} pool={b.get('pool')} parts={b.get('partitions')} build {b['build_s']:.1f}s wall, "
          f"{b['build_cpu_s']:.1f}s CPU (CPU by phase: "
          + " ".join(f"{p} {b.get(p + '_cpu_s', 0):.1f}" for p in phases) + f") peak {b['peak_rss_mib']:.0f} MiB "
          f"B/vec {b['bytes']['total_per_vector']:.1f} deg {b['mean_degree']:.1f} pq_err {b['pq_error']:.3f}")
    for s in result["search"]:
        print(f"  {s['knobs']}: recall@{a.k} {s['recall']:.3f} rows median {s['rows_median']:.0f} "
              f"mean {s['rows_mean']:.1f} structure {s['structure_ms']:.1f} ms")
    if a.faiss:
        f = result["faiss_hnsw32"]
        print(f"  faiss HNSW32: build {f['build_s']:.1f}s recall {f['recall']:.3f} {f['latency_ms']:.2f} ms "
              f"peak {f['peak_rss_mib']:.0f} MiB")
    for step, r in b.get("rss_by_step", {}).items():
        print(f"  {step:32s} peak RSS {r['rss']:6,d} MiB (anon {r['anon']:6,d} + file {r['file']:6,d})")
    print(f"  load {' '.join(load0)} -> {' '.join(result['loadavg_after'])}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"slim_scale_{a.n}{a.tag}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
