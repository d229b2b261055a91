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

Steps 3 and 4 run in ``prune.py``, over batches and blocks of nodes.

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

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slimrag.index.store.slim.config import GraphConfig
from slimrag.index.store.slim.pool import candidate_pool, partitions, pool_method
from slimrag.index.store.slim.prune import PhaseClock, forward_prune, merge_reverse, partition_order, spans

INDPTR_FILE = "graph_indptr.npy"
INDICES_FILE = "graph_indices.npy"


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


def build_graph(vectors: np.ndarray, config: GraphConfig | None = None, stats: dict | None = None) -> Graph:
    """Build the pruned proximity graph of unit-norm ``vectors`` (n, d) float32, in memory or an
    ``np.memmap`` (read in blocks, `rows.RowReader`; never copied whole).

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
    parts = partitions(x, config) if pool_method(n, config) in ("hnsw", "hnsw-knn") else [np.arange(n)]
    pool = candidate_pool(x, config, stats, parts)
    order = partition_order(parts, n)  # prune neighbourhoods together: their rows are read once
    del parts
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
    src, dst, sim, near = forward_prune(x, pool, limits, config, order)
    del pool
    clock.lap("prune")
    src, dst, sim = merge_reverse(x, src, dst, sim, limits, config, order)
    del order
    del sim
    clock.lap("reverse")
    src, dst = _make_strongly_connected(n, src, dst, near, root)
    graph = _to_csr(n, src, dst)
    clock.lap("connect")
    return graph


def pick_hubs(graph: Graph, count: int) -> np.ndarray:
    """The ``count`` rows of highest in-degree (ties by row id), as int64: the best-connected
    nodes, used as search entry points and kept as fp16 vectors."""
    count = max(0, min(int(count), graph.n))
    return np.sort(np.argsort(-graph.in_degrees(), kind="stable")[:count]).astype(np.int64)


#: frontier nodes expanded at a time by `_reached_from` (so its temporaries are ~this many nodes' edges)
_BFS_NODES = 65536


def _csr_of(n: int, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(indptr int64, targets) of edge arrays ``src -> dst``: what `_reached_from` walks."""
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=indptr[1:])
    return indptr, dst[np.argsort(src, kind="stable")]


def _reached_from(indptr: np.ndarray, targets: np.ndarray, seeds: np.ndarray, reached: np.ndarray) -> None:
    """Breadth-first search from ``seeds`` over the graph (`_csr_of`), marking ``reached`` in
    place; the frontier is expanded ``_BFS_NODES`` nodes at a time (at 3M rows a whole level's
    edge temporaries, int64, were most of the build's peak memory)."""
    frontier = np.unique(seeds[~reached[seeds]])
    reached[frontier] = True
    while len(frontier):
        found = []
        for a in range(0, len(frontier), _BFS_NODES):
            part = frontier[a : a + _BFS_NODES]
            nxt = np.unique(targets[spans(indptr[part], indptr[part + 1])[0]])
            nxt = nxt[~reached[nxt]]
            reached[nxt] = True
            found.append(nxt)
        frontier = np.concatenate(found)


def _link_unreached(
    n: int, src: np.ndarray, dst: np.ndarray, knn: np.ndarray, root: int
) -> tuple[np.ndarray, np.ndarray]:
    """Add edges ``parent -> lost`` until every node is reachable from ``root``; the parent is the
    lost node's nearest kNN neighbour that is already reachable (or ``root`` for an island).

    The search structure is built once: an added edge leaves a node already reached, and a
    search only ever expands nodes it newly reaches, so no later search needs the added edges."""
    indptr, targets = _csr_of(n, src, dst)
    reached = np.zeros(n, dtype=bool)
    _reached_from(indptr, targets, np.array([root]), reached)
    add_src, add_dst = [], []
    while not reached.all():
        lost = np.flatnonzero(~reached)
        if knn.shape[1]:
            near = knn[lost]
            ok = (near >= 0) & reached[np.maximum(near, 0)]  # -1 pads a short candidate list
        else:
            ok = np.zeros((len(lost), 1), dtype=bool)
        has = ok.any(axis=1)
        if has.any():
            found = lost[has]
            parents = knn[found, np.argmax(ok[has], axis=1)].astype(np.int64)
        else:
            found = lost[:1]
            parents = np.array([root], dtype=np.int64)
        add_src.append(parents.astype(src.dtype))
        add_dst.append(found.astype(dst.dtype))
        _reached_from(indptr, targets, found, reached)
    del indptr, targets
    if not add_src:
        return src, dst
    return np.concatenate([src, *add_src]), np.concatenate([dst, *add_dst])


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
