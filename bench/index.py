"""Vector index benchmark: slimrag slim and flat, faiss HNSW-flat, hnswlib and LEANN, same vectors.

    python -m bench.index --corpus disfl_qa --queries disfl_qa --index-e2e
    python -m bench.index --corpus pydocs --limit 2000 --queries self
    python -m bench.index --corpus pydocs --queries self --systems flat,slim,faiss-hnsw,hnswlib

Every system indexes the *same* unit-norm all-MiniLM-L6-v2 vectors of the same passages (cached in
``bench/data/emb-*.npy``), so differences come from the index alone. Ground truth is exact top-k by
inner product over the full matrix (numpy). Printed, per corpus, one table and written as JSON to
``bench/results/index-CORPUS[-LIMIT].json``.

What is measured, per system (each in its own child process, one after another):

- **bytes/vector**: the index files on disk divided by n, passage text excluded. ``B/vec`` counts
  every index file; ``scaling`` leaves out fixed costs independent of n (slim: PQ codebooks and
  metadata: 12 KB at 4 bits, 197 KB at 8). slim: graph + PQ codes + hub vectors + entry ids (+ codebooks);
  flat: the float32 matrix; faiss / hnswlib: their serialized index; LEANN: ``corpus.index`` (CSR
  graph, embeddings pruned) + ``corpus.leann.meta.json``, not its passage store (``passages.jsonl``,
  ``passages.idx``) nor ``corpus.ids.txt`` (row -> passage id, the analogue of slimrag's catalog).
- **build s / peak MiB**: building from the in-memory matrix (no embedding; the corpus is embedded
  once, for all); peak = the child's ``VmHWM`` right after the build, which includes the interpreter,
  numpy and the input matrix (``start MiB`` is the resident set just before the build).
- **recall@3 / recall@10** against exact search. Fast systems: ``--recall-queries`` query vectors.
  slim's recall there re-scores with the stored vectors instead of re-embedding (identical math, to
  float noise); its latency run below re-embeds for real and reports its own recall.
- **latency**: one query at a time from query *text*: embed the query (same embedder for all),
  search, return top-10 rows. slim re-embeds the passages it reranks with the real embedder
  (never the stored matrix) and starts with an empty vector cache (``cache_bytes=0``), so every
  query pays its own recomputation. LEANN runs in its own environment (``bench/leann_driver.py``),
  compact + recompute, on the first ``--leann-queries`` latency queries; slim's latencies on the
  same queries give the LEANN/slim ratio.
- ``--index-e2e``: the public ``Index.build(..., storage="slim")`` path (chunking, catalog, embedding
  inside the build) searched with ``Index.search``: checks the API path matches the artifact path.

Queries: ``disfl_qa``: the (disfluent) questions whose gold passage is in the corpus, a seeded sample.
``self``: a seeded sample of corpus paragraphs, each cut to its first ``SELF_QUERY_WORDS`` words (the
usual self-query set: in-distribution queries whose neighbourhood is real text).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
WORK = ROOT / "data" / "index-work"
DEFAULT_LEANN_PYTHON = "/tmp/venv_leann/bin/python"
SELF_QUERY_WORDS = 12
K = 10
E2E = "slim-index"
HNSW_EF = (10, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


# -- corpora and queries ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Corpus:
    """Passages with their vectors, and query texts with their vectors (same embedder)."""

    name: str
    texts: list[str]
    vectors: np.ndarray
    queries: list[str]
    query_vectors: np.ndarray
    note: str


def _disfl(limit: int | None, nq: int, seed: int) -> Corpus:
    from bench.datasets import cached_embeddings, disfl_qa

    qa = disfl_qa()
    contexts = sorted({x.context for x in qa})
    vecs = cached_embeddings("disfl-contexts", contexts)
    questions = sorted({x.question for x in qa})
    qvecs = cached_embeddings("disfl-questions", questions)
    if limit:
        contexts, vecs = contexts[:limit], vecs[:limit]
    kept = set(contexts)
    pos = {q: i for i, q in enumerate(questions)}
    eligible = sorted({pos[x.question] for x in qa if x.context in kept})
    pick = np.random.default_rng(seed).choice(eligible, min(nq, len(eligible)), replace=False)
    return Corpus("disfl_qa", contexts, vecs, [questions[i] for i in pick], qvecs[pick],
                  f"disfl_qa questions (bigbench 1.0.0), {len(pick)} sampled from {len(eligible)} "
                  "whose gold passage is in the corpus")


def _pydocs(limit: int | None, nq: int, seed: int) -> Corpus:
    from bench.datasets import DATA, cached_embeddings, python_doc_paragraphs

    texts = [t for _, t in python_doc_paragraphs()]
    full = DATA / f"emb-pydocs-{hashlib.sha256(chr(0).join(texts).encode()).hexdigest()[:16]}.npy"
    if limit and limit < len(texts):
        texts = texts[:limit]
        # Reuse the full corpus's cached rows when they exist; embed only these N otherwise.
        vecs = np.load(full, mmap_mode="r")[:limit].copy() if full.is_file() \
            else cached_embeddings(f"pydocs-first{limit}", texts)
    else:
        vecs = cached_embeddings("pydocs", texts)
    pick = np.random.default_rng(seed).choice(len(texts), min(nq, len(texts)), replace=False)
    queries = [" ".join(texts[i].split()[:SELF_QUERY_WORDS]) for i in pick]
    return Corpus("pydocs", texts, vecs, queries, cached_embeddings("pydocs-selfq", queries),
                  f"self-queries: first {SELF_QUERY_WORDS} words of {len(pick)} random paragraphs")


CORPORA = {"disfl_qa": _disfl, "pydocs": _pydocs}
QUERY_SETS = {"disfl_qa": ("disfl_qa",), "self": ("pydocs",)}


def exact_topk(q: np.ndarray, x: np.ndarray, k: int) -> np.ndarray:
    """Exact top-k rows by inner product, best first, in blocks of queries."""
    out = []
    for s in range(0, len(q), 256):
        scores = q[s:s + 256] @ x.T
        part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(scores, part, 1), axis=1, kind="stable")
        out.append(np.take_along_axis(part, order, 1))
    return np.concatenate(out)


def recall(found: list[list[int]], q: np.ndarray, x: np.ndarray, truth: np.ndarray, k: int) -> float:
    """Mean share of the exact top-k that ``found[:k]`` recovers. Tie-aware: a returned row counts
    when its exact score reaches the exact k-th score (less 1e-5), so a duplicate passage returned
    instead of its twin is not a miss (the Python docs repeat some paragraphs verbatim)."""
    hits = []
    for f, qv, t in zip(found, q, truth, strict=True):
        kth = float(x[t[k - 1]] @ qv) - 1e-5
        rows = list(dict.fromkeys(f))[:k]
        hits.append(min(k, int(np.sum(x[rows] @ qv >= kth))) / k if rows else 0.0)
    return float(np.mean(hits))


@dataclasses.dataclass(frozen=True)
class Truth:
    """Exact top-k of a query set over the corpus matrix; ``recall`` scores the first len(found)."""

    x: np.ndarray
    q: np.ndarray
    top: np.ndarray

    @classmethod
    def load(cls, work: Path) -> Truth:
        return cls(np.load(work / "vectors.npy"), np.load(work / "recall_queries.npy"), np.load(work / "truth.npy"))

    def recall(self, found: list[list[int]], k: int) -> float:
        n = len(found)
        return recall(found, self.q[:n], self.x, self.top[:n], k)


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


# -- systems (each runs inside a child process: `python -m bench.index worker NAME WORKDIR`) --------
class System(ABC):
    """One index under test. ``build`` gets the matrix; ``search`` answers one query vector."""

    fixed_files: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()  # imported before the build clock starts

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params

    @abstractmethod
    def build(self, x: np.ndarray, folder: Path) -> None:
        """Build from the (n, d) matrix and write the index files into ``folder``."""

    @abstractmethod
    def search(self, q: np.ndarray, k: int) -> list[int]:
        """Top-k rows for one query vector (d,)."""

    def tune(self, q: np.ndarray, truth: Truth) -> None:
        """Optional: pick a search parameter on the recall queries (default: nothing to tune)."""
        return None

    def prepare_latency(self, texts: list[str], embed: Any) -> None:
        """Switch to the configuration timed from query text (slim: real recomputation)."""
        return None

    def info(self) -> dict[str, Any]:
        return dict(self.params)


class Flat(System):
    modules = ("slimrag.index.store.flat",)
    def build(self, x: np.ndarray, folder: Path) -> None:
        from slimrag.index.store.flat import FlatVectors

        np.save(folder / "vectors.npy", x.astype(np.float32))
        self.flat = FlatVectors(np.arange(len(x)), np.load(folder / "vectors.npy", mmap_mode="r"))

    def search(self, q: np.ndarray, k: int) -> list[int]:
        return self.flat.search(q, k)[0][0].tolist()


class Slim(System):
    fixed_files = ("pq_codebooks.npy", "slim.json")
    modules = ("slimrag.index.store.slim",)

    #: overrides of ``--slim`` that are query knobs (SearchConfig), not build knobs (SlimConfig)
    QUERY_KNOBS = ("ef", "rerank", "wave", "early_stop")

    def _config(self) -> Any:
        from slimrag.index.store.slim import SlimConfig
        from slimrag.index.store.slim.graph import GraphConfig
        from slimrag.index.store.slim.pq import PQConfig

        p = self.params
        return SlimConfig(graph=GraphConfig(**p.get("graph", {})), pq=PQConfig(**p.get("pq", {})),
                          **{k: v for k, v in p.items() if k not in ("graph", "pq", *self.QUERY_KNOBS)})

    def _search_config(self) -> Any:
        from slimrag.config import SearchConfig

        return SearchConfig(**{k: v for k, v in self.params.items() if k in self.QUERY_KNOBS})

    def build(self, x: np.ndarray, folder: Path) -> None:
        from slimrag.index.store.slim import SlimArtifacts, SlimSearcher, build_slim

        self.cfg = dataclasses.replace(self._config(), cache_bytes=0)
        self.search_cfg = self._search_config()
        build_slim(x, self.cfg).save(folder)
        self.art = SlimArtifacts.load(folder)
        # Recall over many queries re-scores with the stored vectors (same math as re-embedding).
        self.searcher = SlimSearcher(self.art, lambda rows: x[rows], self.cfg, self.search_cfg)
        self.stats: list[Any] = []

    def search(self, q: np.ndarray, k: int) -> list[int]:
        res = self.searcher.search(q, k)
        self.stats.append(res.stats)
        return res.rows.tolist()

    def prepare_latency(self, texts: list[str], embed: Any) -> None:
        from slimrag.index.store.slim import SlimSearcher

        self.searcher = SlimSearcher(self.art, lambda rows: embed([texts[r] for r in rows.tolist()]), self.cfg,
                                     self.search_cfg)
        self.stats = []

    def info(self) -> dict[str, Any]:
        return {**self.params, "resolved": {**self.cfg.to_dict(), **dataclasses.asdict(self.search_cfg)}, "pq": {"m": self.art.pq.m, "bits": self.art.pq.bits},
                "pq_error": self.art.pq_error,
                "avg_degree": round(self.art.graph.n_edges / self.art.n, 2), "hubs": len(self.art.hub_rows),
                "entry_points": len(self.art.entry_rows)}


class _HNSW(System):
    """Shared ef tuning: the smallest ef in HNSW_EF whose recall@10 reaches ``target``."""

    def tune(self, q: np.ndarray, truth: Truth) -> None:
        self.sweep = {}
        for ef in (e for e in HNSW_EF if e >= K):
            self.set_ef(ef)
            r = truth.recall([self.search(v, K) for v in q], K)
            self.sweep[ef] = round(r, 4)
            if r >= self.params["target"]:
                break
        self.params = {**self.params, "ef_search": ef}

    def set_ef(self, ef: int) -> None:
        raise NotImplementedError

    def info(self) -> dict[str, Any]:
        return {**self.params, "ef_sweep_recall@10": self.sweep}


class FaissHNSW(_HNSW):
    modules = ("faiss",)
    def build(self, x: np.ndarray, folder: Path) -> None:
        import faiss

        index = faiss.IndexHNSWFlat(x.shape[1], self.params["M"], faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = self.params["ef_construction"]
        index.add(np.ascontiguousarray(x, dtype=np.float32))
        faiss.write_index(index, str(folder / "faiss_hnsw.index"))
        self.index = faiss.read_index(str(folder / "faiss_hnsw.index"))
        faiss.omp_set_num_threads(1)  # one query at a time: threads only add overhead

    def set_ef(self, ef: int) -> None:
        self.index.hnsw.efSearch = ef

    def search(self, q: np.ndarray, k: int) -> list[int]:
        return self.index.search(q[None, :].astype(np.float32), k)[1][0].tolist()


class Hnswlib(_HNSW):
    modules = ("hnswlib",)
    def build(self, x: np.ndarray, folder: Path) -> None:
        import hnswlib

        index = hnswlib.Index(space="ip", dim=x.shape[1])
        index.init_index(max_elements=len(x), M=self.params["M"], ef_construction=self.params["ef_construction"],
                         random_seed=0)
        index.add_items(x, np.arange(len(x)))
        index.save_index(str(folder / "hnswlib.bin"))
        self.index = hnswlib.Index(space="ip", dim=x.shape[1])
        self.index.load_index(str(folder / "hnswlib.bin"), max_elements=len(x))
        self.index.set_num_threads(1)

    def set_ef(self, ef: int) -> None:
        self.index.set_ef(ef)

    def search(self, q: np.ndarray, k: int) -> list[int]:
        return self.index.knn_query(q[None, :], k)[0][0].astype(np.int64).tolist()


SYSTEMS: dict[str, type[System]] = {"flat": Flat, "slim": Slim, "faiss-hnsw": FaissHNSW, "hnswlib": Hnswlib}


def _latency_run(texts: list[str], queries: list[str], search_vec: Any, embedder: Any) -> dict[str, Any]:
    embedder.embed(["warm-up"])
    rows, total, search_only = [], [], []
    for i, text in enumerate(queries):
        t0 = time.perf_counter()
        qv = embedder.embed([text])[0]
        t1 = time.perf_counter()
        rows.append(search_vec(qv))
        t2 = time.perf_counter()
        total.append(t2 - t0)
        search_only.append(t2 - t1)
        if (i + 1) % 10 == 0:
            print(f"  {i + 1}/{len(queries)} queries, median {1000 * np.median(total):.0f} ms", file=sys.stderr,
                  flush=True)
    return {"rows": rows, "seconds": total, "search_seconds": search_only}


def worker(name: str, work: Path, params: dict[str, Any]) -> dict[str, Any]:
    """Build, measure bytes and recall, then time queries from text; returns one result dict."""
    truth = Truth.load(work)
    x, rq = truth.x, truth.q
    folder = work / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    system = SYSTEMS[params.pop("kind", name)](params)
    for module in system.modules:
        importlib.import_module(module)
    start = _status_kib("VmRSS")
    t0 = time.perf_counter()
    system.build(x, folder)
    build_s = time.perf_counter() - t0
    peak = _status_kib("VmHWM")
    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir())}
    system.tune(rq, truth)
    found = [system.search(v, K) for v in rq]
    out: dict[str, Any] = {
        "system": name, "n": len(x), "build_s": build_s, "peak_rss_mib": peak / 1024, "start_rss_mib": start / 1024,
        "files": files, "bytes_per_vector": sum(files.values()) / len(x),
        "scaling_bytes_per_vector": sum(v for f, v in files.items() if f not in system.fixed_files) / len(x),
        "recall_queries": len(rq), "recall@3": truth.recall(found, 3), "recall@10": truth.recall(found, K),
    }
    if isinstance(system, Slim):
        out["recall_recomputed_mean"] = float(np.mean([s.recomputed for s in system.stats]))
    from slimrag.embed.local import LocalEmbedder

    embedder = LocalEmbedder()
    texts = json.loads((work / "texts.json").read_text())
    queries = json.loads((work / "latency_queries.json").read_text())
    system.prepare_latency(texts, lambda t: embedder.embed(t, batch_size=64))
    lat = _latency_run(texts, queries, lambda qv: system.search(qv, K), embedder)
    out["latency"] = lat
    out["latency_recall@3"] = truth.recall(lat["rows"], 3)
    out["latency_recall@10"] = truth.recall(lat["rows"], K)
    if isinstance(system, Slim):
        out["recomputed_mean"] = float(np.mean([s.recomputed for s in system.stats]))
        out["visited_mean"] = float(np.mean([s.visited for s in system.stats]))
    out["params"] = system.info()
    return out


def index_e2e(work: Path, params: dict[str, Any]) -> dict[str, Any]:
    """The public API path: Index.build(storage="slim") from (source, text) pairs, Index.search."""
    from slimrag.config import IndexConfig
    from slimrag.index.core import Index

    texts = json.loads((work / "texts.json").read_text())
    queries = json.loads((work / "latency_queries.json").read_text())
    truth = Truth.load(work)
    pairs = [(f"p/{i:06d}.txt", t) for i, t in enumerate(texts)]
    folder = work / "slim-index.slimrag"
    slim = Slim(params)._config()
    start = _status_kib("VmRSS")
    t0 = time.perf_counter()
    # One chunk per passage (a window longer than any passage): the API path then indexes exactly
    # the vectors the other rows use (the embedder truncates at 256 tokens in both cases).
    idx = Index.build(pairs, folder, storage="slim", slim=slim, overwrite=True,
                      config=IndexConfig(storage="slim", chunk_tokens=1_000_000, chunk_overlap=0))
    build_s = time.perf_counter() - t0
    peak = _status_kib("VmHWM")
    stats = idx.stats()
    idx.search("warm-up", k=K)
    rows, seconds = [], []
    for text in queries:
        t = time.perf_counter()
        hits = idx.search(text, k=K)
        seconds.append(time.perf_counter() - t)
        seen: list[int] = []
        for h in hits:  # a passage longer than one chunk may come back twice: keep its best rank
            r = int(h.source.split("/")[-1].split(".")[0])
            if r not in seen:
                seen.append(r)
        rows.append(seen)
    return {"system": "slim (Index API)", "n": len(texts), "chunks": stats["counts"]["live_vectors"],
            "build_s": build_s, "build_includes_embedding": True, "peak_rss_mib": peak / 1024,
            "start_rss_mib": start / 1024, "slim_bytes": stats["slim_bytes"],
            "generation_files": stats["bytes"]["generation_files"],
            "bytes_per_vector": stats["slim_bytes"]["total_per_vector"],
            "scaling_bytes_per_vector": stats["slim_bytes"]["per_vector"],
            "latency": {"rows": rows, "seconds": seconds},
            "latency_recall@3": truth.recall(rows, 3), "latency_recall@10": truth.recall(rows, K),
            "params": slim.to_dict()}


def _child(cmd: list[str], timeout: float) -> dict[str, Any]:
    """Run one child, stream its stderr, return the JSON after its RESULT marker."""
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, text=True, timeout=timeout,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        raise RuntimeError(f"{' '.join(cmd[:4])} failed (exit {proc.returncode}); see its stderr above")
    return json.loads(line[len("RESULT "):])


def run_leann(work: Path, python: str, nq: int, complexity: int, m: int) -> dict[str, Any]:
    """Build and search LEANN through bench/leann_driver.py in LEANN's own environment."""
    from slimrag.embed.local import default_model_dir

    driver = str(ROOT / "leann_driver.py")
    shutil.rmtree(work / "leann", ignore_errors=True)
    built = _child([python, driver, "build", str(work), str(default_model_dir()), "--M", str(m)], 3600)
    queries = json.loads((work / "latency_queries.json").read_text())[:nq]
    (work / "leann_queries.json").write_text(json.dumps(queries))
    found = _child([python, driver, "search", str(work), "--queries", str(work / "leann_queries.json"),
                    "--k", str(K), "--complexity", str(complexity)], 6 * 3600)
    truth = Truth.load(work)
    counted = {f: v for f, v in built["files"].items() if f.endswith((".index", ".meta.json"))}
    n = len(json.loads((work / "texts.json").read_text()))
    return {"system": "leann", "n": n, "build_s": built["build_s"], "peak_rss_mib": built["peak_rss_kib"] / 1024,
            "start_rss_mib": built["rss_before_kib"] / 1024, "files": built["files"], "counted_files": counted,
            "bytes_per_vector": sum(counted.values()) / n, "scaling_bytes_per_vector": sum(counted.values()) / n,
            "latency": {"rows": found["rows"], "seconds": found["seconds"]},
            "latency_recall@3": truth.recall(found["rows"], 3), "latency_recall@10": truth.recall(found["rows"], K),
            "params": {"M": built["M"], "efConstruction": built["efConstruction"], "complexity": complexity,
                       "is_compact": True, "is_recompute": True}}


# -- report -----------------------------------------------------------------------------------------
def _ms(seconds: list[float], q: float) -> float:
    return 1000 * float(np.quantile(seconds, q)) if seconds else float("nan")


def table(results: list[dict[str, Any]], truth: Truth, n_leann: int) -> str:
    head = (f"{'system':<22} {'B/vec':>7} {'scaling':>7} {'r@3':>6} {'r@10':>6} {'rq':>5} {'p50 ms':>8} "
            f"{'p90 ms':>8} {'lq':>4} {'lat r@10':>8} {'build s':>8} {'peak MiB':>8} {'start':>6}")
    lines = [head, "-" * len(head)]
    for r in results:
        sec = r["latency"]["seconds"]
        r3 = f"{r['recall@3']:.3f}" if "recall@3" in r else "-"
        r10 = f"{r['recall@10']:.3f}" if "recall@10" in r else "-"
        lines.append(
            f"{r['system']:<22} {r['bytes_per_vector']:>7.1f} {r['scaling_bytes_per_vector']:>7.1f} {r3:>6} {r10:>6} "
            f"{r.get('recall_queries', '-'):>5} {_ms(sec, .5):>8.1f} {_ms(sec, .9):>8.1f} {len(sec):>4} "
            f"{r['latency_recall@10']:>8.3f} {r['build_s']:>8.2f} {r['peak_rss_mib']:>8.0f} {r['start_rss_mib']:>6.0f}")
    leann = next((r for r in results if r["system"] == "leann"), None)
    if leann:
        lines.append("")
        lines.append(f"Same {n_leann} queries as LEANN (latency from query text, k={K}):")
        for r in results:
            sec = r["latency"]["seconds"][:n_leann]
            rows = r["latency"]["rows"][:n_leann]
            r["head_to_head"] = {"p50_ms": _ms(sec, .5), "p90_ms": _ms(sec, .9),
                                 "recall@3": truth.recall(rows, 3), "recall@10": truth.recall(rows, K)}
            h = r["head_to_head"]
            lines.append(f"  {r['system']:<22} p50 {h['p50_ms']:>9.1f} ms  p90 {h['p90_ms']:>9.1f} ms  "
                         f"r@3 {h['recall@3']:.3f}  r@10 {h['recall@10']:.3f}")
        for r in results:
            if r["system"].startswith("slim"):
                ratio = leann["head_to_head"]["p50_ms"] / r["head_to_head"]["p50_ms"]
                r["leann_over_this_p50"] = ratio
                lines.append(f"  LEANN median / {r['system']} median = {ratio:.1f}x")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd")
    w = sub.add_parser("worker", help="internal: one system in a child process")
    w.add_argument("name")
    w.add_argument("workdir", type=Path)
    w.add_argument("params")
    ap.add_argument("--corpus", choices=sorted(CORPORA), default="disfl_qa")
    ap.add_argument("--queries", choices=sorted(QUERY_SETS), help="default: disfl_qa for disfl_qa, self for pydocs")
    ap.add_argument("--limit", type=int, help="first N passages of the corpus")
    ap.add_argument("--recall-queries", type=int, default=1000)
    ap.add_argument("--latency-queries", type=int, default=100)
    ap.add_argument("--leann-queries", type=int, default=30)
    ap.add_argument("--leann-python", default=DEFAULT_LEANN_PYTHON, help="python of a venv with leann installed")
    ap.add_argument("--leann-complexity", type=int, default=64, help="LEANN search complexity (its default 64)")
    ap.add_argument("--systems", default="flat,slim,faiss-hnsw,hnswlib,leann")
    ap.add_argument("--slim", default="{}", help='SlimConfig (build) and SearchConfig (ef, rerank, wave, early_stop) overrides as JSON, e.g. \'{"rerank": 32, "pq": {"m": 96, "bits": 4}}\'')
    ap.add_argument("--slim-variant", action="append", default=[], metavar="NAME=JSON",
                    help="an extra slim row with other SlimConfig overrides (repeatable)")
    ap.add_argument("--index-e2e", action="store_true", help="also build and search through the Index API")
    ap.add_argument("--target", type=float, default=0.95, help="recall@10 that faiss/hnswlib ef tuning aims at")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.cmd == "worker":
        params = json.loads(args.params)
        out = index_e2e(args.workdir, params) if args.name == E2E else worker(args.name, args.workdir, params)
        print("RESULT " + json.dumps(out))
        return
    queries = args.queries or ("self" if args.corpus == "pydocs" else "disfl_qa")
    if args.corpus not in QUERY_SETS[queries]:
        ap.error(f"--queries {queries} does not apply to --corpus {args.corpus}")
    corpus = CORPORA[args.corpus](args.limit, args.recall_queries, args.seed)
    tag = f"{corpus.name}-{args.limit}" if args.limit else corpus.name
    work = WORK / tag
    work.mkdir(parents=True, exist_ok=True)
    x = np.ascontiguousarray(corpus.vectors, dtype=np.float32)
    truth = exact_topk(corpus.query_vectors.astype(np.float32), x, K)
    nl = min(args.latency_queries, len(corpus.queries))
    np.save(work / "vectors.npy", x)
    np.save(work / "recall_queries.npy", corpus.query_vectors.astype(np.float32))
    np.save(work / "truth.npy", truth)
    (work / "texts.json").write_text(json.dumps(corpus.texts))
    (work / "latency_queries.json").write_text(json.dumps(corpus.queries[:nl]))
    load0 = os.getloadavg()
    print(f"== {tag}: n={len(x)} d={x.shape[1]}; {corpus.note}; latency queries {nl}; "
          f"load average {load0[0]:.1f} on {os.cpu_count()} CPUs", flush=True)

    slim = json.loads(args.slim)
    plan: list[tuple[str, dict[str, Any]]] = []
    for name in args.systems.split(","):
        if name == "slim":
            plan.append(("slim", {"kind": "slim", **slim}))
            plan += [(v.split("=", 1)[0], {"kind": "slim", **slim, **json.loads(v.split("=", 1)[1])})
                     for v in args.slim_variant]
        elif name == "faiss-hnsw":
            plan.append((name, {"M": 32, "ef_construction": 40, "target": args.target}))
        elif name == "hnswlib":
            plan.append((name, {"M": 16, "ef_construction": 200, "target": args.target}))
        elif name in SYSTEMS:
            plan.append((name, {}))
    results: list[dict[str, Any]] = []
    for name, params in plan:
        print(f"-- {name}", flush=True)
        try:
            results.append(_child([sys.executable, "-m", "bench.index", "worker", name, str(work),
                                   json.dumps(params)], 4 * 3600))
        except (RuntimeError, subprocess.TimeoutExpired) as exc:  # report the others all the same
            print(f"-- {name} left out: {exc}", flush=True)
    if args.index_e2e:
        print("-- slim (Index API)", flush=True)
        results.append(_child([sys.executable, "-m", "bench.index", "worker", E2E, str(work), json.dumps(slim)],
                              4 * 3600))
    if "leann" in args.systems.split(","):
        if Path(args.leann_python).is_file():
            print(f"-- leann ({args.leann_python})", flush=True)
            results.append(run_leann(work, args.leann_python, min(args.leann_queries, nl), args.leann_complexity, 32))
        else:
            print(f"-- leann skipped: {args.leann_python} not found (pass --leann-python PATH of a venv with "
                  "`pip install leann`)", flush=True)
    n_leann = min(args.leann_queries, nl)
    report = table(results, Truth.load(work), n_leann)
    print("\n" + report)
    out = args.out or RESULTS / f"index-{tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"corpus": tag, "n": len(x), "dim": int(x.shape[1]), "k": K, "queries": corpus.note,
                               "loadavg_start": load0, "loadavg_end": os.getloadavg(), "cpus": os.cpu_count(),
                               "latency_queries": nl, "leann_queries": n_leann, "table": report,
                               "results": results}, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
