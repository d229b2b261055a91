"""The graph build's prune passes: robust prune, the forward pass over candidate pools, the
reverse-edge merge (Vamana's second pass); what ``graph.build_graph`` runs between the candidate
pool and the connectivity repair (the algorithm and knobs are in ``graph.py``'s header).

Memory: every pass works on a batch of ``_PRUNE_BATCH`` nodes or a block of ``_MERGE_BLOCK``
nodes, reading vectors through `rows.RowReader` (a memory-mapped matrix is never copied whole);
edges are int32/float32 arrays, 12 bytes an edge, kept grouped by node in the order the nodes
were visited (never sorted as a whole: each node's span is found by counting).

Reads: a node's candidates come from its two partitions, so the passes visit nodes by partition
pair (`partition_order`) and read the union of ``_SET_NODES`` nodes' candidate rows once into
memory (`rows.RowSet`, when the matrix is a mapping larger than the RowReader's budget). Gathered
straight from the mapping, each batch's ~37,000 rows spread over the whole file, and keeping the
mapped pages bounded would re-fault most of the file every batch. Measured at 1M stand-in rows
(`bench.scale`, load 0.7-1.2): peak RSS 1,640 MiB against 2,694 before, build CPU 770 s against
775, identical recall (the edges are the same, `tests/test_slim_scale.py`).

Thread-safety: pure functions of their inputs; BLAS is limited to one thread around the many
small products (``_threads.py``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from slimrag.index.store.slim._threads import single_thread_blas
from slimrag.index.store.slim.knn import top_k_columns
from slimrag.index.store.slim.rows import RowReader, rows_of

if TYPE_CHECKING:
    from slimrag.index.store.slim.config import GraphConfig

_PRUNE_BATCH = 512
_SET_NODES = 8192  # nodes whose candidate rows are read together (`rows.RowSet`)
_MERGE_BLOCK = 65536  # nodes per block of the reverse-edge merge
_MAX_PIVOTS = 2048  # long-range pivots: 2 sqrt(n) up to 1M rows, this many beyond
_NEAR = 8  # closest candidates kept per node for the connectivity repair


def robust_prune(
    vectors: np.ndarray, cand: np.ndarray, cand_sims: np.ndarray, limits: np.ndarray, alpha: float | np.ndarray,
    gathered: np.ndarray | None = None,
) -> np.ndarray:
    """Vamana's RobustPrune, vectorised over rows: which candidates each node keeps.

    cand: (b, c) candidate ids sorted closest first, ``-1`` for padding; cand_sims: their inner
    products with the node; limits: (b,) max kept per node; gathered: the candidates' vectors
    (b, c, d) when the caller has them already (else read from ``vectors``). Returns a (b, c)
    bool mask.
    """
    b, c = cand.shape
    valid = cand >= 0
    g = vectors[np.where(valid, cand, 0)] if gathered is None else gathered
    # Sims among candidates. A loop of 2-D products: numpy's stacked matmul does not use BLAS
    # and is ~30x slower here.
    pair = np.empty((b, c, c), dtype=np.float32)
    for i in range(b):
        np.matmul(g[i], g[i].T, out=pair[i])
    alive = valid.copy()
    kept = np.zeros((b, c), dtype=bool)
    count = np.zeros(b, dtype=np.int64)
    a2 = np.broadcast_to(np.asarray(alpha, dtype=np.float32) ** 2, (b,))
    far_p = 1.0 - cand_sims  # d^2(p, c) / 2
    for t in range(c):
        sel = alive[:, t] & (count < limits)
        if not sel.any():
            continue
        kept[sel, t] = True
        count += sel
        rows = np.flatnonzero(sel)
        # Drop c when alpha * d(s, c) <= d(p, c), i.e. alpha^2 (1 - s·c) <= 1 - p·c.
        covered = a2[rows, None] * (1.0 - pair[rows, t, :]) <= far_p[rows]
        alive[rows] &= ~covered
        alive[:, t] = False
    return kept


class PhaseClock:
    """Writes each phase's wall seconds (``NAME_s``) and this process's CPU seconds, all threads
    (``NAME_cpu_s``), into a stats dict: on a shared machine the CPU time is the steadier figure."""

    def __init__(self, stats: dict) -> None:
        self.stats = stats
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def lap(self, name: str) -> None:
        """Record the time since the last lap as phase ``name``."""
        wall, cpu = time.perf_counter(), time.process_time()
        self.stats[f"{name}_s"] = wall - self.wall
        self.stats[f"{name}_cpu_s"] = cpu - self.cpu
        self.wall, self.cpu = wall, cpu


def pivots_of(n: int, config: GraphConfig) -> np.ndarray:
    """The seeded sample whose nearest members give each node its long-range candidates: ~2
    sqrt(n) nodes, at most ``_MAX_PIVOTS`` (their scores cost ``n * pivots * d`` flops)."""
    extra = min(config.long_range, n - 1)
    if extra <= 0:
        return np.zeros(0, dtype=np.int64)
    rng = np.random.default_rng(config.seed)
    count = min(n, max(extra + 1, min(_MAX_PIVOTS, int(2 * np.sqrt(n)))))
    return np.sort(rng.choice(n, count, replace=False)).astype(np.int64)


def forward_prune(
    x: np.ndarray, pool: np.ndarray, limits: np.ndarray, config: GraphConfig, order: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Robust-prune every node's candidates, ``_PRUNE_BATCH`` nodes at a time: the pool's ids
    (deduplicated, scored exactly, closest ``candidates`` kept) plus the node's ``long_range``
    nearest pivots. ``order`` (optional): the order to visit nodes in, so that consecutive nodes
    share candidates (`partition_order`); their union is read once per ``_SET_NODES`` nodes
    (`rows.rows_of`). Returns the kept edges (src, dst int32, sim float32; grouped by src, the
    nodes in ``order``, each node's closest first) and each node's ``_NEAR`` closest candidates
    (n, _NEAR) int32, for connectivity repair."""
    n = len(x)
    reader = RowReader(x)
    pivots = pivots_of(n, config)
    pivot_vecs = reader.take(pivots)
    extra = min(config.long_range, max(len(pivots) - 1, 0))
    near = np.full((n, _NEAR), -1, dtype=np.int32)
    out_s, out_d, out_v = [], [], []
    with single_thread_blas():
        for lo in range(0, n, _SET_NODES):
            nodes = order[lo : lo + _SET_NODES] if order is not None else np.arange(lo, min(n, lo + _SET_NODES))
            rows = rows_of(reader, np.concatenate([nodes, pool[nodes].reshape(-1)]))
            for start in range(0, len(nodes), _PRUNE_BATCH):
                own = nodes[start : start + _PRUNE_BATCH]
                cand = np.sort(pool[own].astype(np.int64), axis=1)
                dup = np.zeros(cand.shape, dtype=bool)
                dup[:, 1:] = cand[:, 1:] == cand[:, :-1]
                cand[dup | (cand == own[:, None])] = -1
                xb = rows.take(own)
                g = rows.take(np.maximum(cand, 0))  # (b, w, d)
                sims = np.einsum("bwd,bd->bw", g, xb)
                sims[cand < 0] = -np.inf
                if extra:
                    ps = xb @ pivot_vecs.T
                    ps[pivots[None, :] == own[:, None]] = -np.inf  # a pivot is not its own long-range neighbour
                    top = top_k_columns(ps, extra)
                    e_ids = pivots[top]
                    e_sims = np.take_along_axis(ps, top, axis=1)
                    clash = (e_ids[:, :, None] == cand[:, None, :]).any(axis=2) | ~np.isfinite(e_sims)
                    e_ids[clash] = -1
                    e_sims[clash] = -np.inf
                    cand = np.concatenate([cand, e_ids], axis=1)
                    sims = np.concatenate([sims, e_sims], axis=1)
                    g = np.concatenate([g, pivot_vecs[top]], axis=1)
                width = min(cand.shape[1], config.candidates + extra)
                by_sim = np.argsort(-sims, axis=1, kind="stable")[:, :width]
                cand = np.take_along_axis(cand, by_sim, axis=1)
                sims = np.take_along_axis(sims, by_sim, axis=1)
                # Row gather on the flattened (b * w, d) matrix: a memcpy per row, ~10x faster than
                # take_along_axis with a broadcast (b, width, 1) index.
                flat = (by_sim + np.arange(len(by_sim))[:, None] * g.shape[1]).reshape(-1)
                g = np.take(g.reshape(-1, g.shape[2]), flat, axis=0).reshape(len(by_sim), width, g.shape[2])
                cand[~np.isfinite(sims)] = -1
                near[own, : min(_NEAR, width)] = cand[:, :_NEAR]
                kept = robust_prune(x, cand, sims, limits[own], config.alpha, gathered=g)
                r, c = np.nonzero(kept)
                out_s.append(own[r].astype(np.int32))
                out_d.append(cand[r, c].astype(np.int32))
                out_v.append(sims[r, c].astype(np.float32))
            del rows
    reader.done()
    return _joined(out_s), _joined(out_d), _joined(out_v), near


def partition_order(parts: list[np.ndarray], n: int) -> np.ndarray | None:
    """Nodes ordered by the pair of partitions they belong to (first, then second), None for one
    partition. A node's candidates come from its partitions, so nodes of one pair share most of
    them: the union of a few thousand consecutive nodes' candidates is a neighbourhood of the
    data, where in row order it is spread over all of it."""
    if len(parts) < 2:
        return None
    first = np.full(n, -1, dtype=np.int32)
    second = np.full(n, -1, dtype=np.int32)
    for p, rows in enumerate(parts):
        fresh = first[rows] < 0
        first[rows[fresh]] = p
        second[rows[~fresh]] = p
    return np.lexsort((second, first))


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    """``np.concatenate(parts)``, emptying ``parts`` (so its pieces are freed as soon as the
    caller's last reference goes: the edge lists are the build's largest arrays)."""
    out = np.concatenate(parts)
    parts.clear()
    return out


def _node_spans(src: np.ndarray, n: int, order: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Where each node's edges lie in ``src``, edges grouped by node with the nodes in ``order``
    (row order when None): (start, end) int64 of length n, by counting, without sorting."""
    counts = np.bincount(src, minlength=n).astype(np.int64)
    visit = np.arange(n) if order is None else order
    start = np.empty(n, dtype=np.int64)
    start[visit] = np.cumsum(counts[visit]) - counts[visit]
    return start, start + counts


def merge_reverse(
    x: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
    sim: np.ndarray,
    limits: np.ndarray,
    config: GraphConfig,
    order: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Add every kept edge's reverse and robust-prune the nodes then over budget (Vamana's second
    pass). ``src`` must be grouped by node, the nodes in ``order`` (as `forward_prune` returns
    it). Works in blocks of ``_MERGE_BLOCK`` nodes, visited in ``order`` (optional,
    `partition_order`) so that a block's over-budget candidates are read as one neighbourhood
    (`rows.rows_of`); its temporaries are a block's edges, not all of them. Returns the merged
    edges (int32, float32) grouped by src the same way, each node's closest first."""
    n = x.shape[0]
    rev = np.argsort(dst, kind="stable")
    r_src, r_dst, r_sim = dst[rev], src[rev], sim[rev]
    del rev
    f_lo, f_hi = _node_spans(src, n, order)
    r_lo, r_hi = _node_spans(r_src, n, None)
    reader = RowReader(x)
    out_s, out_d, out_v = [], [], []
    for a in range(0, n, _MERGE_BLOCK):
        nodes = order[a : a + _MERGE_BLOCK] if order is not None else np.arange(a, min(n, a + _MERGE_BLOCK))
        f_idx, f_loc = spans(f_lo[nodes], f_hi[nodes])
        r_idx, r_loc = spans(r_lo[nodes], r_hi[nodes])
        loc = np.concatenate([f_loc, r_loc])  # each edge's node, as its position in `nodes`
        d_all = np.concatenate([dst[f_idx], r_dst[r_idx]]).astype(np.int64)
        v_all = np.concatenate([sim[f_idx], r_sim[r_idx]])
        _, first = np.unique(loc * n + d_all, return_index=True)
        loc, d_all, v_all = loc[first], d_all[first], v_all[first]
        by = np.lexsort((-v_all, loc))
        loc, d_all, v_all = loc[by], d_all[by], v_all[by]
        counts = np.bincount(loc, minlength=len(nodes))
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        rank = np.arange(len(loc)) - starts[loc]
        over = counts > limits[nodes]
        keep = ~over[loc]
        rows = np.flatnonzero(over)
        if len(rows):
            # Nodes over budget: robust-prune their merged lists (capped at `candidates`, closest first).
            width = config.candidates
            sel = over[loc] & (rank < width)
            pos = np.full(len(nodes), -1, dtype=np.int64)
            pos[rows] = np.arange(len(rows))
            cand = np.full((len(rows), width), -1, dtype=np.int64)
            csim = np.full((len(rows), width), -np.inf, dtype=np.float32)
            cand[pos[loc[sel]], rank[sel]] = d_all[sel]
            csim[pos[loc[sel]], rank[sel]] = v_all[sel]
            kept = np.zeros(cand.shape, dtype=bool)
            with single_thread_blas():
                for lo in range(0, len(rows), _SET_NODES):
                    part = slice(lo, lo + _SET_NODES)
                    near = rows_of(reader, cand[part])
                    for start in range(lo, min(len(rows), lo + _SET_NODES), _PRUNE_BATCH):
                        sl = slice(start, min(start + _PRUNE_BATCH, lo + _SET_NODES))
                        g = near.take(np.maximum(cand[sl], 0))
                        kept[sl] = robust_prune(x, cand[sl], csim[sl], limits[nodes[rows[sl]]], config.alpha,
                                                gathered=g)
                    del near
            r_i, c_i = np.nonzero(kept)
            loc = np.concatenate([loc[keep], rows[r_i]])
            d_all = np.concatenate([d_all[keep], cand[r_i, c_i]])
            v_all = np.concatenate([v_all[keep], csim[r_i, c_i]])
            by = np.lexsort((-v_all, loc))
            loc, d_all, v_all = loc[by], d_all[by], v_all[by]
        out_s.append(nodes[loc].astype(np.int32))
        out_d.append(d_all.astype(np.int32))
        out_v.append(v_all)
    reader.done()
    del r_src, r_dst, r_sim, f_lo, f_hi, r_lo, r_hi
    return _joined(out_s), _joined(out_d), _joined(out_v)


def spans(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated ranges ``lo[i]:hi[i]`` as indices, with the ``i`` each index came from."""
    lens = hi - lo
    owner = np.repeat(np.arange(len(lo)), lens)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    return lo[owner] + np.arange(int(lens.sum())) - starts[owner], owner
