"""Build a slim generation from unit-norm vectors: graph, PQ, codes, hubs, entry layer, PQ error bound.

The vectors may be an ``np.memmap`` (the write path streams a build's vectors to disk): every
step reads them in blocks or gathers (`rows.RowReader`) and none holds a dense matrix with n rows of
more than a few dozen columns, so the build's memory is the graph's edge lists, the codes and one
partition's HNSW (``pool.py``), not the vectors.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from slimrag.index.store.slim.artifacts import SlimArtifacts
from slimrag.index.store.slim.config import SlimConfig
from slimrag.index.store.slim.graph import Graph, build_graph, pick_hubs
from slimrag.index.store.slim.pq import (
    PQConfig,
    ProductQuantizer,
    train_pq,
    training_rows,
)
from slimrag.index.store.slim.prune import PhaseClock
from slimrag.index.store.slim.rows import RowReader

#: most held-out rows `heldout_error` encodes
_HELDOUT = 4096


def build_slim(vectors: np.ndarray, config: SlimConfig | None = None, *, stats: dict | None = None) -> SlimArtifacts:
    """Build graph, PQ codes and hubs for unit-norm ``vectors`` (n, d) float32 (in memory or an
    ``np.memmap``); row ``i`` of the result is row ``i`` of the input. ``vectors`` may be dropped
    by the caller afterwards. ``stats`` (optional) receives seconds per phase (``pool_s``,
    ``prune_s``, ``reverse_s``, ``connect_s``, ``pq_s``, ``calibrate_s``) and the pool's shape."""
    config = config or SlimConfig()
    x = vectors if isinstance(vectors, np.ndarray) and vectors.dtype == np.float32 else np.asarray(vectors, np.float32)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"expected a non-empty (n, d) matrix, got shape {x.shape}")
    stats = {} if stats is None else stats
    graph = build_graph(x, config.graph, stats)
    clock = PhaseClock(stats)
    pq = train_pq(x, config.pq)
    codes = encode_rows(pq, x)
    clock.lap("pq")
    hub_rows = pick_hubs(graph, config.hub_count(len(x)))
    rng = np.random.default_rng(config.graph.seed)
    entry_rows = np.sort(rng.choice(len(x), config.entry_count(len(x)), replace=False)).astype(np.int64)
    pq_error = calibrate_pq_error(x, pq, codes, config.error_quantile, seed=config.pq.seed, graph=graph)
    pq_mse = heldout_error(x, pq, codes, config.pq.resolve(len(x), x.shape[1]))
    clock.lap("calibrate")
    hub_vectors = RowReader(x).take(hub_rows).astype(np.float16)
    art = SlimArtifacts(graph, pq, codes, hub_rows, hub_vectors, entry_rows, pq_error, pq_mse)
    art = replace(art, stop_table=calibrate_stop(x, art, seed=config.graph.seed))
    clock.lap("stop")
    return art


def encode_rows(pq: ProductQuantizer, x: np.ndarray, block: int = 65536) -> np.ndarray:
    """PQ codes of every row of ``x``, read ``block`` rows at a time (`rows.RowReader`)."""
    out = np.empty((len(x), pq.code_bytes), dtype=np.uint8)
    reader = RowReader(x)
    for start, rows in reader.blocks(block):
        out[start : start + len(rows)] = pq.encode(rows)
    reader.done()
    return out


def calibrate_pq_error(
    x: np.ndarray, pq: ProductQuantizer, codes: np.ndarray, quantile: float, samples: int = 512, seed: int = 0,
    graph: Graph | None = None,
) -> float:
    """Quantile of ``exact - pq`` inner product over (sample vector, one of its 32 nearest
    neighbours) pairs: the empirical error bound early termination relies on.

    With ``graph``, a sample's neighbours are the 32 closest of its two-hop neighbourhood in the
    graph (~150 rows, scored exactly): no pass over the n rows. Without, the exact 32 by a scan
    in column blocks keeping a running top 32: ``samples x block`` scores at a time, never
    ``samples x n``."""
    n = len(x)
    if n < 2:
        return 0.0
    rng = np.random.default_rng(seed)
    qs = np.sort(rng.choice(n, min(samples, n), replace=False))
    near = min(32, n - 1)
    reader = RowReader(x)
    xq = reader.take(qs)
    if graph is not None:
        top = []
        for i, r in enumerate(qs.tolist()):
            one = np.asarray(graph.neighbors(r), dtype=np.int64)
            two = [np.asarray(graph.neighbors(int(c)), dtype=np.int64) for c in one]
            hood = np.unique(np.concatenate([one, *two]))
            hood = hood[hood != r]
            s = reader.take(hood) @ xq[i]
            top.append((hood[np.argsort(-s)[:near]], np.sort(s)[::-1][:near]))
    else:
        best_ids, best = exact_top(reader, xq, qs, near)
        top = [(best_ids[i][best_ids[i] >= 0], best[i][best_ids[i] >= 0]) for i in range(len(qs))]
    reader.done()
    luts = pq.lookup_tables(xq)
    errs = []
    for i, (ids, exact) in enumerate(top):
        if len(ids):
            errs.append(exact - pq.scorer(luts[i], pq.unpack(np.asarray(codes[ids])), pq.inverse_norms(codes[ids]))(
                np.arange(len(ids))))
    return float(np.quantile(np.concatenate(errs), quantile)) if errs else 0.0


def exact_top(reader: RowReader, xq: np.ndarray, own: np.ndarray, k: int, block: int = 8192,
              ) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` rows (ids int64, scores float32; unordered, ``-1`` where fewer exist) of
    each of the queries ``xq``, which are the rows ``own`` (each excluded from its own list), by
    a scan over all rows in blocks: ``len(xq) x block`` scores at a time (16 MB for 512 queries)."""
    best_ids = np.full((len(xq), k), -1, dtype=np.int64)
    best = np.full((len(xq), k), -np.inf, dtype=np.float32)
    for start, rows in reader.blocks(block):
        s = xq @ rows.T
        s[own[:, None] == np.arange(start, start + len(rows))[None, :]] = -np.inf
        kk = min(k, s.shape[1])
        part = np.argpartition(-s, kk - 1, axis=1)[:, :kk]
        ids = np.concatenate([best_ids, part + start], axis=1)
        sc = np.concatenate([best, np.take_along_axis(s, part, axis=1)], axis=1)
        keep = np.argpartition(-sc, k - 1, axis=1)[:, :k]
        best_ids, best = np.take_along_axis(ids, keep, axis=1), np.take_along_axis(sc, keep, axis=1)
    best_ids[~np.isfinite(best)] = -1
    return best_ids, best


def heldout_error(x: np.ndarray, pq: ProductQuantizer, codes: np.ndarray, config: PQConfig) -> float:
    """Mean `ProductQuantizer.direction_error` of rows the codebooks were not trained on: the
    baseline of the drift check of incremental updates (`slimrag.index.store.slim.update`).

    Training rows quantize better than unseen ones (k-means overfits: 8-bit codebooks trained on
    400 rows put new rows 4.8x further away), so the baseline must be measured on held-out rows.
    Beyond ``train_size`` rows those exist (up to ``_HELDOUT`` are encoded, codes already at
    hand); otherwise a second quantizer of the same (m, bits) is trained on a seeded 80% and
    measured on the other 20% (one more PQ training, ~1 s at 3,000 rows). ``config`` must be
    resolved. Fewer than 10 rows: the training error (nothing to hold out)."""
    n = len(x)
    rng = np.random.default_rng(config.seed + 1)
    trained = training_rows(n, config)
    if trained is not None:
        rest = np.setdiff1d(np.arange(n), trained)
        rest = np.sort(rng.choice(rest, min(len(rest), _HELDOUT), replace=False))
        reader = RowReader(x)
        held = reader.take(rest)
        reader.done()
        return float(pq.direction_error(held, np.asarray(codes)[rest]).mean())
    if n < 10:
        return float(pq.direction_error(x, codes).mean())
    perm = rng.permutation(n)
    cut = int(0.8 * n)
    split = train_pq(x[perm[:cut]], config)
    held = x[perm[cut:][:_HELDOUT]]
    return float(split.direction_error(held, split.encode(held)).mean())


#: calibration queries of `calibrate_stop` (sample rows, left out of their own results)
_STOP_QUERIES = 512
#: stop margins `calibrate_stop` tabulates
_STOP_GRID = 128


def calibrate_stop(
    x: np.ndarray, art: SlimArtifacts, k: int = 10, queries: int = _STOP_QUERIES, seed: int = 0,
) -> tuple[tuple[float, float, float], ...]:
    """The adaptive rerank depth's calibration (Auncel's idea: set the work from a recall target
    measured at build time, not a fixed depth).

    Rerank walks the pool in PQ order in waves (first ``k`` rows, then ``SearchConfig().wave``)
    and stops once the next row's PQ score plus a bound is below the k-th exact score so far; the
    bound is ``pq_error`` within the first ``max(rerank, k)`` positions (the fixed depth's rule)
    and the stop *margin* past them (`SlimSearcher._done`). Here ``queries`` sample rows are
    searched as queries (each left out of its own results) with the default ``ef``; for each wave
    boundary the margin under which that rule stops there and its recall@k then (against the
    exact top-k over all other rows, by a blocked scan) are known, so recall and rows recomputed
    follow for every margin of a grid at once. The table simulates the searcher's whole rule,
    floor included: a table of the margin alone promised recall for depths the floor never lets
    a query stop at (100k synthetic: a 0.96 target read 0.986). Returns (margin, recall@k,
    median rows recomputed) rows, margins increasing; the recall is the sample mean less one
    standard error, so a target read from the table is met with some room."""
    from slimrag.config import SearchConfig
    from slimrag.index.store.slim.searcher import SlimSearcher, wave_ends

    n = len(x)
    reader = RowReader(x)
    rng = np.random.default_rng(seed + 7)
    qs = np.sort(rng.choice(n, min(queries, n), replace=False))
    k = min(k, n - 1)
    if k < 1:
        return ()
    xq = reader.take(qs)
    best_ids, _ = exact_top(reader, xq, qs, k)
    cfg = SearchConfig()
    floor = max(cfg.rerank, k)
    searcher = SlimSearcher(art, reader.take, SlimConfig(cache_bytes=0), cfg)
    skip = np.zeros(n, dtype=bool)
    pools = []
    for i, r in enumerate(qs.tolist()):  # each query skips only itself: as a new row would search
        skip[r] = True
        pools.append(searcher.walk(xq[i : i + 1], cfg.ef, skip)[0][0])
        skip[r] = False
    grid = np.linspace(0.0, max(0.3, 2.0 * art.pq_error), _STOP_GRID)
    recall = np.zeros((len(qs), len(grid)))
    rows_at = np.zeros((len(qs), len(grid)))
    for i, (rows, pq_scores) in enumerate(pools):
        exact = reader.take(rows) @ xq[i]
        truth = set(best_ids[i].tolist())
        bounds = wave_ends(len(rows), k, floor, cfg.wave)
        need, rec = [], []
        for pos in bounds:
            top = np.argsort(-exact[:pos], kind="stable")[:k]
            rec.append(len(truth & set(rows[top].tolist())) / k)
            kth = np.sort(exact[:pos])[::-1][k - 1] if pos >= k else np.inf
            # stopping at `pos` needs pq[pos] + bound < kth; the end of the pool always stops
            need.append(kth - pq_scores[pos] if pos < len(rows) else np.inf)
        need_a, rec_a, pos_a = np.array(need), np.array(rec), np.array(bounds)
        # below the floor the bound is pq_error whatever the margin, past it the margin
        below = pos_a < floor
        stops = np.where(below[None, :], need_a[None, :] > art.pq_error, need_a[None, :] > grid[:, None])
        stop = np.argmax(stops, axis=1)  # first boundary that stops (the last one always does)
        recall[i], rows_at[i] = rec_a[stop], pos_a[stop]
    reader.done()
    # One standard error below the mean: the calibration queries are a sample, and a target met
    # only on average would be missed by about half of the calibrations.
    low = recall.mean(axis=0) - recall.std(axis=0) / np.sqrt(len(qs))
    mean_recall = np.maximum.accumulate(low)
    return tuple((float(m), float(r), float(c)) for m, r, c in zip(grid, mean_recall, np.median(rows_at, axis=0),
                                                                      strict=True))
