"""Exact (flat) vector search: the reference every other index is measured against.

All vectors are unit-norm, so the inner product is the cosine similarity and the top-k of
``matrix @ query`` is exact. float32 costs 1,536 bytes per 384-dim vector, float16 half of that
with score changes around 1e-3 (ranks of near-ties may swap). Search is one matrix-vector product
(or matrix-matrix for a batch of queries) plus ``argpartition``: O(n·d), about 5 ms for 40k vectors
here, which is why small corpora never need a graph.

Rows whose chunk was removed stay in the matrix until compaction and are masked with ``-inf``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from slimrag.config import SearchConfig


class FlatVectors:
    """Row-major unit vectors with their chunk ids and a liveness mask."""

    def __init__(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        if len(ids) != len(vectors):
            raise ValueError(f"{len(ids)} ids but {len(vectors)} vectors")
        self.ids = np.asarray(ids, dtype=np.int64)
        self.vectors = vectors
        self.live = np.ones(len(ids), dtype=bool)

    def __len__(self) -> int:
        return len(self.ids)

    def set_live(self, live_ids: np.ndarray) -> None:
        """Mark as live exactly the rows whose chunk id is in ``live_ids``."""
        self.live = np.isin(self.ids, live_ids)

    def live_vectors(self) -> tuple[np.ndarray, np.ndarray]:
        """(chunk ids, float32 vectors) of the live rows, sorted by chunk id: what a compaction keeps."""
        ids, vecs = self.ids[self.live], np.asarray(self.vectors)[self.live].astype(np.float32)
        order = np.argsort(ids, kind="stable")
        return ids[order], vecs[order]

    def search(self, queries: np.ndarray, k: int, allow: np.ndarray | None = None,
               config: SearchConfig | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k for each query row. Returns (chunk_ids, scores), each (nq, k'), best first,
        where k' = min(k, live rows). ``allow`` is an optional extra row mask (metadata filters).
        ``config`` is accepted for the vector stores' common interface and not read: exact search
        has no knobs."""
        q = np.atleast_2d(np.asarray(queries, dtype=np.float32))
        mask = self.live if allow is None else (self.live & allow)
        n_live = int(mask.sum())
        kk = min(k, n_live)
        if kk == 0 or len(self) == 0:
            return np.zeros((len(q), 0), np.int64), np.zeros((len(q), 0), np.float32)
        scores = (self.vectors @ q.T).T.astype(np.float32)  # (nq, n); fp16 matrices upcast here
        scores[:, ~mask] = -np.inf
        if kk < scores.shape[1]:
            part = np.argpartition(-scores, kk - 1, axis=1)[:, :kk]
        else:
            part = np.tile(np.arange(scores.shape[1]), (len(q), 1))
        top = np.take_along_axis(scores, part, axis=1)
        # Stable order: score descending, then chunk id ascending, so ties never flip between runs.
        order = np.lexsort((self.ids[part], -top), axis=1)
        rows = np.take_along_axis(part, order, axis=1)
        return self.ids[rows], np.take_along_axis(scores, rows, axis=1)
