"""Exact k-nearest neighbours by inner product, in row blocks: the candidate pool of the graph build.

For unit-norm vectors the inner product is the cosine similarity, so the ``k`` largest entries of
each row of ``X @ X.T`` (the diagonal excluded) are the exact neighbours. The full ``n x n`` matrix
is never held: rows are taken ``block`` at a time (each block's float32 scores against the whole
matrix, ``block * n * 4`` bytes), and the top-k of a block is selected in row chunks of
~``_SELECT_BYTES`` (`top_k_columns`), so the negated copy and argpartition's int64 index array stay
small. Cost is ``n^2 d`` flops (43k x 384: ~10 s on two cores); past a few hundred thousand
vectors an approximate pool (HNSW level 0, NN-descent) is the next step.

Knobs
- ``block`` (argument, ``GraphConfig.block``; default 0 = auto, ~``_BLOCK_BYTES`` = 128 MB of
  scores per block): rows per block. The block size sets how BLAS splits the product, so changing
  it changes float rounding (the ids of near-ties, ~0.2% of edges at 43k); the automatic size is
  kept at 128 MB so graphs stay bit-identical across versions.
- ``_SELECT_BYTES`` (8 MB): scores per top-k selection chunk; only memory, never results.

Thread-safety: pure functions of their inputs; BLAS may use several cores for the products.
"""

from __future__ import annotations

import numpy as np

# float32 scores per kNN block. The block size sets how BLAS splits the product, so changing it
# changes float rounding (ids of near-ties, ~0.2% at 43k): kept at 128 MB so graphs stay identical.
_BLOCK_BYTES = 128 * 1024 * 1024
_SELECT_BYTES = 8 * 1024 * 1024  # scores per top-k selection chunk, see top_k_columns


def top_k_columns(scores: np.ndarray, k: int) -> np.ndarray:
    """Column ids (rows, k) int64 of the ``k`` largest entries of each row of ``scores``, in no
    particular order. Same result as ``np.argpartition(-scores, k - 1, axis=1)[:, :k]``, computed in
    row chunks of ~``_SELECT_BYTES`` so the negated copy and argpartition's full-width int64 index
    array (together 3x the input, which is what made the 43k build peak at 889 MiB) stay small."""
    rows, cols = scores.shape
    step = max(1, _SELECT_BYTES // (4 * max(cols, 1)))
    out = np.empty((rows, k), dtype=np.int64)
    for start in range(0, rows, step):
        out[start : start + step] = np.argpartition(-scores[start : start + step], k - 1, axis=1)[:, :k]
    return out


def exact_knn(vectors: np.ndarray, k: int, block: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` nearest other rows of every row by inner product, closest first.

    Returns ``(ids, sims)`` of shape (n, k'), ``k' = min(k, n - 1)``, int32 and float32. Works in
    row blocks: peak memory is the block's float32 scores (``block * n * 4`` bytes, ~128 MB at the
    automatic block) plus ~3x ``_SELECT_BYTES`` for the top-k selection, plus the output.
    """
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    n = x.shape[0]
    k = min(k, n - 1)
    if k <= 0:
        return np.zeros((n, 0), np.int32), np.zeros((n, 0), np.float32)
    block = block or max(16, min(4096, _BLOCK_BYTES // (4 * max(n, 1))))
    ids = np.empty((n, k), dtype=np.int32)
    sims = np.empty((n, k), dtype=np.float32)
    for start in range(0, n, block):
        stop = min(n, start + block)
        s = x[start:stop] @ x.T
        s[np.arange(stop - start), np.arange(start, stop)] = -np.inf  # not its own neighbour
        part = top_k_columns(s, k)
        ps = np.take_along_axis(s, part, axis=1)
        del s
        order = np.argsort(-ps, axis=1, kind="stable")
        ids[start:stop] = np.take_along_axis(part, order, axis=1)
        sims[start:stop] = np.take_along_axis(ps, order, axis=1)
    return ids, sims
