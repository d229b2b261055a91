"""The index at scale: `Index.build` of N synthetic passages with the stand-in embedder, by phase.

    python -m bench.scale --storage flat --n 10000,100000,1000000
    python -m bench.scale --storage slim --n 10000,100000 --faiss
    python -m bench.scale --real pydocs --storage flat

What runs: the public API only. `Index.build` over ``(source, text)`` pairs streamed from
`bench.passages` (clustered passages of 40–80 words, one chunk each) with `SyntheticEmbedder`
(`slimrag.embed.synthetic`: deterministic, clustered, ~200,000 texts per CPU-second), so what is
timed is the index's own work, not a model's. Each N is built in its own child process, so the
peak RSS (``VmHWM``) is that build's alone, and opened in another (a cold process, warm page cache).

Reported per N (table on stdout, JSON in ``bench/results/scale.json``, one entry per (storage,
corpus, N, ``--label``), later runs replacing earlier ones):

- **build s by phase.** Measured from outside the index (no hook in ``index/`` is needed): the
  child wraps functions the build is known to call (`PROBES`, looked up by name; a name the code no
  longer has is listed under ``probes_missing``) and charges each call's time, minus the probes
  nested in it, to the probe's phase: ``input`` (the passage generator), ``chunk`` (read, hash,
  chunk), ``embed``, ``catalog`` (SQLite: documents, chunks, FTS5, commit), ``vectors`` (delta parts,
  the generation's files), ``reload`` (what a commit does to the open vector view), ``manifest``,
  ``graph``, ``pq``, ``calibrate`` (slim), and ``other`` (the rest of the wall time). Wall seconds
  per phase; ``build_cpu_s`` is the build's CPU seconds in all (on a shared machine, the figure
  that compares across loads; the build runs one thread here, bar BLAS and the tokenizer).
- **per-commit s, first and last 10%.** The writer embeds once per commit (`COMMIT_CHUNKS`
  chunks), so the embedder's calls mark the commits: a commit's ``cycle`` is the time from one
  embedder call to the next (its whole transaction plus the chunking of the next batch), its
  ``store`` the catalog + vectors + reload + manifest time charged between them, ``cycle_cpu``
  the CPU seconds of the cycle (load-independent). Growth from the first to the last 10% of
  commits is what an append-only writer keeps at 1.
- **progress**: one JSON line per commit (time, store seconds so far, RSS, CPU seconds) in
  ``FOLDER.progress.jsonl`` beside the index (and every 5 s a ``sample`` line: RSS, anon, file and the
  slimrag function running), flushed as the build goes: a run cut short still
  shows how commit cost and memory grew.
- **peak RSS** of the build child (``VmHWM``; ``base`` is the resident set after imports) and
  the vector bytes (N × dim × 4) it is judged against; ``peak_anon_mib`` / ``peak_file_mib``:
  the peaks of anonymous and file-backed resident memory, sampled every 0.2 s (`RssSampler`).
- **bytes by file** of the finished folder (``gen/`` files without their generation number),
  their total, and the total per byte of passage text (UTF-8).
- **open**: `Index.open` and the first vector search, in a fresh process; then ``--queries``
  vector searches (k=10, default `SearchConfig` otherwise): median latency, recall@10 against
  exact search (brute force over all N passages re-embedded in blocks; flat must give 1.0, which
  checks the bookkeeping), and for slim the median rows recomputed per query (texts the
  embedder was given during a search, less the query).
- ``--faiss``: faiss HNSW (M=32, efConstruction 40, efSearch 128) built over the same vectors in
  its own child: build s, peak RSS, bytes, recall@10, latency.
- ``--real pydocs``: the Python 3.11 documentation paragraphs (`bench.datasets`, 43k) with the
  real MiniLM embedder. Its vectors are cached per text in ``bench/data/scale-emb-pydocs.npz``:
  the first run embeds (and its ``embed`` phase is MiniLM's), later ones read the cache (the
  JSON says which). The index records the real embedder, so it re-opens with it. Its slim
  recall@10 is measured against the flat index of the same corpus (long paragraphs are several
  chunks), so build flat first with ``--keep``.

Load: the 1-minute load average before and after each child is recorded; on a shared machine
compare only figures taken in one run.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
DATA = ROOT / "data"
K = 10

#: (phase, module, attribute path) of the functions a build is timed through; several names per
#: phase so that the probes survive the index's refactors (a missing one is reported, not fatal)
PROBES: tuple[tuple[str, str, str], ...] = (
    ("chunk", "slimrag.ingest.source", "prepare"),
    ("catalog", "slimrag.catalog", "Catalog.put_document"),
    ("catalog", "slimrag.catalog", "Catalog.put_chunks"),
    ("catalog", "slimrag.catalog", "Catalog.delete_document"),
    ("catalog", "slimrag.catalog", "Catalog.transaction"),
    ("catalog", "slimrag.index.writer", "IndexWriter.stored_doc_id"),
    ("vectors", "slimrag.index.store.layout", "write_delta_part"),
    ("vectors", "slimrag.index.store.layout", "write_generation"),
    ("vectors", "slimrag.index.store.layout", "write_npy"),
    ("reload", "slimrag.index.core", "Index._load_vectors"),
    ("reload", "slimrag.index.state", "IndexState.committed"),
    ("reload", "slimrag.index.state", "IndexState.reload"),
    ("manifest", "slimrag.files", "write_json_atomic"),
    ("reload", "slimrag.index.store.vectors", "append_part"),
    ("compact", "slimrag.index.writer", "IndexWriter._compact"),
    ("compact", "slimrag.index.store.vectors", "write_next_generation"),
    ("graph", "slimrag.index.store.slim.graph", "build_graph"),
    ("pq", "slimrag.index.store.slim.pq", "train_pq"),
    ("pq", "slimrag.index.store.slim.build", "encode_rows"),
    ("calibrate", "slimrag.index.store.slim.build", "calibrate_pq_error"),
    ("calibrate", "slimrag.index.store.slim.build", "heldout_error"),
)
STORE_PHASES = ("catalog", "vectors", "reload", "manifest")


# -- timing from outside ------------------------------------------------------------------------
class PhaseClock:
    """Exclusive wall time per phase: a call's duration minus that of the probed calls nested in
    it. Wall time only: ``time.perf_counter`` is a vDSO read (~0.1 µs), while the CPU clock is a
    system call, and on a loaded machine a system call may lose the CPU (measured here at load
    14: ~460 µs per `time.process_time`, which inflated a 4,000-passage build from 9 s to 18 s)."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self._stack: list[list[float]] = []  # per open call: [nested seconds]

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._stack.append([0.0])
        t0 = time.perf_counter()
        try:
            yield
        finally:
            dt = time.perf_counter() - t0
            nested = self._stack.pop()[0]
            self.totals[name] = self.totals.get(name, 0.0) + dt - nested
            if self._stack:
                self._stack[-1][0] += dt

    def store_seconds(self) -> float:
        return sum(self.totals.get(p, 0.0) for p in STORE_PHASES)


def _timed(clock: PhaseClock, name: str, fn: Callable[..., Any], cm: bool) -> Callable[..., Any]:
    if cm:
        @contextlib.contextmanager
        def cm_wrapper(*a: Any, **kw: Any) -> Iterator[Any]:
            with clock.phase(name), fn(*a, **kw) as v:
                yield v
        return cm_wrapper

    def wrapper(*a: Any, **kw: Any) -> Any:
        with clock.phase(name):
            return fn(*a, **kw)
    return wrapper


def install_probes(clock: PhaseClock) -> list[str]:
    """Wrap every `PROBES` function, wherever the package holds a reference to it (a function
    imported by name lives in several module namespaces). Returns the names not found."""
    import importlib
    import pkgutil

    # import the write path's packages first, so that every module holding a reference to a probed
    # function (``from x import f``) is loaded and patched, even one the build imports lazily
    for name in ("slimrag.index", "slimrag.ingest", "slimrag.catalog"):
        pkg = importlib.import_module(name)
        for info in pkgutil.walk_packages(getattr(pkg, "__path__", []), name + "."):
            try:
                importlib.import_module(info.name)
            except ImportError:  # an optional dependency (Ray, a remote client) not installed
                continue
    missing = []
    for phase, mod_name, attr in PROBES:
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:
            missing.append(f"{mod_name}.{attr}")
            continue
        owner: Any = mod
        *path, last = attr.split(".")
        for p in path:
            owner = getattr(owner, p, None)
        fn = getattr(owner, last, None) if owner is not None else None
        if fn is None:
            missing.append(f"{mod_name}.{attr}")
            continue
        raw = inspect.unwrap(fn)
        # a @contextmanager function: its __wrapped__ is a generator function; time the with-block
        cm = raw is not fn and inspect.isgeneratorfunction(raw)
        wrapped = _timed(clock, phase, fn, cm)
        if path:  # a method: replace it on its class
            setattr(owner, last, wrapped)
            continue
        for m in list(sys.modules.values()):
            d = getattr(m, "__dict__", None)
            if isinstance(d, dict) and m.__name__.startswith("slimrag"):
                for k, v in list(d.items()):
                    if v is fn or v is raw:
                        d[k] = wrapped
    return missing


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")



def slimrag_step(thread: int | None, default: str) -> str:
    """``module.function`` of the innermost slimrag frame that ``thread`` is running now (what an
    RSS sampler charges its sample to), or ``default`` when it is outside slimrag."""
    frame = sys._current_frames().get(thread) if thread is not None else None
    while frame is not None and "slimrag" not in frame.f_code.co_filename:
        frame = frame.f_back
    return f"{Path(frame.f_code.co_filename).stem}.{frame.f_code.co_name}" if frame is not None else default

class RssSampler:
    """Peak anonymous and file-backed resident memory, sampled every ``period`` s on a thread:
    `VmHWM` alone cannot tell memory a build allocates from pages of files it maps (which the
    kernel can drop). With ``log``, every ``log_every`` s one JSON line (``sample``: seconds,
    RSS, anon, file, the innermost ``slimrag`` function the main thread is in) goes there too:
    the memory curve by build step, kept even when a run is cut short."""

    def __init__(self, period: float = 0.2, log: Any = None, log_every: float = 5.0) -> None:
        import threading

        self.peak = {"RssAnon": 0.0, "RssFile": 0.0}
        self._log, self._every = log, log_every
        self._main = threading.main_thread().ident
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period,), daemon=True)
        self._thread.start()

    def _where(self) -> str:
        return slimrag_step(self._main, "")

    def _run(self, period: float) -> None:
        start = last = time.perf_counter()
        while not self._stop.wait(period):
            now = {k: _status_mib(k) for k in self.peak}
            for k, v in now.items():
                self.peak[k] = max(self.peak[k], v)
            if self._log is not None and time.perf_counter() - last >= self._every:
                last = time.perf_counter()
                self._log.write(json.dumps({"sample": round(last - start, 1), "rss_mib": round(_status_mib("VmRSS")),
                                            "anon_mib": round(now["RssAnon"]), "file_mib": round(now["RssFile"]),
                                            "hwm_mib": round(_status_mib("VmHWM")), "at": self._where()}) + "\n")
                self._log.flush()

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        return {f"peak_{k[3:].lower()}_mib": round(v, 1) for k, v in self.peak.items()}


def _load1() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def stored_rows(root: Path) -> int:
    """Rows of the current generation (a build ends compacted: every chunk is there)."""
    gen = json.loads((root / "manifest.json").read_text())["generation"]
    return int(np.load(root / f"gen-{gen:06d}" / "ids.npy", mmap_mode="r").shape[0])


def folder_bytes(root: Path) -> dict[str, int]:
    """Bytes by file, a generation's files as ``gen/NAME``, delta parts summed as ``delta/``."""
    out: dict[str, int] = {}
    for p in sorted(root.rglob("*")):
        if not p.is_file():
            continue
        rel = p.relative_to(root).parts
        key = ("gen/" + "/".join(rel[1:]) if rel[0].startswith("gen-") else
               "delta/" if rel[0] == "delta" else "/".join(rel))
        out[key] = out.get(key, 0) + p.stat().st_size
    return out


# -- corpora ------------------------------------------------------------------------------------
class Corpus:
    """Texts, queries and the embedder of one run."""

    name = "synthetic"

    def __init__(self, n: int, seed: int = 0) -> None:
        from bench.passages import Passages

        self.n, self.p = n, Passages(seed)

    def pairs(self) -> Iterator[tuple[str, str]]:
        return self.p.pairs(self.n)

    def blocks(self, size: int = 65536) -> Iterator[tuple[int, list[str]]]:
        """(first passage number, texts) of every passage, in blocks (for the ground truth)."""
        buf: list[str] = []
        start = 0
        for i, (_, text) in enumerate(self.p.iter(self.n)):
            buf.append(text)
            if len(buf) == size:
                yield start, buf
                start, buf = i + 1, []
        if buf:
            yield start, buf

    def queries(self, nq: int) -> list[str]:
        return self.p.queries(nq)

    def embedder(self) -> Any:
        from slimrag.embed.synthetic import SyntheticEmbedder

        return SyntheticEmbedder()

    def passage(self, source: str) -> int:
        from bench.passages import index_of

        return index_of(source)

    def recall(self, found: list[Any], queries: list[str], folder: Path) -> float | None:
        """recall@10 of the hits against brute force over every passage (one chunk each)."""
        truth = exact_topk(self, queries)
        return _recall([[self.passage(h.source) for h in hits] for hits in found], truth)


class PydocsCorpus(Corpus):
    """The Python docs paragraphs (one source each) with MiniLM behind a per-text vector cache."""

    name = "pydocs"

    def __init__(self, n: int, seed: int = 0) -> None:
        from bench.datasets import python_doc_paragraphs

        paras = python_doc_paragraphs()
        self.items = paras[:n] if n else paras
        self.n = len(self.items)
        self._index = {s: i for i, (s, _) in enumerate(self.items)}

    def pairs(self) -> Iterator[tuple[str, str]]:
        return iter(self.items)

    def blocks(self, size: int = 65536) -> Iterator[tuple[int, list[str]]]:
        for s in range(0, self.n, size):
            yield s, [t for _, t in self.items[s: s + size]]

    def queries(self, nq: int) -> list[str]:
        rng = np.random.default_rng(1)
        rows = rng.choice(self.n, nq, replace=False)
        return [" ".join(self.items[int(r)][1].split()[:12]) for r in rows]

    def embedder(self) -> Any:
        from slimrag.embed.local import LocalEmbedder

        return CachedEmbedder(LocalEmbedder(), DATA / "scale-emb-pydocs.npz")

    def passage(self, source: str) -> int:
        return self._index[source]

    def recall(self, found: list[Any], queries: list[str], folder: Path) -> float | None:
        """Long paragraphs are several chunks, so exact search is the flat index of the same corpus
        (same chunk ids) when one was kept beside this one; None without it, or for flat itself."""
        flat = Path(str(folder).replace("-slim-", "-flat-"))
        if flat == folder or not (flat / "manifest.json").exists():
            return None
        from slimrag import Index
        from slimrag.config import SearchConfig

        with Index.open(flat, self.embedder()) as idx:
            truth = [[h.chunk_id for h in idx.search(q, config=SearchConfig(k=K, mode="vector"))] for q in queries]
        return _recall([[h.chunk_id for h in hits] for hits in found], truth)


class CachedEmbedder:
    """Wraps a real embedder with a per-text vector cache on disk; records itself as the real one,
    so the index re-opens with the real embedder. Built lazily on `slimrag.embed.base.Embedder`."""

    def __new__(cls, inner: Any, path: Path) -> Any:
        from slimrag.embed.base import Embedder

        class _Cached(Embedder):
            kind = inner.kind

            def __init__(self) -> None:
                self.inner, self.path = inner, path
                self.model_id, self.dim = inner.model_id, inner.dim
                self.cache: dict[bytes, np.ndarray] = {}
                self.hits = self.misses = self._unsaved = 0
                if path.exists():
                    z = np.load(path)
                    self.cache = dict(zip((bytes(k) for k in z["keys"]), z["vectors"], strict=True))

            def record(self) -> dict[str, Any]:
                return inner.record()

            def embed_batch(self, texts: Any) -> np.ndarray:
                return self.embed(texts)

            def embed(self, texts: Any, batch_size: int = 64, progress: bool | None = None) -> np.ndarray:
                keys = [hashlib.blake2b(t.encode(), digest_size=16).digest() for t in texts]
                todo = [i for i, k in enumerate(keys) if k not in self.cache]
                self.hits += len(texts) - len(todo)
                self.misses += len(todo)
                if todo:
                    fresh = inner.embed([texts[i] for i in todo], batch_size=batch_size, progress=progress)
                    for i, v in zip(todo, fresh, strict=True):
                        self.cache[keys[i]] = v
                    self._unsaved += len(todo)
                    if self._unsaved >= 8192:  # a killed run keeps most of its embedding work
                        self.save()
                if not texts:
                    return np.zeros((0, self.dim), np.float32)
                return np.stack([self.cache[k] for k in keys]).astype(np.float32)

            def save(self) -> None:
                if self._unsaved:
                    self._unsaved = 0
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    keys = np.array([np.frombuffer(k, np.uint8) for k in self.cache])
                    tmp = self.path.with_suffix(".tmp.npz")
                    np.savez(tmp, keys=keys, vectors=np.stack(list(self.cache.values())))
                    tmp.rename(self.path)

        if not inner.dim:
            inner.embed_batch(["dimension probe"])
        return _Cached()


CORPORA: dict[str, type[Corpus]] = {"synthetic": Corpus, "pydocs": PydocsCorpus}


def _work(args: argparse.Namespace, n: int) -> Path:
    return Path(args.work) / f"{args.corpus}-{args.storage}-{n}.slimrag"


# -- children -----------------------------------------------------------------------------------
def child_build(corpus: Corpus, storage: str, out: Path) -> dict[str, Any]:
    """Build the index in this process, timed by phase; returns the figures."""
    from slimrag import Index

    clock = PhaseClock()
    missing = install_probes(clock)
    embedder = corpus.embedder()
    base_mib = _status_mib("VmRSS")
    calls: list[tuple[float, float, int, float, float]] = []  # start, end, texts, store s, CPU s at start
    inner_embed = embedder.embed

    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.with_name(out.name + ".progress.jsonl").open("w")  # a run cut short still says something
    start = time.perf_counter()

    def embed(texts: Any, *a: Any, **kw: Any) -> np.ndarray:
        t0, cpu0 = time.perf_counter(), time.process_time()  # one CPU-clock read a commit: cheap enough
        store0 = clock.store_seconds()
        with clock.phase("embed"):
            v = inner_embed(texts, *a, **kw)
        calls.append((t0, time.perf_counter(), len(texts), store0, cpu0))
        log.write(json.dumps({"commit": len(calls), "t": round(t0 - start, 3), "store_s": round(store0, 3),
                              "rss_mib": round(_status_mib("VmRSS")), "hwm_mib": round(_status_mib("VmHWM")),
                              "cpu_s": round(cpu0, 2)}) + "\n")
        log.flush()
        return v

    embedder.embed = embed
    text_bytes = 0

    def pairs() -> Iterator[tuple[str, str]]:
        nonlocal text_bytes
        it = corpus.pairs()
        while True:
            with clock.phase("input"):
                item = next(it, None)
            if item is None:
                return
            text_bytes += len(item[1].encode())
            yield item

    slim_stats: dict[str, Any] = {}
    _capture_slim_stats(slim_stats)
    sampler = RssSampler(log=log)
    t0, c0 = time.perf_counter(), time.process_time()
    idx = Index.build(pairs(), out, storage=storage, embedder=embedder, overwrite=True)
    total, total_cpu = time.perf_counter() - t0, time.process_time() - c0
    idx.close()
    rss_parts = sampler.stop()
    log.close()
    chunks = stored_rows(out)
    if hasattr(embedder, "save"):
        embedder.save()
    phases = {k: round(v, 3) for k, v in sorted(clock.totals.items())}
    phases["other"] = round(total - sum(clock.totals.values()), 3)
    commits = _commit_costs(calls, clock)
    sizes = folder_bytes(out)
    return {
        "passages": corpus.n, "build_s": round(total, 3), "phases_s": phases,
        "build_cpu_s": round(total_cpu, 3), "probes_missing": missing, "commits": commits,
        "peak_rss_mib": round(_status_mib("VmHWM"), 1), "base_rss_mib": round(base_mib, 1), **rss_parts,
        "chunks": chunks, "text_bytes": text_bytes, "dim": int(embedder.dim),
        "vector_mib": round(chunks * int(embedder.dim) * 4 / 2**20, 1),
        "bytes": sizes, "total_bytes": sum(sizes.values()),
        "bytes_per_text_byte": round(sum(sizes.values()) / max(1, text_bytes), 3),
        "embed_texts_per_s": round(sum(c[2] for c in calls) / max(1e-9, clock.totals.get("embed", 0.0))),
        "slim_stats": slim_stats,
        "embed_cache": ({"hits": embedder.hits, "misses": embedder.misses} if hasattr(embedder, "hits") else None),
    }


def _capture_slim_stats(sink: dict[str, Any]) -> None:
    """When `build_slim` takes a ``stats`` dict (its own phase timings), hand it one to fill."""
    fn = _find("slimrag.index.store.slim.build", "build_slim")
    if fn is None or "stats" not in inspect.signature(fn).parameters:
        return

    def with_stats(*a: Any, **kw: Any) -> Any:
        kw.setdefault("stats", sink)
        return fn(*a, **kw)

    for m in list(sys.modules.values()):
        d = getattr(m, "__dict__", None)
        if isinstance(d, dict) and m.__name__.startswith("slimrag"):
            for k, v in list(d.items()):
                if v is fn:
                    d[k] = with_stats


def _find(mod_name: str, attr: str) -> Any:
    import importlib

    try:
        return getattr(importlib.import_module(mod_name), attr, None)
    except ImportError:
        return None


def _commit_costs(calls: list[tuple[float, float, int, float, float]], clock: PhaseClock) -> dict[str, Any]:
    """Per-commit cycle and store seconds and cycle CPU seconds (see the module header), first and
    last 10%."""
    if len(calls) < 3:
        return {"count": len(calls)}
    cycle = np.diff([c[0] for c in calls])
    store = np.diff([c[3] for c in calls])
    cycle_cpu = np.diff([c[4] for c in calls])
    tenth = max(1, len(cycle) // 10)
    out: dict[str, Any] = {"count": len(calls), "chunks_per_commit": int(np.median([c[2] for c in calls]))}
    for name, v in (("cycle", cycle), ("store", store), ("cycle_cpu", cycle_cpu)):
        first, last = float(np.mean(v[:tenth])), float(np.mean(v[-tenth:]))
        out[name] = {"first10_s": round(first, 4), "last10_s": round(last, 4),
                     "ratio": round(last / first, 3) if first > 0 else None}
    return out


def child_open(corpus: Corpus, out: Path, nq: int) -> dict[str, Any]:
    """Open cold, first search, then ``nq`` timed vector searches; recall against brute force."""
    from slimrag import Index
    from slimrag.config import SearchConfig

    queries = corpus.queries(nq + 1)
    t0 = time.perf_counter()
    idx = Index.open(out)
    t_open = time.perf_counter() - t0
    counted = [0]
    emb = idx.embedder if hasattr(idx, "embedder") else None
    if emb is not None:
        inner = emb.embed

        def counting(texts: Any, *a: Any, **kw: Any) -> np.ndarray:
            counted[0] += len(texts)
            return inner(texts, *a, **kw)
        emb.embed = counting
    cfg = SearchConfig(k=K, mode="vector")
    t1 = time.perf_counter()
    idx.search(queries[0], config=cfg)
    t_first = time.perf_counter() - t1
    open_rss = _status_mib("VmHWM")
    lat, rows, found = [], [], []
    for q in queries[1:]:
        before = counted[0]
        t = time.perf_counter()
        hits = idx.search(q, config=cfg)
        lat.append(time.perf_counter() - t)
        rows.append(counted[0] - before - 1)
        found.append(hits)
    idx.close()
    rec = corpus.recall(found, queries[1:], out)
    return {"open_s": round(t_open, 4), "first_search_s": round(t_first, 4),
            "open_rss_mib": round(open_rss, 1), "queries": nq,
            "latency_ms_p50": round(1000 * float(np.median(lat)), 2),
            "latency_ms_p90": round(1000 * float(np.percentile(lat, 90)), 2),
            "recall_at_10": rec, "rows_recomputed_p50": float(np.median(rows))}


def _recall(found: list[list[int]], truth: Any) -> float:
    return round(float(np.mean([len(set(f) & set(np.asarray(t).tolist())) / K
                                for f, t in zip(found, truth, strict=True)])), 4)


def exact_topk(corpus: Corpus, queries: list[str]) -> np.ndarray:
    """Brute-force top-K passage numbers per query, streaming the corpus in blocks."""
    emb = corpus.embedder()
    q = emb.embed(queries)
    best_s = np.full((len(queries), K), -np.inf, np.float32)
    best_i = np.zeros((len(queries), K), np.int64)
    for start, texts in corpus.blocks():
        s = q @ emb.embed(texts).T
        cat_s = np.concatenate([best_s, s], axis=1)
        cat_i = np.concatenate([best_i, np.broadcast_to(np.arange(start, start + len(texts)), s.shape)], axis=1)
        top = np.argpartition(-cat_s, K - 1, axis=1)[:, :K]
        best_s, best_i = np.take_along_axis(cat_s, top, 1), np.take_along_axis(cat_i, top, 1)
    return best_i


def child_faiss(corpus: Corpus, nq: int, folder: Path) -> dict[str, Any]:
    """faiss HNSW (M=32) over the same vectors: build s, peak RSS, bytes, recall@10, latency."""
    import faiss

    faiss.omp_set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    emb = corpus.embedder()
    x = np.concatenate([emb.embed(t) for _, t in corpus.blocks()])
    queries = corpus.queries(nq + 1)[1:]
    qv = emb.embed(queries)
    base = _status_mib("VmRSS")
    t0 = time.perf_counter()
    index = faiss.IndexHNSWFlat(x.shape[1], 32, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = 40
    index.add(x)
    build = time.perf_counter() - t0
    index.hnsw.efSearch = 128
    lat, found = [], []
    for v in qv:
        t = time.perf_counter()
        _, ids = index.search(v[None, :], K)
        lat.append(time.perf_counter() - t)
        found.append(ids[0].tolist())
    truth = exact_topk(corpus, queries)
    folder.mkdir(parents=True, exist_ok=True)
    faiss.write_index(index, str(folder / "hnsw.faiss"))
    size = (folder / "hnsw.faiss").stat().st_size
    rec = _recall(found, truth)
    return {"build_s": round(build, 3), "peak_rss_mib": round(_status_mib("VmHWM"), 1),
            "base_rss_mib": round(base, 1), "bytes": size, "recall_at_10": rec,
            "latency_ms_p50": round(1000 * float(np.median(lat)), 3)}


def child(argv: list[str]) -> None:
    """Entry of a child process: ``_child WHAT CORPUS N STORAGE FOLDER NQ``; prints one JSON line."""
    what, corpus_name, n, storage, folder, nq = argv
    corpus = CORPORA[corpus_name](int(n))
    if what == "build":
        res = child_build(corpus, storage, Path(folder))
    elif what == "open":
        res = child_open(corpus, Path(folder), int(nq))
    else:
        res = child_faiss(corpus, int(nq), Path(folder))
    print("RESULT " + json.dumps(res))


def run_child(what: str, args: argparse.Namespace, n: int, folder: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.scale", "_child", what, args.corpus, str(n), args.storage,
           str(folder), str(args.queries)]
    load0 = _load1()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=ROOT.parent)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{what} N={n} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    res = json.loads(lines[-1][len("RESULT "):])
    res["wall_s"] = round(time.perf_counter() - t0, 2)
    res["load1"] = [load0, _load1()]
    return res


# -- report -------------------------------------------------------------------------------------
def _fmt_mib(b: float) -> str:
    return f"{b / 2**20:,.1f}"


def table(rows: list[dict[str, Any]]) -> str:
    phases = sorted({p for r in rows for p in r["build"]["phases_s"]})
    head = ["corpus", "storage", "N", "chunks", "build s", *phases, "build cpu s", "peak MiB", "vec MiB",
            "commit store s first/last (x)", "folder MiB", "B/text B", "open s", "1st search s",
            "p50 ms", "recall@10", "rows p50", "load"]
    out = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        b, o, c = r["build"], r.get("open", {}), r["build"]["commits"]
        st = c.get("store", {})
        commit = (f"{st['first10_s']:.3f}/{st['last10_s']:.3f} ({st['ratio']})" if st else "-")
        out.append(" | ".join(str(v) for v in [
            r["corpus"], r["storage"], f"{r['n']:,}", f"{b['chunks']:,}", f"{b['build_s']:.1f}",
            *(f"{b['phases_s'].get(p, 0):.1f}" for p in phases), f"{b.get('build_cpu_s', 0):.1f}",
            f"{b['peak_rss_mib']:,.0f}",
            f"{b['vector_mib']:,.0f}", commit, _fmt_mib(b["total_bytes"]), f"{b['bytes_per_text_byte']:.2f}",
            f"{o.get('open_s', 0):.3f}", f"{o.get('first_search_s', 0):.3f}", o.get("latency_ms_p50", "-"),
            o.get("recall_at_10", "-"), o.get("rows_recomputed_p50", "-"),
            "{:.1f}-{:.1f}".format(*b["load1"])]))
    faiss_rows = [r for r in rows if r.get("faiss")]
    if faiss_rows:
        out += ["", "faiss HNSW M=32 | N | build s | peak MiB | MiB | recall@10 | p50 ms",
                "--- | --- | --- | --- | --- | --- | ---"]
        for r in faiss_rows:
            f = r["faiss"]
            out.append(f"same vectors | {r['n']:,} | {f['build_s']:.1f} | {f['peak_rss_mib']:,.0f} | "
                       f"{_fmt_mib(f['bytes'])} | {f['recall_at_10']} | {f['latency_ms_p50']}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--storage", choices=("flat", "slim"), default="flat")
    ap.add_argument("--n", default="10000", help="comma-separated N (passages); 0 with --real: all")
    ap.add_argument("--real", choices=("pydocs",), help="a real corpus with the real embedder instead")
    ap.add_argument("--queries", type=int, default=200, help="timed vector searches per N")
    ap.add_argument("--faiss", action="store_true", help="faiss HNSW M=32 over the same vectors")
    ap.add_argument("--work", default="/tmp/bench-scale", help="where the indexes are built")
    ap.add_argument("--keep", action="store_true", help="keep the index folders")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per child")
    ap.add_argument("--label", default="", help="names the code measured (e.g. a commit); part of the JSON key")
    args = ap.parse_args()
    args.corpus = args.real or "synthetic"
    RESULTS.mkdir(parents=True, exist_ok=True)
    out_json = RESULTS / "scale.json"
    rows = []
    for n in (int(s) for s in args.n.split(",")):
        folder = _work(args, n)
        folder.parent.mkdir(parents=True, exist_ok=True)
        print(f"{args.corpus} {args.storage} N={n:,}: building (load {_load1():.2f})", file=sys.stderr, flush=True)
        build = run_child("build", args, n, folder)
        build["load1"] = build.pop("load1")
        print(f"  built in {build['build_s']:.1f}s, peak {build['peak_rss_mib']:,.0f} MiB; opening",
              file=sys.stderr, flush=True)
        row: dict[str, Any] = {"corpus": args.corpus, "storage": args.storage, "n": build["passages"],
                               "label": args.label, "build": build,
                               "open": run_child("open", args, n, folder),
                               "when": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
                               "command": " ".join(["python -m bench.scale", *sys.argv[1:]])}
        if args.faiss:
            row["faiss"] = run_child("faiss", args, n, folder.with_suffix(".faiss"))
            shutil.rmtree(folder.with_suffix(".faiss"), ignore_errors=True)
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
        rows.append(row)
        key = (args.corpus, args.storage, row["n"], args.label)
        # Re-read: another run may have written its rows since this one started (a 3M run takes hours).
        saved = json.loads(out_json.read_text()) if out_json.exists() else []
        saved = [s for s in saved if (s["corpus"], s["storage"], s["n"], s.get("label", "")) != key] + [row]
        out_json.write_text(json.dumps(saved, indent=1))
        print(table([row]), file=sys.stderr, flush=True)
    print(table(rows))
    print(f"\nwritten to {out_json}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        child(sys.argv[2:])
    else:
        main()
