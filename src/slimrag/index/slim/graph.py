"""Proximity graph for the slim index: exact kNN, robust prune, high-degree-preserving degrees, CSR.

Algorithm
---------
1. **Candidate pool** (``pool.py``). Up to ``exact_below`` rows, every vector's ``candidates``
   exact nearest neighbours by inner product (cosine: vectors are unit-norm), in row blocks
   (``knn.py``); beyond, the level-0 neighbour lists of faiss HNSWs built over k-means partitions
   (each row in its 2 nearest), never all-pairs k-NN. The pool is scored exactly and sorted per
   batch of nodes; it also gets the node's ``long_range`` nearest *pivots* (a seeded random sample
   of ~2 sqrt(n) nodes, at most 2,048, scored per batch: never an n x pivots matrix), so the
   prune can keep a few edges that leave the local cluster.
2. **Degree budget (high-degree preserving, after LEANN).** In-degree in the kNN pool marks hub
   nodes: the ``hub_fraction`` most-referenced nodes may keep ``max_degree`` out-edges, all others
   ``base_degree``. Search passes through hubs, so their long lists buy recall; the many ordinary
   nodes keep few edges, which is where the bytes go.
3. **Robust prune (DiskANN/Vamana's RobustPrune).** Candidates are taken closest first; a candidate
   ``c`` is dropped when an already-kept neighbour ``s`` covers it: ``alpha * d(s, c) <= d(p, c)``
   with Euclidean ``d`` (for unit vectors ``d^2 = 2 - 2 cos``). Edges then point in different
   directions instead of being ``k`` near-duplicates. Vectorised over batches of nodes.
4. **Reverse edges.** Each kept edge ``p -> c`` proposes ``c -> p``; a node whose merged list
   exceeds its budget is robust-pruned again (Vamana's second pass). Done in blocks of 65,536
   nodes over int32 edge arrays, so the temporaries are a block's edges.
5. **Strong connectivity.** A breadth-first pass from the most-referenced node finds unreachable
   nodes; each gets an edge from its nearest reachable kNN neighbour, repeated until all are
   reached; the same on the reversed graph makes every node reach that root back. So search may
   start from any node. These few extra edges may exceed a node's budget by one or two.
6. **CSR.** ``indptr`` (uint32) and ``indices`` in the smallest unsigned type that holds a row id:
   uint16 up to 65,536 rows (2 bytes per edge), uint32 beyond (4 bytes per edge).

Measured (6,000 real MiniLM passage vectors, PQ m=64, ef=128, rerank 24; recall@10 vs brute force):
alpha=1.0 gives 10.3 edges per node and recall 0.971; alpha=1.2 keeps 12.9 edges and gets *less*
(0.935): in 384 dimensions the strict rule's more diverse edges navigate better than extra near
ones. Hub budgets (base 8, hubs 32) beat a uniform cap of 8 (0.973 vs 0.964 at R=32) for +0.6
edges per node. With alpha=1.0 the prune usually ends below ``base_degree``, so the cap mostly
bounds the tail.

Knobs (``GraphConfig``)
-----------------------
- ``base_degree`` (default 12): out-degree cap of ordinary nodes, ~2 bytes per edge below 65k
  rows. 8 saves ~5 bytes per vector and costs ~1 point of recall@10; 16-24 add little.
- ``max_degree`` (default 32): cap for hub nodes. Few nodes, so raising it is cheap.
- ``hub_fraction`` (default 0.05): share of nodes that get ``max_degree`` (LEANN uses ~2%).
- ``candidates`` (default 48): pool size: the exact kNN's k, and the closest pool members
  (plus pivots) the forward prune scores past the exact size. Larger lets the prune pick from farther
  nodes; costs build time (top-k selection, prune) but no bytes. Must be >= ``max_degree``.
- ``alpha`` (default 1.0): prune slack. 1.0 is the relative-neighbourhood rule (fewest edges);
  Vamana's 1.2 keeps more, longer edges; worse per byte on text embeddings (see above).
- ``long_range`` (default 8): nearest pivots added to each pool. On clustered data it lets the walk
  leave a wrong cluster (recall 0.70 -> 0.79 with 16 entry points on the synthetic set); no cost
  on disk beyond the edges the prune keeps.
- ``block`` (default 0 = auto, ~128 MB of float32 scores per block): rows per exact-kNN block
  (``knn.py``).
- ``pool``, ``exact_below``, ``hnsw_m``, ``hnsw_ef``, ``partition_rows``, ``overlap``: where the
  candidates come from (``pool.py``, which gives each knob's trade-off).
- Memory rule (``rows.py`` keeps a memory-mapped input's touched pages under 256 MB): the pool
  (``n * 2 * 2 hnsw_m * 4`` bytes past one partition: 256 MB at 1M rows), the kept edges
  (~``n * 13 * 12`` bytes), one partition's HNSW (~1.7 KB per row at d=384) and per-batch
  temporaries; no term grows faster than n. Before the HNSW pools the exact kNN and an
  ``n x 2 sqrt(n)`` pivot matrix made the build O(n^2) in time and O(n^1.5) in memory.
- ``seed`` (default 0): pivot sample and partitions; deterministic for the same input with an
  exact pool (HNSW pools vary slightly with faiss's threads).

Thread-safety: building uses numpy (BLAS may use several cores for the kNN blocks); a built or
loaded ``Graph`` is read-only and safe to share between threads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slimrag.index.slim._threads import single_thread_blas
from slimrag.index.slim.knn import top_k_columns
from slimrag.index.slim.pool import candidate_pool
from slimrag.index.slim.rows import Reader

INDPTR_FILE = "graph_indptr.npy"
INDICES_FILE = "graph_indices.npy"
_PRUNE_BATCH = 512
_MERGE_BLOCK = 65536  # nodes per block of the reverse-edge merge
_MAX_PIVOTS = 2048  # long-range pivots: 2 sqrt(n) up to 1M rows, this many beyond
_NEAR = 8  # closest candidates kept per node for the connectivity repair
POOLS = ("auto", "exact", "hnsw", "hnsw-knn")


@dataclass(frozen=True, slots=True)
class GraphConfig:
    """Graph construction settings; see the module header for each knob's trade-off."""

    base_degree: int = 12
    max_degree: int = 32
    hub_fraction: float = 0.05
    candidates: int = 48
    alpha: float = 1.0
    long_range: int = 8
    block: int = 0
    seed: int = 0
    pool: str = "auto"
    exact_below: int = 50_000
    hnsw_m: int = 16
    hnsw_ef: int = 64
    partition_rows: int = 250_000
    overlap: int = 2

    def __post_init__(self) -> None:
        if not 1 <= self.base_degree <= self.max_degree:
            raise ValueError(
                f"need 1 <= base_degree <= max_degree, got base_degree={self.base_degree}, "
                f"max_degree={self.max_degree}"
            )
        if self.max_degree > 1024:
            raise ValueError(f"max_degree above 1024 is never useful, got {self.max_degree}")
        if self.candidates < self.max_degree:
            raise ValueError(f"candidates ({self.candidates}) must be >= max_degree ({self.max_degree})")
        if not 0.0 <= self.hub_fraction <= 1.0:
            raise ValueError(f"hub_fraction must be in [0, 1], got {self.hub_fraction}")
        if self.alpha < 1.0:
            raise ValueError(f"alpha must be >= 1.0, got {self.alpha}")
        if self.long_range < 0:
            raise ValueError(f"long_range must be >= 0, got {self.long_range}")
        if self.block < 0:
            raise ValueError(f"block must be >= 0 (0 = automatic), got {self.block}")
        if self.pool not in POOLS:
            raise ValueError(f"pool must be one of {POOLS}, got {self.pool!r}")
        if self.exact_below < 0 or self.hnsw_m < 2 or self.hnsw_ef < 1:
            raise ValueError(
                f"need exact_below >= 0, hnsw_m >= 2, hnsw_ef >= 1, got {self.exact_below}, {self.hnsw_m}, {self.hnsw_ef}"
            )
        if self.partition_rows < 1000 or self.overlap < 1:
            raise ValueError(f"need partition_rows >= 1000 and overlap >= 1, got {self.partition_rows}, {self.overlap}")


@dataclass(frozen=True, slots=True)
class Graph:
    """A directed graph over rows ``0..n-1`` in CSR form: the out-neighbours of row ``i`` are
    ``indices[indptr[i]:indptr[i+1]]``, closest first. Read-only once built."""

    indptr: np.ndarray
    indices: np.ndarray

    @property
    def n(self) -> int:
        """Number of nodes (rows)."""
        return int(len(self.indptr) - 1)

    @property
    def n_edges(self) -> int:
        """Number of directed edges."""
        return int(self.indptr[-1])

    def neighbors(self, row: int) -> np.ndarray:
        """Out-neighbours of ``row`` (a view into ``indices``)."""
        return self.indices[self.indptr[row] : self.indptr[row + 1]]

    def degrees(self) -> np.ndarray:
        """Out-degree of every node, int64."""
        return np.diff(np.asarray(self.indptr, dtype=np.int64))

    def in_degrees(self) -> np.ndarray:
        """In-degree of every node, int64."""
        return np.bincount(np.asarray(self.indices, dtype=np.int64), minlength=self.n)

    @property
    def nbytes(self) -> int:
        """Bytes of the two CSR arrays (what :meth:`save` writes, minus .npy headers)."""
        return int(self.indptr.nbytes + self.indices.nbytes)

    def save(self, folder: str | Path) -> None:
        """Write ``graph_indptr.npy`` and ``graph_indices.npy`` into an existing ``folder``."""
        folder = Path(folder)
        np.save(folder / INDPTR_FILE, self.indptr)
        np.save(folder / INDICES_FILE, self.indices)

    @classmethod
    def load(cls, folder: str | Path, mmap: bool = True) -> Graph:
        """Read a graph written by :meth:`save`; both arrays are memory-mapped by default."""
        folder = Path(folder)
        indptr = np.load(folder / INDPTR_FILE, mmap_mode="r" if mmap else None)
        indices = np.load(folder / INDICES_FILE, mmap_mode="r" if mmap else None)
        return cls(indptr, indices)


def index_dtype(n: int) -> np.dtype:
    """Smallest unsigned integer dtype that can hold row ids ``0..n-1``."""
    if n <= 2**8:
        return np.dtype(np.uint8)
    if n <= 2**16:
        return np.dtype(np.uint16)
    if n <= 2**32:
        return np.dtype(np.uint32)
    return np.dtype(np.uint64)


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


def build_graph(vectors: np.ndarray, config: GraphConfig | None = None, stats: dict | None = None) -> Graph:
    """Build the pruned proximity graph of unit-norm ``vectors`` (n, d) float32, in memory or an
    ``np.memmap`` (read in blocks, `rows.Reader`; never copied whole).

    The result is strongly connected, so best-first search can start from any node. Deterministic
    for the same input and config with an exact pool; HNSW pools vary slightly with faiss's
    threads (``pool.py``). ``stats`` (optional) receives seconds per phase and the pool's shape.
    """
    config = config or GraphConfig()
    x = vectors if isinstance(vectors, np.ndarray) and vectors.dtype == np.float32 else np.asarray(vectors, np.float32)
    if x.ndim != 2:
        raise ValueError(f"expected a (n, d) matrix, got shape {x.shape}")
    n = x.shape[0]
    if n == 0:
        return Graph(np.zeros(1, np.uint32), np.zeros(0, index_dtype(1)))
    stats = {} if stats is None else stats
    clock = PhaseClock(stats)
    pool = candidate_pool(x, config, stats)
    clock.lap("pool")
    indeg = np.zeros(n, dtype=np.int64)
    for start in range(0, n, 65536):
        part = pool[start : start + 65536]
        indeg += np.bincount(part[part >= 0], minlength=n)
    n_hubs = int(round(config.hub_fraction * n))
    limits = np.full(n, config.base_degree, dtype=np.int64)
    if n_hubs:
        limits[np.argsort(-indeg, kind="stable")[:n_hubs]] = config.max_degree
    root = int(np.argmax(indeg))
    del indeg
    src, dst, sim, near = _forward_prune(x, pool, limits, config)
    del pool
    clock.lap("prune")
    src, dst, sim = _merge_reverse(x, src, dst, sim, limits, config)
    del sim
    clock.lap("reverse")
    src, dst = _make_strongly_connected(n, src, dst, near, root)
    graph = _to_csr(n, src, dst)
    clock.lap("connect")
    return graph


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


def _pivots(n: int, config: GraphConfig) -> np.ndarray:
    """The seeded sample whose nearest members give each node its long-range candidates: ~2
    sqrt(n) nodes, at most ``_MAX_PIVOTS`` (their scores cost ``n * pivots * d`` flops)."""
    extra = min(config.long_range, n - 1)
    if extra <= 0:
        return np.zeros(0, dtype=np.int64)
    rng = np.random.default_rng(config.seed)
    count = min(n, max(extra + 1, min(_MAX_PIVOTS, int(2 * np.sqrt(n)))))
    return np.sort(rng.choice(n, count, replace=False)).astype(np.int64)


def _forward_prune(
    x: np.ndarray, pool: np.ndarray, limits: np.ndarray, config: GraphConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Robust-prune every node's candidates, ``_PRUNE_BATCH`` nodes at a time: the pool's ids
    (deduplicated, scored exactly, closest ``candidates`` kept) plus the node's ``long_range``
    nearest pivots. Returns the kept edges (src, dst int32, sim float32; grouped by src, closest
    first) and each node's ``_NEAR`` closest candidates (n, _NEAR) int32, for connectivity repair."""
    n = len(x)
    reader = Reader(x)
    pivots = _pivots(n, config)
    pivot_vecs = reader.take(pivots)
    extra = min(config.long_range, max(len(pivots) - 1, 0))
    near = np.full((n, _NEAR), -1, dtype=np.int32)
    out_s, out_d, out_v = [], [], []
    with single_thread_blas():
        for start in range(0, n, _PRUNE_BATCH):
            stop = min(n, start + _PRUNE_BATCH)
            own = np.arange(start, stop)
            cand = np.sort(pool[start:stop].astype(np.int64), axis=1)
            dup = np.zeros(cand.shape, dtype=bool)
            dup[:, 1:] = cand[:, 1:] == cand[:, :-1]
            cand[dup | (cand == own[:, None])] = -1
            xb = reader.block(start, stop)
            g = reader.take(np.maximum(cand, 0))  # (b, w, d)
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
            order = np.argsort(-sims, axis=1, kind="stable")[:, :width]
            cand = np.take_along_axis(cand, order, axis=1)
            sims = np.take_along_axis(sims, order, axis=1)
            # Row gather on the flattened (b * w, d) matrix: a memcpy per row, ~10x faster than
            # take_along_axis with a broadcast (b, width, 1) index.
            flat = (order + np.arange(len(order))[:, None] * g.shape[1]).reshape(-1)
            g = np.take(g.reshape(-1, g.shape[2]), flat, axis=0).reshape(len(order), width, g.shape[2])
            cand[~np.isfinite(sims)] = -1
            near[start:stop, : min(_NEAR, width)] = cand[:, :_NEAR]
            kept = robust_prune(x, cand, sims, limits[start:stop], config.alpha, gathered=g)
            r, c = np.nonzero(kept)
            out_s.append((start + r).astype(np.int32))
            out_d.append(cand[r, c].astype(np.int32))
            out_v.append(sims[r, c].astype(np.float32))
    reader.done()
    return np.concatenate(out_s), np.concatenate(out_d), np.concatenate(out_v), near


def pick_hubs(graph: Graph, count: int) -> np.ndarray:
    """The ``count`` rows of highest in-degree (ties by row id), as int64: the best-connected
    nodes, used as search entry points and kept as fp16 vectors."""
    count = max(0, min(int(count), graph.n))
    return np.sort(np.argsort(-graph.in_degrees(), kind="stable")[:count]).astype(np.int64)


def _merge_reverse(
    x: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
    sim: np.ndarray,
    limits: np.ndarray,
    config: GraphConfig,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Add every kept edge's reverse and robust-prune the nodes then over budget (Vamana's second
    pass). ``src`` must be grouped by node (as `_forward_prune` returns it). Works in blocks of
    ``_MERGE_BLOCK`` nodes, so its temporaries are a block's edges, not all of them; returns the
    merged edges (int32, float32) grouped by src, closest first."""
    n = x.shape[0]
    rev = np.argsort(dst, kind="stable")
    r_src, r_dst, r_sim = dst[rev], src[rev], sim[rev]
    del rev
    f_ptr = np.searchsorted(src, np.arange(0, n + _MERGE_BLOCK, _MERGE_BLOCK).clip(max=n))
    r_ptr = np.searchsorted(r_src, np.arange(0, n + _MERGE_BLOCK, _MERGE_BLOCK).clip(max=n))
    reader = Reader(x)
    out_s, out_d, out_v = [], [], []
    for b, a in enumerate(range(0, n, _MERGE_BLOCK)):
        fs, fe, rs, re_ = f_ptr[b], f_ptr[b + 1], r_ptr[b], r_ptr[b + 1]
        s_all = np.concatenate([src[fs:fe], r_src[rs:re_]]).astype(np.int64)
        d_all = np.concatenate([dst[fs:fe], r_dst[rs:re_]]).astype(np.int64)
        v_all = np.concatenate([sim[fs:fe], r_sim[rs:re_]])
        _, first = np.unique((s_all - a) * n + d_all, return_index=True)
        s_all, d_all, v_all = s_all[first], d_all[first], v_all[first]
        order = np.lexsort((-v_all, s_all))
        s_all, d_all, v_all = s_all[order], d_all[order], v_all[order]
        width_nodes = min(_MERGE_BLOCK, n - a)
        counts = np.bincount(s_all - a, minlength=width_nodes)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        rank = np.arange(len(s_all)) - starts[s_all - a]
        over = counts > limits[a : a + width_nodes]
        keep = ~over[s_all - a]
        rows = np.flatnonzero(over)
        if len(rows):
            # Nodes over budget: robust-prune their merged lists (capped at `candidates`, closest first).
            width = config.candidates
            sel = over[s_all - a] & (rank < width)
            pos = np.full(width_nodes, -1, dtype=np.int64)
            pos[rows] = np.arange(len(rows))
            cand = np.full((len(rows), width), -1, dtype=np.int64)
            csim = np.full((len(rows), width), -np.inf, dtype=np.float32)
            cand[pos[s_all[sel] - a], rank[sel]] = d_all[sel]
            csim[pos[s_all[sel] - a], rank[sel]] = v_all[sel]
            kept = np.zeros(cand.shape, dtype=bool)
            with single_thread_blas():
                for start in range(0, len(rows), _PRUNE_BATCH):
                    sl = slice(start, start + _PRUNE_BATCH)
                    g = reader.take(np.maximum(cand[sl], 0))
                    kept[sl] = robust_prune(x, cand[sl], csim[sl], limits[a + rows[sl]], config.alpha, gathered=g)
            r_idx, c_idx = np.nonzero(kept)
            s_all = np.concatenate([s_all[keep], a + rows[r_idx]])
            d_all = np.concatenate([d_all[keep], cand[r_idx, c_idx]])
            v_all = np.concatenate([v_all[keep], csim[r_idx, c_idx]])
            order = np.lexsort((-v_all, s_all))
            s_all, d_all, v_all = s_all[order], d_all[order], v_all[order]
        out_s.append(s_all.astype(np.int32))
        out_d.append(d_all.astype(np.int32))
        out_v.append(v_all)
    reader.done()
    return np.concatenate(out_s), np.concatenate(out_d), np.concatenate(out_v)


def _reached_from(n: int, src: np.ndarray, dst: np.ndarray, seeds: np.ndarray, reached: np.ndarray) -> None:
    """Breadth-first search over edge arrays ``src -> dst``, marking ``reached`` in place."""
    order = np.argsort(src, kind="stable")
    dst = dst[order]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(src, minlength=n))])
    frontier = np.unique(seeds[~reached[seeds]])
    reached[frontier] = True
    while len(frontier):
        lo, hi = indptr[frontier], indptr[frontier + 1]
        lens = hi - lo
        total = int(lens.sum())
        if total == 0:
            break
        offs = np.repeat(lo - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens) + np.arange(total)
        nxt = np.unique(dst[offs])
        frontier = nxt[~reached[nxt]]
        reached[frontier] = True


def _link_unreached(
    n: int, src: np.ndarray, dst: np.ndarray, knn: np.ndarray, root: int
) -> tuple[np.ndarray, np.ndarray]:
    """Add edges ``parent -> lost`` until every node is reachable from ``root``; the parent is the
    lost node's nearest kNN neighbour that is already reachable (or ``root`` for an island)."""
    reached = np.zeros(n, dtype=bool)
    _reached_from(n, src, dst, np.array([root]), reached)
    while not reached.all():
        lost = np.flatnonzero(~reached)
        if knn.shape[1]:
            near = knn[lost]
            ok = (near >= 0) & reached[np.maximum(near, 0)]  # -1 pads a short candidate list
        else:
            ok = np.zeros((len(lost), 1), dtype=bool)
        has = ok.any(axis=1)
        if has.any():
            targets = lost[has]
            parents = knn[targets, np.argmax(ok[has], axis=1)].astype(np.int64)
        else:
            targets = lost[:1]
            parents = np.array([root], dtype=np.int64)
        src = np.concatenate([src, parents.astype(src.dtype)])
        dst = np.concatenate([dst, targets.astype(dst.dtype)])
        _reached_from(n, src, dst, targets, reached)
    return src, dst


def _make_strongly_connected(
    n: int, src: np.ndarray, dst: np.ndarray, knn: np.ndarray, root: int
) -> tuple[np.ndarray, np.ndarray]:
    """Every node reachable from ``root`` and ``root`` reachable from every node, so search may
    start from any node (any hub) and still reach the whole graph."""
    src, dst = _link_unreached(n, src, dst, knn, root)
    # Same on the reversed graph: an added reversed edge parent -> lost is lost -> parent here.
    dst, src = _link_unreached(n, dst, src, knn, root)
    return src, dst


def _to_csr(n: int, src: np.ndarray, dst: np.ndarray) -> Graph:
    counts = np.bincount(src, minlength=n)
    indptr = np.concatenate([[0], np.cumsum(counts)])
    ptr_dtype = np.uint32 if indptr[-1] < 2**32 else np.uint64
    order = np.argsort(src, kind="stable")  # keeps closest-first order within a node
    return Graph(indptr.astype(ptr_dtype), dst[order].astype(index_dtype(n)))
