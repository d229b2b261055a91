"""Synthetic unit vectors shaped like sentence embeddings, for index experiments without a corpus.

Real sentence embeddings (all-MiniLM-L6-v2 here) are not isotropic: they share a mean direction,
group into topics with sub-topics, and put most of their variance in a few dozen dimensions. An
index tuned on isotropic Gaussian noise learns nothing about them (every neighbour is about as far
as every other), so :func:`text_like` draws from that shape instead:

    x = 0.35 mean + 0.9 topic + 0.5 sub-topic + 0.45 low-rank noise + 0.04 full-rank noise, normalised

- ``rank`` = min(96, d): the subspace holding the topic, sub-topic and main noise directions, with
  a 1/sqrt(i + 1) spectrum (a few strong directions, a long tail).
- ``clusters``: topics, each with 8 sub-topics. Default max(8, n // 80): about 80 vectors per
  topic whatever n; pass a number to keep the same law when n changes.

Queries are drawn from the same law (same topics), after the corpus, from the same generator: one
seed fixes both. numpy only, so tests and benchmarks can both use it.
"""

from __future__ import annotations

import numpy as np


def text_like(n: int, nq: int, d: int = 384, seed: int = 0, clusters: int | None = None,
              ) -> tuple[np.ndarray, np.ndarray]:
    """``n`` corpus and ``nq`` query unit vectors of dimension ``d`` (float32), drawn as the module
    header describes; the same arguments give the same arrays."""
    rng = np.random.default_rng(seed)
    rank = min(96, d)
    mean = rng.normal(size=d)
    mean /= np.linalg.norm(mean)
    basis = np.linalg.qr(rng.normal(size=(d, rank)))[0]
    spectrum = 1.0 / np.sqrt(1.0 + np.arange(rank))
    clusters = max(8, n // 80) if clusters is None else clusters
    centers = (rng.normal(size=(clusters, rank)) * spectrum) @ basis.T
    subs = (rng.normal(size=(clusters * 8, rank)) * spectrum) @ basis.T

    def draw(m: int) -> np.ndarray:
        c = rng.integers(0, clusters, m)
        s = c * 8 + rng.integers(0, 8, m)
        x = (
            0.35 * mean
            + 0.9 * centers[c]
            + 0.5 * subs[s]
            + 0.45 * (rng.normal(size=(m, rank)) * spectrum) @ basis.T
            + 0.04 * rng.normal(size=(m, d))
        )
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    return draw(n), draw(nq)
