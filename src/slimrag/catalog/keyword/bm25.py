"""FTS5's ``bm25()`` in numpy, for the postings keyword index (`slimrag.catalog.keyword.postings`).

SQLite's ``fts5Bm25Function``: k1 = 1.2, b = 0.75, idf = log((N - n + 0.5) / (n + 0.5)) floored
at 1e-6, a row's score the sum over the query's phrases, in query order, of idf x f(k1 + 1) /
(f + k1(1 - b + b D / avgdl)). The same operations in the same order in float64 round the same
way, so scores equal FTS5's bit for bit (``-bm25(...)``, which is what the catalog returns).
"""

from __future__ import annotations

import math

import numpy as np

K1, B = 1.2, 0.75


def top_k(hits: list[tuple[np.ndarray, np.ndarray]], lengths: np.ndarray, nrow: int, ntok: int, k: int,
          allowed: np.ndarray | None = None) -> list[tuple[int, float]]:
    """The ``k`` best rows, (row id, score) best first, ties by ascending id. ``hits``: per
    phrase of the query, the ids of the rows holding it (ascending) and how often; ``lengths``
    tokens per row by id; ``nrow`` and ``ntok`` the index's totals; ``allowed``: sorted ids the
    result may hold (the statistics still count every row)."""
    avgdl = float(ntok) / float(nrow)
    union = np.unique(np.concatenate([h[0] for h in hits])) if hits else np.zeros(0, np.int64)
    if allowed is not None:
        union = union[np.isin(union, allowed, assume_unique=True)]
    if len(union) == 0:
        return []
    d = lengths[union].astype(np.float64)
    score = np.zeros(len(union), dtype=np.float64)
    for ids, tfs in hits:
        n_hit = len(ids)
        idf = math.log((nrow - n_hit + 0.5) / (n_hit + 0.5))
        if idf <= 0.0:
            idf = 1e-6
        f = np.zeros(len(union), dtype=np.float64)
        at = np.searchsorted(union, ids)
        inside = at < len(union)
        at, tf = at[inside], tfs[inside]
        match = union[at] == ids[inside]
        f[at[match]] = tf[match]
        score += idf * ((f * (K1 + 1.0)) / (f + K1 * (1 - B + B * d / avgdl)))
    top = np.lexsort((union, -score))[:k]
    return [(int(union[i]), float(score[i])) for i in top]
