"""Build a slim generation from unit-norm vectors: graph, PQ, codes, hubs, entry layer, PQ error bound."""

from __future__ import annotations

import numpy as np

from slimrag.index.slim.artifacts import SlimArtifacts
from slimrag.index.slim.config import SlimConfig
from slimrag.index.slim.graph import build_graph, pick_hubs
from slimrag.index.slim.knn import top_k_columns
from slimrag.index.slim.pq import (
    PQConfig,
    ProductQuantizer,
    train_pq,
    training_rows,
)

#: most held-out rows `heldout_error` encodes
_HELDOUT = 4096


def build_slim(vectors: np.ndarray, config: SlimConfig | None = None) -> SlimArtifacts:
    """Build graph, PQ codes and hubs for unit-norm ``vectors`` (n, d) float32; row ``i`` of the
    result is row ``i`` of the input. ``vectors`` may be dropped by the caller afterwards."""
    config = config or SlimConfig()
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"expected a non-empty (n, d) matrix, got shape {x.shape}")
    graph = build_graph(x, config.graph)
    pq = train_pq(x, config.pq)
    codes = pq.encode(x)
    hub_rows = pick_hubs(graph, config.hub_count(len(x)))
    rng = np.random.default_rng(config.graph.seed)
    entry_rows = np.sort(rng.choice(len(x), config.entry_count(len(x)), replace=False)).astype(np.int64)
    pq_error = calibrate_pq_error(x, pq, codes, config.error_quantile, seed=config.pq.seed)
    pq_mse = heldout_error(x, pq, codes, config.pq.resolve(len(x), x.shape[1]))
    return SlimArtifacts(graph, pq, codes, hub_rows, x[hub_rows].astype(np.float16), entry_rows, pq_error, pq_mse)


def calibrate_pq_error(
    x: np.ndarray, pq: ProductQuantizer, codes: np.ndarray, quantile: float, samples: int = 512, seed: int = 0
) -> float:
    """Quantile of ``exact - pq`` inner product over (sample vector, one of its 32 exact nearest
    neighbours) pairs: the empirical error bound early termination relies on."""
    n = len(x)
    if n < 2:
        return 0.0
    rng = np.random.default_rng(seed)
    qs = rng.choice(n, min(samples, n), replace=False)
    near = min(32, n - 1)
    exact = x[qs] @ x.T
    exact[np.arange(len(qs)), qs] = -np.inf
    top = top_k_columns(exact, near)  # chunked: no negated copy of the (samples, n) matrix
    luts = pq.lookup_tables(x[qs])
    unpacked, scale = pq.unpack(codes), pq.inverse_norms(codes)
    errs = [np.take(exact[i], top[i]) - pq.scorer(luts[i], unpacked, scale)(top[i]) for i in range(len(qs))]
    return float(np.quantile(np.concatenate(errs), quantile))


def heldout_error(x: np.ndarray, pq: ProductQuantizer, codes: np.ndarray, config: PQConfig) -> float:
    """Mean `ProductQuantizer.direction_error` of rows the codebooks were not trained on: the
    baseline of the drift check of incremental updates (`slimrag.index.slim.update`).

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
        return float(pq.direction_error(x[rest], np.asarray(codes)[rest]).mean())
    if n < 10:
        return float(pq.direction_error(x, codes).mean())
    perm = rng.permutation(n)
    cut = int(0.8 * n)
    split = train_pq(x[perm[:cut]], config)
    held = x[perm[cut:][:_HELDOUT]]
    return float(split.direction_error(held, split.encode(held)).mean())
