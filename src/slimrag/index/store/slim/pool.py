"""Candidate pools of the graph build: exact k-NN for small sets, HNSW over k-means partitions beyond.

The prune (``graph.py``) needs, for every row, a few dozen candidate neighbours to choose its
edges from. Where they come from decides the build's cost:

- **exact** (``knn.exact_knn``): all-pairs inner products in row blocks. Best pool, but ``n^2 d``
  flops: measured here 3.3 s at 10k, 316 s at 100k (N^1.98); kept for small sets, where it is
  also the fastest.
- **hnsw**: faiss's HNSW (``IndexHNSWFlat``, inner product) is built over the rows, and each row's
  *level-0 neighbour list* (up to ``2 * hnsw_m`` ids, chosen by HNSW's own diversity heuristic
  during insertion) is its pool; LEANN builds its graph the same way. Cost ~``n log n``.
- **hnsw-knn**: the same index, then each row's ``candidates`` approximate nearest neighbours by
  an HNSW search (``efSearch = candidates``): a pool close to exact k-NN for about twice the time.

Why HNSW level 0 rather than NN-descent, NSG or a Vamana build: ``bench.slim_graphs`` compared
them under the same prune (docs/benchmarks.md, "Which candidate graph feeds the prune"): the
cheapest pool, at the best recall.

**Partitions (DiskANN's merge).** Beyond ``partition_rows`` rows, the rows are split into
``P = ceil(overlap * n / partition_rows)`` k-means partitions (centroids trained on a sample of at
most ``_KMEANS_SAMPLE`` rows), and each row joins its ``overlap`` nearest centroids' partitions.
Each partition's HNSW is built alone, from rows read in blocks of the (possibly memory-mapped)
matrix (`rows.RowReader`), and dropped before the next: peak memory is one partition's index, not
n. A row's pool is the union of its lists from its ``overlap`` partitions; rows in two partitions
are what stitch the partitions' graphs together. `partitions` is the unit a cluster build
distributes (``ray_build.py``): each partition's lists depend only on its rows.

Knobs (``GraphConfig``): ``pool`` ("auto": exact up to ``exact_below`` rows, hnsw beyond),
``exact_below`` (50,000), ``hnsw_m`` (16: level-0 lists of 32), ``hnsw_ef`` (efConstruction,
64), ``partition_rows`` (250,000: ~370 MB of float32 vectors at d=384 plus faiss's links),
``overlap`` (2). Measured trade-offs: docs/benchmarks.md ("slim at scale").

Determinism: faiss inserts in parallel (OpenMP), so HNSW pools differ slightly run to run when
faiss uses more than one thread; exact pools are deterministic. Thread-safety: pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np

from slimrag.index.store.slim.knn import exact_knn
from slimrag.index.store.slim.rows import RowReader

if TYPE_CHECKING:
    from slimrag.index.store.slim.config import GraphConfig

#: most rows the partition centroids are trained on
_KMEANS_SAMPLE = 65536
#: rows handed to faiss per add() call (so no full copy of a partition is held beside faiss's)
_ADD_BLOCK = 32768


def pool_method(n: int, config: GraphConfig) -> str:
    """The pool ``config.pool`` resolves to for ``n`` rows."""
    if config.pool != "auto":
        return config.pool
    return "exact" if n <= config.exact_below else "hnsw"


def partitions(x: np.ndarray, config: GraphConfig) -> list[np.ndarray]:
    """Sorted int64 row ids of each partition (one partition holding every row when ``n <=
    partition_rows``); every row is in ``min(overlap, P)`` of them."""
    n = len(x)
    parts = max(1, math.ceil(config.overlap * n / config.partition_rows))
    if parts == 1 or n <= config.partition_rows:
        return [np.arange(n, dtype=np.int64)]
    from slimrag.index.store.slim.kmeans import kmeans

    rng = np.random.default_rng(config.seed)
    reader = RowReader(x)
    sample = reader.take(np.sort(rng.choice(n, min(n, _KMEANS_SAMPLE), replace=False)))
    cent = kmeans(sample, parts, 10, rng)
    del sample
    c2 = np.einsum("ij,ij->i", cent, cent)
    near = min(config.overlap, parts)
    assign = np.empty((n, near), dtype=np.int32)
    for start, block in reader.blocks(65536):
        dist = c2[None, :] - 2.0 * (block @ cent.T)
        assign[start : start + len(block)] = np.argpartition(dist, near - 1, axis=1)[:, :near]
    reader.done()
    order = np.argsort(assign.reshape(-1), kind="stable")
    rows = order // near
    bounds = np.searchsorted(assign.reshape(-1)[order], np.arange(parts + 1))
    return [np.sort(rows[bounds[p] : bounds[p + 1]]).astype(np.int64) for p in range(parts) if bounds[p + 1] > bounds[p]]


def local_lists(vectors: np.ndarray, config: GraphConfig, knn: bool = False) -> np.ndarray:
    """Candidate lists of the rows of ``vectors`` (one partition's, in memory) from an HNSW built
    over them alone: local row numbers (len(vectors), w) int64, ``-1`` padded. ``knn``: an HNSW
    search for each row's ``candidates`` nearest (the "hnsw-knn" pool) instead of its level-0
    neighbour list. What a Ray task runs (``ray_build.py``)."""
    return _lists(lambda lo, hi: np.asarray(vectors[lo:hi], dtype=np.float32), len(vectors), vectors.shape[1],
                  config, knn)


def _lists(read, count: int, dim: int, config: GraphConfig, knn: bool) -> np.ndarray:
    import faiss

    index = faiss.IndexHNSWFlat(dim, config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = config.hnsw_ef
    for start in range(0, count, _ADD_BLOCK):
        index.add(np.ascontiguousarray(read(start, min(count, start + _ADD_BLOCK))))
    if knn:
        index.hnsw.efSearch = max(config.candidates + 1, config.hnsw_ef)
        k = min(config.candidates + 1, count)
        local = np.empty((count, k), dtype=np.int64)
        for start in range(0, count, _ADD_BLOCK):
            q = np.ascontiguousarray(read(start, min(count, start + _ADD_BLOCK)))
            local[start : start + len(q)] = index.search(q, k)[1]
        local[local == np.arange(count)[:, None]] = -1  # not its own neighbour
    else:
        hnsw = index.hnsw
        offsets = faiss.vector_to_array(hnsw.offsets).astype(np.int64)
        links = faiss.vector_to_array(hnsw.neighbors)
        width = hnsw.nb_neighbors(0)  # level 0 comes first in every node's slot
        local = links[offsets[:-1, None] + np.arange(width)[None, :]].astype(np.int64)
    return local


def hnsw_lists(x: np.ndarray, rows: np.ndarray, config: GraphConfig, knn: bool = False) -> np.ndarray:
    """`local_lists` of the partition ``rows`` (sorted ids into ``x``), read from ``x`` in blocks
    (so no copy of the partition is held beside faiss's own), as global row ids (len(rows), w)
    int32, ``-1`` padded."""
    reader = RowReader(x)
    local = _lists(lambda lo, hi: reader.take(rows[lo:hi]), len(rows), x.shape[1], config, knn)
    reader.done()
    return to_global(rows, local)


def to_global(rows: np.ndarray, local: np.ndarray) -> np.ndarray:
    """Local row numbers of a partition to global row ids, int32, ``-1`` kept."""
    return np.where(local >= 0, rows[np.maximum(local, 0)], -1).astype(np.int32)


#: runs the partition builds: (x, parts, config, knn) -> one global-id list array per part, in
#: order. None: in this process, one after the other; `ray_build.ray_partitions` installs a Ray one.
PartitionRunner = Callable[[np.ndarray, list[np.ndarray], "GraphConfig", bool], Iterable[np.ndarray]]
_runner: PartitionRunner | None = None


def set_runner(runner: PartitionRunner | None) -> PartitionRunner | None:
    """Install ``runner`` for later builds in this process; returns the previous one."""
    global _runner
    previous, _runner = _runner, runner
    return previous


def _local_runner(x: np.ndarray, parts: list[np.ndarray], config: GraphConfig, knn: bool) -> Iterable[np.ndarray]:
    return (hnsw_lists(x, p, config, knn) for p in parts)


def candidate_pool(
    x: np.ndarray, config: GraphConfig, stats: dict | None = None, parts: list[np.ndarray] | None = None,
) -> np.ndarray:
    """Every row's candidate ids (n, w) int32, ``-1`` padded, duplicates possible, in no
    particular order (the prune scores and sorts them). ``stats`` (optional) receives the method
    and partition sizes; ``parts``: the `partitions` of ``x`` when the caller has them already."""
    n = len(x)
    method = pool_method(n, config)
    if stats is not None:
        stats["pool"] = method
    if method == "exact":
        reader = RowReader(x)
        ids, _ = exact_knn(reader.block(0, n), config.candidates, config.block)
        return ids.astype(np.int32)
    if method not in ("hnsw", "hnsw-knn"):
        raise ValueError(f"unknown pool {method!r}")
    parts = partitions(x, config) if parts is None else parts
    if stats is not None:
        stats["partitions"] = [len(p) for p in parts]
    runner = _runner or _local_runner
    return merge_lists(n, parts, runner(x, parts, config, method == "hnsw-knn"))


def merge_lists(n: int, parts: list[np.ndarray], lists) -> np.ndarray:
    """Concatenate, per row, the candidate lists its partitions gave (``lists`` yields one
    (len(part), w) array per partition, in ``parts`` order): (n, slots * w) int32, ``-1`` padded,
    where ``slots`` is the most partitions any row is in."""
    seen = np.zeros(n, dtype=np.int8)
    for p in parts:
        seen[p] += 1
    slots = int(seen.max()) if n else 1
    pool: np.ndarray | None = None
    used = np.zeros(n, dtype=np.int8)
    for rows, got in zip(parts, lists, strict=True):
        if pool is None:
            width = got.shape[1]
            pool = np.full((n, slots * width), -1, dtype=np.int32)
        w = got.shape[1]
        cols = used[rows].astype(np.int64)[:, None] * width + np.arange(min(w, width))[None, :]
        pool[rows[:, None], cols] = got[:, :width]
        used[rows] += 1
    assert pool is not None
    return pool
