"""Incremental compaction of a slim generation: insert the delta rows into the existing graph,
consolidate deletes, keep the PQ codebooks; recompute only a few old rows instead of all of them.

A full rebuild needs every live vector, and a slim generation stores none: every old row is
re-embedded (for 43k pydocs chunks, ~96 minutes here). `update_slim` edits the graph instead
(after FreshDiskANN's insert and delete-consolidation passes):

1. **Drift check.** The new rows are encoded with the kept codebooks; the mean
   `ProductQuantizer.direction_error` of the new rows over the build's (``SlimArtifacts.pq_mse``)
   is the drift ratio. Clearly above ``drift_threshold`` the codebooks no longer fit the data and the
   update becomes a full rebuild (codebooks retrained: every old row recomputed). The build's
   error is measured on rows the codebooks were not trained on (`build.heldout_error`): k-means
   overfits its training rows, so a training-set baseline makes every small 8-bit index look
   drifted (ratio 4.8 for more rows of the same kind at 400 rows). A generation written before
   ``pq_mse`` existed gets its baseline from ``drift_sample`` recomputed old rows, training rows
   (a low baseline: such an index retrains a little too eagerly, never too late).
2. **Insert.** Each new row walks the old graph like a query (`SlimSearcher.walk`, PQ scores,
   beam ``ef``, deleted rows walked through but never kept). Its ``rerank`` best pool rows are
   recomputed exactly, one batched ``recompute`` call for all new rows; the candidate list is the
   pool plus the row's nearest other new rows (exact, the delta has their vectors), closest first,
   ``GraphConfig.candidates`` at most, and is robust-pruned with the build's rule (`robust_prune`,
   ``alpha``; limit ``base_degree``). Rows whose exact vector is not known (not recomputed, not a
   hub, not new) take part through their unit-norm PQ reconstruction: the direction normalized
   ADC scores with, so the insert sees the same neighbourhood a query walk sees.
3. **Reverse edges.** Each kept edge ``p -> c`` adds ``c -> p``; a node then over its limit is
   robust-pruned again over its merged list (Vamana's second pass). Limits follow the build's
   hub-degree rule on the current graph: the ``hub_fraction`` most-referenced nodes may keep
   ``max_degree`` edges, the others ``base_degree``.
4. **Delete consolidation.** For every live node ``p`` with an out-neighbour in the deleted set
   ``D``: candidates = ``N(p) ∪ N(d) for d in N(p) ∩ D``, minus ``D`` and ``p``; pruned as above when
   over the limit. Then deleted rows are dropped and rows renumbered: survivors in their old
   order, then the new rows in delta order (``ids`` says which chunk each row is).
5. **Repair.** The build's connectivity pass (`graph._make_strongly_connected`) on the edited
   graph; hubs: surviving hubs keep their fp16 vectors, free slots go to the most-referenced
   rows (an old one recomputed); entry layer: surviving entries plus a seeded sample of other
   rows up to `SlimConfig.entry_count`. ``pq_error`` and ``pq_mse`` stay the build's.

A full rebuild is also taken when asked (``rebuild=True``) or when fewer old rows survive than
rows are added (the codebooks were trained on the minority, and re-embedding the kept rows costs
less than the add just did). An index that grows past 32,768 rows keeps its 4-bit codebooks,
although the automatic PQ rule would now pick 8 bits (recall@10 0.959 against 0.966 at 43k,
package header): re-embedding the whole corpus for that is a user's choice, ``rebuild=True``.

Cost: ``UpdateConfig.per_row`` recomputed rows per new row at most (shared candidates computed
once) plus the hubs that replace deleted ones; the walk is ~2-10 ms of Python per new row; deletes
recompute nothing. A full rebuild recomputes every kept row.

Knobs (``UpdateConfig``; measured with ``python -m bench.compaction --data pydocs``: 3,000 real
MiniLM vectors, 5 rounds of +2% / -2% / compact; figures in the package header):
- ``ef`` (default 32): beam of the insertion walk, the pool the candidates come from. 32 and 64
  gave the same recall after 10 rounds on disfl_qa (0.9800, 0.9797); 64 walks ~1.5x longer.
- ``rerank`` (default 4): pool rows recomputed exactly per new row, for exact edges to the
  nearest old rows; others take part through their PQ direction. Recall@10 after 5 rounds, gap
  to a fresh build (pydocs): 0.0007 at 0, -0.001 at 2, -0.0013 at 4; disfl_qa: 0.006 / 0.0057 /
  0.0057. Small, because the new rows' own vectors are exact and the walk's PQ ranking already
  finds the right neighbourhood.
- ``recompute_share`` (default 0.02): at most this share of the kept rows is recomputed per
  update (``per_row = min(rerank, share * kept // added)``): 1% added gets ~2 exact candidates per
  row, 10% gets none, so an update stays under 1/10 of a rebuild's re-embedding by a wide margin.
- ``drift_threshold`` (default 1.1): retrain (full rebuild) when the ratio of mean direction
  errors, new rows over the build's held-out rows, exceeds this plus ``DRIFT_SIGMAS`` (3) standard
  errors of the new rows' mean (per-row ratios spread by 0.08-0.22, so 5 new rows of the same
  kind reach 1.37 one time in a thousand). Measured with 20% new rows: 0.995-0.999 for more of the
  same corpus (pydocs, disfl_qa); 1.15 for disfl_qa + pydocs rows and 1.24 for disfl_qa +
  synthetic rows (recall with the kept codebooks 0.016-0.022 below retrained: retrained at 1.1,
  missed at the first guess of 1.3); 1.54-2.2 for pydocs + other rows (0.009-0.07 below).
  Half-shifted disfl_qa adds (1.07-1.12, 0.008 below) pass. Limitation: drift is judged per
  update against the build, so a slow shift spread over many small updates is not summed up.
- ``drift_sample`` (default 64): old rows recomputed for the baseline of legacy generations.

The edits (steps 2-5) live in ``edit.py``; this module decides between them and a full rebuild.
Thread-safety: pure function of its inputs (it builds its own searcher); ``recompute`` is called
from the calling thread only.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from slimrag.index.store.slim.artifacts import SlimArtifacts
from slimrag.index.store.slim.build import build_slim
from slimrag.index.store.slim.config import SlimConfig
from slimrag.index.store.slim.edit import edit_graph
from slimrag.index.store.slim.searcher import RecomputeRows

log = logging.getLogger("slimrag.index")

#: standard errors of the new rows' mean error added to ``drift_threshold`` (a few new rows are noisy)
DRIFT_SIGMAS = 3.0
#: old rows per ``recompute`` call (bounds the texts and vectors held at once)
RECOMPUTE_BATCH = 2048


@dataclass(frozen=True, slots=True)
class UpdateConfig:
    """Knobs of an incremental slim update; see the module header for each trade-off."""

    ef: int = 32
    rerank: int = 4
    recompute_share: float = 0.02
    drift_threshold: float = 1.1
    drift_sample: int = 64

    def per_row(self, kept: int, added: int) -> int:
        """Pool rows recomputed per new row: ``rerank``, lowered so the update re-embeds at most
        ``recompute_share`` of the ``kept`` rows a rebuild would re-embed."""
        return min(self.rerank, int(self.recompute_share * kept) // max(added, 1))

    def __post_init__(self) -> None:
        if self.ef < 1 or self.rerank < 0 or self.drift_sample < 1:
            raise ValueError(f"need ef >= 1, rerank >= 0, drift_sample >= 1, got {self.ef}, {self.rerank}, "
                             f"{self.drift_sample}")
        if self.rerank > self.ef:
            raise ValueError(f"rerank ({self.rerank}) must be <= ef ({self.ef}): it draws from the walk's pool")
        if not 0.0 <= self.recompute_share <= 1.0:
            raise ValueError(f"recompute_share must be in [0, 1], got {self.recompute_share}")
        if self.drift_threshold <= 0:
            raise ValueError(f"drift_threshold must be > 0, got {self.drift_threshold}")


@dataclass(frozen=True, slots=True)
class UpdateStats:
    """What an update did: rows kept, removed and added, old rows recomputed (the re-embedding
    cost) in how many calls, the drift ratio, and whether (and why) it was a full rebuild."""

    kept: int
    removed: int
    added: int
    recomputed: int
    recompute_calls: int
    drift: float
    rebuilt: bool
    reason: str
    seconds: float


@dataclass(frozen=True, slots=True)
class SlimUpdate:
    """A new generation: ``ids[i]`` is the chunk id of row ``i`` of ``artifacts``."""

    ids: np.ndarray
    artifacts: SlimArtifacts
    stats: UpdateStats


@dataclass(slots=True)
class _Recomputer:
    """Counts the caller's ``recompute`` and batches it."""

    fn: RecomputeRows
    dim: int
    rows: int = 0
    calls: int = 0

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        parts = []
        for s in range(0, len(rows), RECOMPUTE_BATCH):
            part = np.asarray(self.fn(rows[s:s + RECOMPUTE_BATCH]), dtype=np.float32)
            if part.shape != (len(rows[s:s + RECOMPUTE_BATCH]), self.dim):
                raise ValueError(f"recompute returned shape {part.shape} for {len(rows[s:s + RECOMPUTE_BATCH])} "
                                 f"rows; expected (rows, {self.dim})")
            parts.append(part)
            self.rows += len(part)
            self.calls += 1
        return np.concatenate(parts) if parts else np.zeros((0, self.dim), np.float32)


def update_slim(
    art: SlimArtifacts, gen_ids: np.ndarray, live: np.ndarray, new_ids: np.ndarray, new_vectors: np.ndarray,
    recompute: RecomputeRows, config: SlimConfig | None = None, update: UpdateConfig | None = None,
    rebuild: bool = False,
) -> SlimUpdate:
    """The next generation of ``art``: rows with ``live`` False removed, ``new_vectors`` (unit-norm,
    chunk ids ``new_ids``) added, by editing the graph (module header) or, when ``rebuild`` or a
    rule asks, by a full `build_slim`. ``gen_ids``: chunk id of each row of ``art``; ``recompute``:
    exact vectors of rows of ``art``. A new id equal to a live old one is kept once (the old row).
    Saving the result and switching the manifest is the caller's (crash safety)."""
    t0 = time.perf_counter()
    config = config or SlimConfig()
    update = update or UpdateConfig()
    gen_ids = np.asarray(gen_ids, dtype=np.int64)
    live = np.asarray(live, dtype=bool)
    new_ids = np.asarray(new_ids, dtype=np.int64)
    x_new = np.ascontiguousarray(new_vectors, dtype=np.float32)
    if x_new.size == 0:
        x_new = x_new.reshape(0, art.dim)
    if live.shape != (art.n,) or len(gen_ids) != art.n:
        raise ValueError(f"gen_ids and live must have one entry per row ({art.n}), got {len(gen_ids)}, {live.shape}")
    if x_new.ndim != 2 or x_new.shape != (len(new_ids), art.dim):
        raise ValueError(f"new_vectors must be ({len(new_ids)}, {art.dim}) (one row per new id), got {x_new.shape}")
    _, first = np.unique(new_ids, return_index=True)  # an id twice in the delta: its first row
    first = np.sort(first)
    first = first[~np.isin(new_ids[first], gen_ids[live])]  # a live old row wins over a delta copy
    new_ids, x_new = new_ids[first], x_new[first]
    rec = _Recomputer(recompute, art.dim)
    kept = int(live.sum())
    if kept + len(new_ids) == 0:
        raise ValueError("no live row is left: a slim generation needs at least one (write a flat one)")
    new_codes = art.pq.encode(x_new) if len(x_new) else np.zeros((0, art.codes.shape[1]), np.uint8)
    drift, noise = _drift(art, x_new, new_codes, live, rec, update) if len(x_new) else (0.0, 0.0)

    reason = _rebuild_reason(kept, len(x_new), drift, noise, update, rebuild)
    if reason:
        ids, out = _full_rebuild(art, gen_ids, live, new_ids, x_new, rec, config)
    else:
        out = edit_graph(art, live, x_new, new_codes, rec, config, update.ef, update.per_row(kept, len(x_new)))
        ids = np.concatenate([gen_ids[live], new_ids])
    stats = UpdateStats(kept=kept, removed=art.n - kept, added=len(new_ids), recomputed=rec.rows,
                        recompute_calls=rec.calls, drift=round(drift, 4), rebuilt=bool(reason), reason=reason,
                        seconds=time.perf_counter() - t0)
    log.info("slim update: %s", stats)
    return SlimUpdate(ids, out, stats)


def _drift(art: SlimArtifacts, x_new: np.ndarray, new_codes: np.ndarray, live: np.ndarray, rec: _Recomputer,
           update: UpdateConfig) -> tuple[float, float]:
    """Mean direction error of the new rows over the build's (module header, step 1), and the
    standard error of that mean (from the new rows' spread)."""
    base = art.pq_mse
    if base is None:  # generation written before pq_mse: measure a seeded sample of old rows
        rows = np.flatnonzero(live)
        rows = np.sort(np.random.default_rng(0).choice(rows, min(len(rows), update.drift_sample), replace=False))
        base = float(art.pq.direction_error(rec(rows), np.asarray(art.codes)[rows]).mean()) if len(rows) else 0.0
    ratios = art.pq.direction_error(x_new, new_codes) / max(base, 1e-12)
    return float(ratios.mean()), float(ratios.std() / np.sqrt(len(ratios)))


def _rebuild_reason(kept: int, added: int, drift: float, noise: float, update: UpdateConfig,
                    rebuild: bool) -> str:
    """Why this update must be a full rebuild, or "" when the graph can be edited."""
    if rebuild:
        return "asked"
    if kept == 0:
        return "no old row survives"
    if added > kept:
        return f"{added} rows added to {kept} kept"
    if drift > update.drift_threshold + DRIFT_SIGMAS * noise:
        return f"PQ drift {drift:.3f} > {update.drift_threshold} + {DRIFT_SIGMAS} x {noise:.3f}"
    return ""


def _full_rebuild(art: SlimArtifacts, gen_ids: np.ndarray, live: np.ndarray, new_ids: np.ndarray,
                  x_new: np.ndarray, rec: _Recomputer, config: SlimConfig) -> tuple[np.ndarray, SlimArtifacts]:
    """`build_slim` over every live vector, old rows recomputed; rows sorted by chunk id."""
    rows = np.flatnonzero(live)
    ids = np.concatenate([gen_ids[rows], new_ids])
    vecs = np.concatenate([rec(rows), x_new])
    order = np.argsort(ids, kind="stable")
    return ids[order], build_slim(vecs[order], config)
