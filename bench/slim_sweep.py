"""Recall of the slim index versus rerank depth R, PQ subspaces M and graph degree.

    python -m bench.slim_sweep                       # synthetic 5k text-like vectors (bench.vectors)
    python -m bench.slim_sweep --vectors X.npy --queries Q.npy   # your own unit-norm embeddings
    python -m bench.slim_sweep --vectors X.npy --queries Q.npy --knobs   # query knobs only
    python -m bench.slim_sweep --latency 3000        # flat vs slim from query text, cache cold / warm
    python -m bench.slim_sweep --frontier DIR --passages 1000000 --codes kept,opq   # recall target frontier

``--knobs``: the default build only, and a grid of the query knobs (``SearchConfig``: ef, rerank,
early_stop): the recall / recomputation frontier that slim's search defaults are picked from.

``--frontier DIR``: the recall target's frontier on one kept generation, without rebuilding the
graph. ``DIR`` holds ``x.npy`` (unit-norm rows), ``q.npy`` (queries) and ``gen/`` (a saved slim
generation); with ``--passages N`` the first two are made there from `bench.passages` and the
stand-in embedder (the vectors and queries of ``bench.scale``) and ``gen/`` is built with the
default `SlimConfig` when missing (1M: ~10 min of both cores), so later sweeps reuse it. For each
``--codes`` variant (``kept``: the generation as built; ``plain`` / ``opq``: PQ retrained on the
kept graph without / with the rotation, its error bound and stop table recomputed) and each
``SearchConfig.recall`` target of ``--targets`` (0: the fixed depth ``rerank``): recall@10 against
exact search, median / mean / p90 rows recomputed, structure ms per query (wall time less the
recompute calls), bytes per vector.

Ground truth is numpy brute force; ``recompute`` is backed by the true matrix, so the exact level
is exact and recall loss comes from the graph walk or the PQ ranking. Prints a table and writes
JSON (``--out``). Columns: bytes per vector on disk (graph + codes + hubs + entry ids; codebooks
are a fixed cost reported separately), recall@10 and @3, mean recomputed rows per query, mean
nodes scored by PQ, and milliseconds per query spent outside ``recompute``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.vectors import text_like
from slimrag.config import SearchConfig
from slimrag.index.store.slim import (
    SlimArtifacts,
    SlimConfig,
    SlimSearcher,
    build_slim,
    calibrate_pq_error,
    slim_bytes,
)
from slimrag.index.store.slim.graph import build_graph, pick_hubs
from slimrag.index.store.slim.pq import PQConfig, train_pq


def evaluate(art: SlimArtifacts, x: np.ndarray, q: np.ndarray, truth: np.ndarray, cfg: SearchConfig) -> dict:
    spent = [0.0]

    def recompute(rows: np.ndarray) -> np.ndarray:
        t = time.perf_counter()
        out = np.asarray(x[rows])
        spent[0] += time.perf_counter() - t
        return out

    searcher = SlimSearcher(art, recompute, SlimConfig(cache_bytes=0), cfg)
    t = time.perf_counter()
    res = searcher.search_batch(q, 10)
    wall = time.perf_counter() - t - spent[0]
    r10 = np.mean([len(set(r.rows.tolist()) & set(t.tolist())) / 10 for r, t in zip(res, truth, strict=True)])
    r3 = np.mean([len(set(r.rows[:3].tolist()) & set(t[:3].tolist())) / 3 for r, t in zip(res, truth, strict=True)])
    return {
        "recall@10": round(float(r10), 4),
        "recall@3": round(float(r3), 4),
        "recomputed": round(float(np.mean([r.stats.recomputed for r in res])), 1),
        "rows_p50": float(np.median([r.stats.recomputed for r in res])),
        "rows_p90": float(np.percentile([r.stats.recomputed for r in res], 90)),
        "visited": round(float(np.mean([r.stats.visited for r in res])), 0),
        "ms_per_query": round(1000 * wall / len(q), 2),
    }


def sweep(name: str, x: np.ndarray, q: np.ndarray, rows: list[dict]) -> None:
    truth = np.argsort(-(q @ x.T), axis=1)[:, :10]
    base = SlimConfig()
    t = time.perf_counter()
    ref = build_slim(x, base)
    print(f"\n== {name}: n={len(x)} d={x.shape[1]} queries={len(q)}; default build {time.perf_counter() - t:.1f} s")
    with tempfile.TemporaryDirectory() as tmp:
        ref.save(tmp)
        sizes = slim_bytes(tmp)
    print(f"default bytes/vector {sizes['per_vector']:.1f} (+ fixed {sizes['fixed'] / 1024:.0f} KiB codebooks)")
    graphs = {}
    for deg in (8, 12, 16):
        gcfg = dataclasses.replace(base.graph, base_degree=deg)
        graphs[deg] = build_graph(x, gcfg)
    pqs = {}
    for m in (32, 48, 64):
        pq = train_pq(x, PQConfig(m=m))
        codes = pq.encode(x)
        pqs[m] = (pq, codes, calibrate_pq_error(x, pq, codes, base.error_quantile))
    header = f"{'deg':>4} {'avg':>5} {'M':>3} {'B/vec':>6} {'R':>3} {'stop':>5} {'r@10':>6} {'r@3':>6} {'recomp':>6} {'visit':>6} {'ms/q':>6}"
    print(header)
    for deg, graph in graphs.items():
        for m, (pq, codes, err) in pqs.items():
            art = dataclasses.replace(ref, graph=graph, pq=pq, codes=codes, pq_error=err,
                                      hub_rows=pick_hubs(graph, len(ref.hub_rows)))
            art = dataclasses.replace(art, hub_vectors=x[art.hub_rows].astype(np.float16))
            per_vec = (graph.nbytes + codes.nbytes + art.hub_vectors.nbytes + 2 * len(art.entry_rows)) / len(x)
            for r, stop in ((16, False), (20, False), (24, False), (32, False), (24, True)):
                cfg = SearchConfig(rerank=r, early_stop=stop)
                out = evaluate(art, x, q, truth, cfg)
                row = {"data": name, "base_degree": deg, "avg_degree": round(graph.n_edges / graph.n, 1),
                       "M": m, "bytes_per_vector": round(per_vec, 1), "R": r, "early_stop": stop, **out}
                rows.append(row)
                print(f"{deg:>4} {row['avg_degree']:>5} {m:>3} {per_vec:>6.1f} {r:>3} {str(stop):>5} "
                      f"{out['recall@10']:>6.3f} {out['recall@3']:>6.3f} {out['recomputed']:>6.1f} "
                      f"{out['visited']:>6.0f} {out['ms_per_query']:>6.2f}", flush=True)


def knobs(name: str, x: np.ndarray, q: np.ndarray, rows: list[dict]) -> None:
    """Default build; recall@10 and rows recomputed per query over a grid of query knobs."""
    truth = np.argsort(-(q @ x.T), axis=1)[:, :10]
    art = build_slim(x, SlimConfig())
    print(f"\n== {name}: n={len(x)} queries={len(q)}; PQ m={art.pq.m} bits={art.pq.bits} error {art.pq_error:.3f}")
    print(f"{'ef':>4} {'R':>3} {'stop':>5} {'r@10':>6} {'r@3':>6} {'recomp':>6} {'visit':>6} {'ms/q':>6}")
    for ef in (48, 64, 128):
        for r in (12, 16, 18, 20, 24):
            for stop in (False, True) if ef == 64 else (True,):
                out = evaluate(art, x, q, truth, SearchConfig(ef=ef, rerank=r, early_stop=stop))
                rows.append({"data": name, "ef": ef, "R": r, "early_stop": stop, **out})
                print(f"{ef:>4} {r:>3} {str(stop):>5} {out['recall@10']:>6.3f} {out['recall@3']:>6.3f} "
                      f"{out['recomputed']:>6.1f} {out['visited']:>6.0f} {out['ms_per_query']:>6.2f}", flush=True)


def latency(limit: int, warm: list[int], nl: int, rows: list[dict]) -> None:
    """Median latency from query text (embed + search) of flat and of slim at the default
    `SearchConfig`, slim with its default vector cache warmed by ``warm`` earlier queries.

    Corpus: the first ``limit`` python-doc paragraphs, self-queries (as ``bench.index``). The
    warm-up queries fill the cache with the stored vectors (what re-embedding returns, to float
    noise) so that only the timed queries pay real embeddings; timed queries (the last ``nl``)
    are disjoint from the warm-up ones (the first ``w``)."""
    from bench.index import _pydocs
    from slimrag.embed.local import LocalEmbedder
    from slimrag.index.store.flat import FlatVectors

    corpus = _pydocs(limit, 1000, 0)
    x = np.ascontiguousarray(corpus.vectors, np.float32)
    qv_all = np.ascontiguousarray(corpus.query_vectors, np.float32)
    emb = LocalEmbedder()
    emb.embed(["warm-up"])
    texts, test = corpus.texts, corpus.queries[-nl:]
    truth = np.argsort(-(qv_all[-nl:] @ x.T), axis=1)[:, :10]
    flat = FlatVectors(np.arange(len(x)), x)
    flat_ms = []
    for text in test:
        t = time.perf_counter()
        flat.search(emb.embed([text]), 10)
        flat_ms.append(1000 * (time.perf_counter() - t))
    f50 = float(np.median(flat_ms))
    print(f"\n== latency, pydocs first {limit}, {nl} timed queries, SearchConfig() = {SearchConfig()}")
    print(f"flat: p50 {f50:.0f} ms")
    art = build_slim(x, SlimConfig())
    for w in warm:
        searcher = SlimSearcher(art, lambda r: x[r], SlimConfig(), SearchConfig())
        if w:
            searcher.search_batch(qv_all[:w], 10)
        searcher.recompute = lambda r: emb.embed([texts[i] for i in r.tolist()])
        ms, rec, found = [], [], []
        for text in test:
            t = time.perf_counter()
            res = searcher.search(emb.embed([text])[0], 10)
            ms.append(1000 * (time.perf_counter() - t))
            rec.append(res.stats.recomputed)
            found.append(res.rows)
        r10 = float(np.mean([len(set(f.tolist()) & set(t.tolist())) / 10 for f, t in zip(found, truth, strict=True)]))
        row = {"data": f"pydocs-{limit}", "warm_queries": w, "cached_rows": len(searcher.cache),
               "flat_p50_ms": round(f50, 1), "slim_p50_ms": round(float(np.median(ms)), 1),
               "ratio": round(float(np.median(ms)) / f50, 2), "recomputed": round(float(np.mean(rec)), 1),
               "recall@10": round(r10, 3)}
        rows.append(row)
        print(row, flush=True)


def _frontier_data(work: Path, passages: int | None, nq: int) -> tuple[np.ndarray, np.ndarray]:
    """``x.npy`` (memory-mapped) and ``q.npy`` of ``work``, made from `bench.passages` first when
    ``passages`` is given and they are missing."""
    work.mkdir(parents=True, exist_ok=True)
    if passages and not (work / "x.npy").exists():
        from bench.passages import Passages
        from slimrag.embed.synthetic import SyntheticEmbedder

        p, emb = Passages(0), SyntheticEmbedder()
        x = np.lib.format.open_memmap(work / "x.tmp.npy", "w+", np.float32, (passages, emb.dim))
        buf: list[str] = []
        start = 0
        for i, (_, text) in enumerate(p.iter(passages)):
            buf.append(text)
            if len(buf) == 65536 or i == passages - 1:
                x[start : start + len(buf)] = emb.embed(buf)
                start, buf = start + len(buf), []
        x.flush()
        del x
        np.save(work / "q.npy", emb.embed(p.queries(nq + 1)[1:]))  # bench.scale times the first alone
        (work / "x.tmp.npy").rename(work / "x.npy")
    return np.load(work / "x.npy", mmap_mode="r"), np.load(work / "q.npy").astype(np.float32)


def _recode(x: np.ndarray, art: SlimArtifacts, rotate: bool) -> tuple[SlimArtifacts, float]:
    """``art`` with its PQ retrained (``rotate`` or not) on the same graph, as `build_slim` does
    it: codes, error bound, held-out error, stop table. Returns it and the seconds spent."""
    from slimrag.index.store.slim.build import calibrate_stop, encode_rows, heldout_error

    cfg = SlimConfig(pq=PQConfig(rotate=rotate))
    t = time.perf_counter()
    pq = train_pq(x, cfg.pq)
    codes = encode_rows(pq, x)
    err = calibrate_pq_error(x, pq, codes, cfg.error_quantile, seed=cfg.pq.seed, graph=art.graph)
    mse = heldout_error(x, pq, codes, cfg.pq.resolve(len(x), x.shape[1]))
    art = dataclasses.replace(art, pq=pq, codes=codes, pq_error=err, pq_mse=mse)
    art = dataclasses.replace(art, stop_table=calibrate_stop(x, art, seed=cfg.graph.seed))
    return art, time.perf_counter() - t


def frontier(work: Path, passages: int | None, codes: list[str], targets: list[float], nq: int,
             rows: list[dict]) -> None:
    """Recall target vs rows recomputed on one kept generation (see the module header)."""
    from slimrag.index.store.slim.build import exact_top
    from slimrag.index.store.slim.rows import RowReader

    x, q = _frontier_data(work, passages, nq)
    q = q[:nq]
    if (work / "truth.npy").exists() and len(np.load(work / "truth.npy")) >= len(q):
        truth = np.load(work / "truth.npy")[: len(q)]
    else:
        ids, sc = exact_top(RowReader(x), q, np.full(len(q), -1), 10)
        truth = np.take_along_axis(ids, np.argsort(-sc, axis=1), axis=1)
        np.save(work / "truth.npy", truth)
    if not (work / "gen" / "slim.json").exists():
        t = time.perf_counter()
        build_slim(x, SlimConfig()).save(work / "gen")
        print(f"built {work / 'gen'} in {time.perf_counter() - t:.0f} s", flush=True)
    kept = SlimArtifacts.load(work / "gen")
    print(f"\n== frontier: {work}, n={len(x):,}, {len(q)} queries")
    print(f"{'codes':>6} {'B/vec':>6} {'err':>6} {'target':>6} {'margin':>7} {'r@10':>6} {'rows p50':>8} "
          f"{'mean':>6} {'p90':>5} {'ms/q':>6}")
    for name in codes:
        art, spent = (kept, 0.0) if name == "kept" else _recode(x, kept, rotate=name == "opq")
        with tempfile.TemporaryDirectory() as tmp:
            art.save(tmp)
            per_vec = slim_bytes(tmp)["total_per_vector"]
        for target in targets:
            cfg = SearchConfig(recall=target)
            out = evaluate(art, x, q, truth, cfg)
            searcher = SlimSearcher(art, lambda r: x[r], SlimConfig(cache_bytes=0), cfg)
            margin = searcher.stop_margin(cfg)
            row = {"data": str(work), "n": len(x), "codes": name, "rotation": art.pq.rotation is not None,
                   "bytes_per_vector": round(per_vec, 2), "pq_error": round(art.pq_error, 4),
                   "recode_s": round(spent, 1), "target": target, "margin": margin, **out}
            rows.append(row)
            print(f"{name:>6} {per_vec:>6.1f} {art.pq_error:>6.3f} {target:>6} "
                  f"{'-' if margin is None else f'{margin:.3f}':>7} {out['recall@10']:>6.3f} {out['rows_p50']:>8} "
                  f"{out['recomputed']:>6} {out['rows_p90']:>5} {out['ms_per_query']:>6}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vectors", type=Path, help="(n, d) float32 unit-norm .npy")
    ap.add_argument("--queries", type=Path, help="(nq, d) float32 unit-norm .npy")
    ap.add_argument("--sizes", default="5000", help="synthetic corpus sizes, comma-separated (43000: ~10 min)")
    ap.add_argument("--knobs", action="store_true", help="default build, sweep the query knobs only")
    ap.add_argument("--latency", type=int, metavar="N", help="latency of flat and slim on the first N pydocs paragraphs")
    ap.add_argument("--warm", default="0,300,900", help="with --latency: warm-up queries before timing")
    ap.add_argument("--frontier", type=Path, metavar="DIR", help="recall-target frontier on the generation kept in DIR")
    ap.add_argument("--passages", type=int, help="with --frontier: make DIR's vectors from N stand-in passages")
    ap.add_argument("--codes", default="kept", help="with --frontier: kept, plain, opq (comma-separated)")
    ap.add_argument("--targets", default="0,0.9,0.93,0.95,0.96,0.97,0.98,0.99", help="with --frontier: recall targets")
    ap.add_argument("--nq", type=int, default=1000, help="with --frontier: queries")
    ap.add_argument("--out", type=Path, default=Path("bench/slim_sweep.json"))
    args = ap.parse_args()
    rows: list[dict] = []
    if args.frontier:
        frontier(args.frontier, args.passages, args.codes.split(","), [float(t) for t in args.targets.split(",")],
                 args.nq, rows)
    elif args.latency:
        latency(args.latency, [int(w) for w in args.warm.split(",")], 20, rows)
    elif args.vectors:
        x = np.load(args.vectors).astype(np.float32)
        q = np.load(args.queries).astype(np.float32)
        (knobs if args.knobs else sweep)(args.vectors.stem, x, q, rows)
    else:
        for n in (int(s) for s in args.sizes.split(",")):
            x, q = text_like(n, 200)
            sweep(f"synthetic-{n}", x, q, rows)
    args.out.write_text(json.dumps(rows, indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
