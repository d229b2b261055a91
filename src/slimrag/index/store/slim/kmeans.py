"""Seeded Lloyd's k-means: the partitioner of the graph build (``pool.py``) and the codebook trainer of
product quantization (``pq.py``, one k-means per subspace).

Initialisation is k-means++-lite (random distinct points) or given centroids (OPQ's rounds
warm-start from the previous round's codebooks). Distances are ``-2 x.c + |c|^2`` (the per-row
``|x|^2`` does not change the argmin), computed in place into one ``(n, k)`` buffer, and cluster
sums by one ``bincount`` per dimension (much faster than ``np.add.at``). An empty cluster is
re-seeded with the points farthest from their centroid, so no centroid is wasted. Same data and
seed give the same centroids.
"""

from __future__ import annotations

import numpy as np

from slimrag.index.store.slim._threads import single_thread_blas


def kmeans(x: np.ndarray, k: int, iters: int, rng: np.random.Generator) -> np.ndarray:
    """Centroids (k, d) float32 of ``x`` by seeded Lloyd's k-means (see `_kmeans`); also the
    partitioner of the graph build (``pool.py``)."""
    return _kmeans(np.ascontiguousarray(x, dtype=np.float32), k, iters, rng)


def _kmeans(x: np.ndarray, k: int, iters: int, rng: np.random.Generator, init: np.ndarray | None = None,
            ) -> np.ndarray:
    """Lloyd's k-means with k-means++-lite init (random distinct points) or from ``init`` (k, d);
    empty clusters are re-seeded with the points farthest from their centroid, so no centroid is
    wasted."""
    n = x.shape[0]
    if n <= k:
        # Every point is its own centroid; pad with repeats so the table has k rows.
        return x[np.arange(k) % n].copy()
    cent = x[rng.choice(n, k, replace=False)].copy() if init is None else np.array(init, dtype=np.float32)
    dist = np.empty((n, k), dtype=np.float32)
    for _ in range(iters):
        # ||x - c||^2 up to the per-row constant ||x||^2, computed in place to spare temporaries.
        np.matmul(x, cent.T, out=dist)
        dist *= -2.0
        dist += np.einsum("ij,ij->i", cent, cent)[None, :]
        assign = np.argmin(dist, axis=1)
        counts = np.bincount(assign, minlength=k)
        # Per-dimension bincount is much faster than np.add.at for the cluster sums.
        sums = np.stack([np.bincount(assign, weights=x[:, s], minlength=k) for s in range(x.shape[1])], axis=1)
        full = counts > 0
        cent[full] = sums[full] / counts[full, None]
        empty = np.flatnonzero(~full)
        if len(empty):
            err = dist[np.arange(n), assign]
            cent[empty] = x[np.argsort(err)[::-1][: len(empty)]]
    return cent


def subspace_kmeans(sample: np.ndarray, m: int, k: int, iters: int, rng: np.random.Generator,
                 init: np.ndarray | None = None) -> np.ndarray:
    """PQ codebooks (m, k, d/m) float32: k-means on each of ``m`` contiguous subspaces of
    ``sample``, from ``init`` (m, k, d/m) when given; one BLAS thread (the subspaces are small)."""
    sub = sample.shape[1] // m
    books = np.empty((m, k, sub), dtype=np.float32)
    with single_thread_blas():
        for j in range(m):
            part = np.ascontiguousarray(sample[:, j * sub : (j + 1) * sub])
            books[j] = _kmeans(part, k, iters, rng, None if init is None else init[j])
    return books
