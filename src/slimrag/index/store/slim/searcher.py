"""`SlimSearcher`: entry from hubs and the entry layer, PQ beam search, exact rerank in waves.

The algorithm and its knobs are described in the package header (`slimrag.index.store.slim`); the
rerank depth and its recall knob, which live here, in detail:

Rerank in waves. A query's ``ef`` pool is sorted by PQ score and re-scored exactly from the top:
a first wave of ``k`` rows, then ``wave`` (4) rows at a time, one ``recompute`` call per wave for
the whole batch. After each wave the query stops when the next row's PQ score plus a bound is
below the k-th exact score so far (the pool is sorted, so that bound covers every later row):

- up to the *floor*, ``max(rerank, k)`` positions (20 at the defaults; a wave is cut short to end
  exactly there), the bound is ``pq_error``, the build's 0.999-quantile of ``exact - PQ`` on near
  neighbours: the fixed depth's early stop. The floor stays because the calibration below uses
  passages as queries, and short real questions sit farther from every passage (the margin alone
  gave 0.88 on the MiniLM questions of ``tests/test_slim_index.py``).
- past the floor, the bound is the *stop margin* for ``SearchConfig.recall`` (default 0.96), read
  from the generation's ``stop_table``, and the rerank may go on to the end of the pool. So the
  depth adapts to N (PQ ranks worse in denser neighbourhoods) and to each query's score gaps.

The stop table (`slimrag.index.store.slim.build.calibrate_stop`, in ``slim.json``): 512 sample rows are
searched as queries (each left out of its results) and, for a grid of 128 margins, the exact
rule above is simulated wave by wave, floor included, giving recall@10 (mean less one standard
error) and median rows per margin. `stop_margin` takes the smallest margin whose recall reaches
the target (or the table's best when the target is above it). Because the simulation is the
searcher's own rule, the recall measured on held-out queries lands on the target instead of
above it (before the floor was simulated, a 0.96 target read 0.986 at 100k synthetic rows, rows
spent for recall nobody asked for). ``recall=0`` (or ``early_stop=False``, or a generation
without a table) keeps the fixed depth ``rerank``.

Trade-off: each row recomputed is one passage re-embedded (~30 ms on a laptop CPU), so the
median rows are the latency; the recall target is the knob, the codes' quality (``pq.py``:
the OPQ rotation from ~98k rows) decides how many rows a target costs. Measured frontier
(target vs recall vs median rows vs structure ms, 100k and 1M synthetic, real MiniLM corpora):
``docs/benchmarks.md``, "Slim recall target".
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from slimrag.config import SearchConfig
from slimrag.index.store.slim.artifacts import SlimArtifacts
from slimrag.index.store.slim.config import SlimConfig
from slimrag.index.store.slim.pq import (
    ADCScorer,
)
from slimrag.index.store.slim.vcache import VectorCache

#: exact vectors of generation rows, by row number (a store turns rows into chunk ids and
#: re-embeds their text: `slimrag.index.store.recompute.Recompute`); what a search reranks with
RecomputeRows = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True, slots=True)
class SearchStats:
    """What one query cost: graph nodes scored by PQ, rows recomputed, rerank rows served by the cache."""

    visited: int
    recomputed: int
    cache_hits: int


@dataclass(frozen=True, slots=True)
class WalkResult:
    """Top rows by exact inner product, best first: ``rows`` int64, ``scores`` float32."""

    rows: np.ndarray
    scores: np.ndarray
    stats: SearchStats


class SlimSearcher:
    """Searches one :class:`SlimArtifacts` with exact rerank through ``recompute``. Not thread-safe
    (visited stamps are per instance; the cache may be shared, and locks itself); see the module header.

    config: the generation's `SlimConfig` (here only ``entries`` and ``cache_bytes`` are read).
    search: the default query knobs (ef, rerank, wave, early_stop of `SearchConfig`), which
    :meth:`search_batch` may override per call."""

    def __init__(self, artifacts: SlimArtifacts, recompute: RecomputeRows, config: SlimConfig | None = None,
                 search: SearchConfig | None = None, cache: VectorCache | None = None) -> None:
        self.art = artifacts
        self.recompute = recompute
        self.config = config or SlimConfig()
        self.search_config = search or SearchConfig()
        #: recomputed rows; ``cache`` shares one between searchers of one generation (`vcache.shared`)
        self.cache = cache if cache is not None else VectorCache(self.config.cache_bytes, artifacts.dim)
        # Graph and codes stay as loaded (memory-mapped by `SlimArtifacts.load`): the query path's
        # own memory is 8 bytes per row (PQ norms, visit stamps) plus the pages walks touch.
        self._indptr = artifacts.graph.indptr
        self._indices = np.asarray(artifacts.graph.indices)
        self._hubs = np.asarray(artifacts.hub_vectors, dtype=np.float32)
        self._codes = artifacts.pq.unpack(np.asarray(artifacts.codes))
        self._scale = artifacts.pq.inverse_norms(self._codes)
        #: per thread: its visited stamps (4 bytes a row, made at its first walk) and epoch, so
        #: threads walk the same graph at once; the cache locks itself
        self._visits = threading.local()

    def search(self, query: np.ndarray, k: int = 10, skip: np.ndarray | Iterable[int] | None = None,
               config: SearchConfig | None = None) -> WalkResult:
        """Top-``k`` rows for one unit-norm query vector (d,)."""
        return self.search_batch(np.asarray(query, dtype=np.float32)[None, :], k, skip, config)[0]

    def search_batch(
        self, queries: np.ndarray, k: int = 10, skip: np.ndarray | Iterable[int] | None = None,
        config: SearchConfig | None = None,
    ) -> list[WalkResult]:
        """Top-``k`` rows for each of ``queries`` (nq, d). ``skip``: a bool mask of length n or row
        ids that must never be returned (tombstones). ``config``: query knobs for this call (ef,
        rerank, wave, early_stop; its ``k`` and ``mode`` are not read), else the searcher's.
        Each rerank wave is one ``recompute`` call for the whole batch, rows shared by several
        queries computed once."""
        cfg = config or self.search_config
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        q = np.asarray(queries, dtype=np.float32)
        if q.ndim != 2 or q.shape[1] != self.art.dim:
            raise ValueError(f"queries must be (nq, {self.art.dim}), got shape {q.shape}")
        pools, visited = self.walk(q, cfg.ef, self._skip_mask(skip))
        return self._rerank(q, pools, visited, k, cfg)

    def walk(self, queries: np.ndarray, ef: int, skip: np.ndarray | None = None,
             ) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[int]]:
        """The approximate level alone: for each of ``queries`` (nq, d), the ``ef`` best rows found
        by the PQ-guided walk (``skip``: bool mask of rows walked through but never kept), as
        (rows int64, normalized-ADC scores float32) sorted best first, and the nodes scored. No
        ``recompute`` call; `slimrag.index.store.slim.update` uses it to find an inserted row's neighbours."""
        q = np.asarray(queries, dtype=np.float32)
        mask = np.zeros(self.art.n, dtype=bool) if skip is None else skip
        luts = self.art.pq.lookup_tables(q)
        hub_scores = q @ self._hubs.T
        pools, visited = [], []
        for i in range(len(q)):
            scorer = self.art.pq.scorer(luts[i], self._codes, self._scale)
            entry = self.art.entry_rows
            seeds = np.concatenate(
                [
                    self.art.hub_rows[np.argsort(-hub_scores[i])[: self.config.entries]],
                    entry[np.argsort(-scorer(entry))[: self.config.entries]],
                ]
            )
            rows, pq_scores, seen = self._beam(scorer, seeds, mask, ef)
            pools.append((rows, pq_scores))
            visited.append(seen)
        return pools, visited

    def _skip_mask(self, skip: np.ndarray | Iterable[int] | None) -> np.ndarray:
        n = self.art.n
        if skip is None:
            return np.zeros(n, dtype=bool)
        arr = np.asarray(skip if isinstance(skip, np.ndarray) else list(skip))
        if arr.dtype == bool:
            if arr.shape != (n,):
                raise ValueError(f"skip mask must have shape ({n},), got {arr.shape}")
            return arr
        mask = np.zeros(n, dtype=bool)
        mask[arr.astype(np.int64)] = True
        return mask

    def _beam(
        self, scorer: ADCScorer, seeds: np.ndarray, skip: np.ndarray, ef: int
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """Best-first search by PQ score keeping the best ``ef``; returns the beam's non-skipped
        rows sorted by PQ score (descending), their scores, and the number of nodes scored."""
        visits = self._visits
        if not hasattr(visits, "stamp"):
            visits.stamp, visits.epoch = np.zeros(self.art.n, dtype=np.uint32), 0
        visits.epoch += 1
        if visits.epoch == 2**32 - 1:  # wrap-around: stamps from long ago could alias
            visits.stamp[:] = 0
            visits.epoch = 1
        stamp, epoch, indptr, indices = visits.stamp, visits.epoch, self._indptr, self._indices
        seeds = np.unique(seeds)
        stamp[seeds] = epoch
        seed_scores = scorer(seeds)
        cand = [(-s, r) for s, r in zip(seed_scores.tolist(), seeds.tolist(), strict=True)]
        heapq.heapify(cand)
        res = [(s, r) for s, r in zip(seed_scores.tolist(), seeds.tolist(), strict=True) if not skip[r]]
        heapq.heapify(res)
        seen = len(seeds)
        while cand:
            neg, row = heapq.heappop(cand)
            if len(res) >= ef and -neg < res[0][0]:
                break
            nb = indices[indptr[row] : indptr[row + 1]]
            nb = nb[stamp[nb] != epoch]
            if not len(nb):
                continue
            stamp[nb] = epoch
            seen += len(nb)
            sc = scorer(nb)
            if len(res) >= ef:
                good = sc > res[0][0]
                nb, sc = nb[good], sc[good]
            for s, r in zip(sc.tolist(), nb.tolist(), strict=True):
                if len(res) < ef or s > res[0][0]:
                    heapq.heappush(cand, (-s, r))
                    if not skip[r]:
                        heapq.heappush(res, (s, r))
                        if len(res) > ef:
                            heapq.heappop(res)
        res.sort(reverse=True)
        rows = np.fromiter((r for _, r in res), dtype=np.int64, count=len(res))
        scores = np.fromiter((s for s, _ in res), dtype=np.float32, count=len(res))
        return rows, scores, seen

    def _rerank(
        self, q: np.ndarray, pools: list[tuple[np.ndarray, np.ndarray]], visited: list[int], k: int,
        cfg: SearchConfig,
    ) -> list[WalkResult]:
        """Exact level. Each query's pool is walked in PQ order up to ``max(rerank, k)``
        positions, in waves; one ``recompute`` call per wave serves the whole batch."""
        nq = len(q)
        margin = self.stop_margin(cfg)
        floor = max(cfg.rerank, k)
        if margin is None:  # fixed depth: `rerank` positions, early stop on the PQ error bound
            limit = [min(len(rows), floor) for rows, _ in pools]
            stop, bound = cfg.early_stop, self.art.pq_error
        else:  # adaptive depth: the whole pool is eligible; past `rerank`, the calibrated margin stops it
            limit = [len(rows) for rows, _ in pools]
            stop, bound = True, margin
        exact: list[dict[int, float]] = [{} for _ in range(nq)]
        pos = [0] * nq
        recomputed = [0] * nq
        hits = [0] * nq
        # Free exact scores for every pooled row already in the cache, wherever it ranks.
        for i, (rows, _) in enumerate(pools):
            for r in rows.tolist():
                vec = self.cache.lookup(r)
                if vec is not None:
                    exact[i][r] = float(vec @ q[i])
                    hits[i] += 1
        ends = [iter(wave_ends(limit[i], k, floor, cfg.wave) if stop else [limit[i]]) for i in range(nq)]
        active = [i for i in range(nq) if not self._done(pools[i], exact[i], pos[i], limit[i], k, stop, bound, floor)]
        while active:
            want: dict[int, list[int]] = {}
            for i in active:
                end = next(ends[i])
                take = []
                for r in pools[i][0][pos[i] : end].tolist():
                    if r in exact[i]:
                        continue
                    vec = self.cache.lookup(r)  # recomputed by an earlier wave, query or thread
                    if vec is not None:
                        exact[i][r] = float(vec @ q[i])
                        hits[i] += 1
                    else:
                        take.append(r)
                pos[i] = end
                want[i] = take
            need = np.array(sorted({r for take in want.values() for r in take}), dtype=np.int64)
            if len(need):
                vecs = self._recompute(need)
                self.cache.put(need, vecs)
                at = {r: j for j, r in enumerate(need.tolist())}
                for i, take in want.items():
                    if take:
                        scores = vecs[[at[r] for r in take]] @ q[i]
                        exact[i].update(zip(take, scores.tolist(), strict=True))
                        recomputed[i] += len(take)
            active = [i for i in active if not self._done(pools[i], exact[i], pos[i], limit[i], k, stop, bound, floor)]
        out = []
        for i in range(nq):
            items = sorted(exact[i].items(), key=lambda kv: (-kv[1], kv[0]))[:k]
            out.append(
                WalkResult(
                    rows=np.array([r for r, _ in items], dtype=np.int64),
                    scores=np.array([s for _, s in items], dtype=np.float32),
                    stats=SearchStats(visited=visited[i], recomputed=recomputed[i], cache_hits=hits[i]),
                )
            )
        return out

    def stop_margin(self, config: SearchConfig | None = None) -> float | None:
        """The stop margin that reaches ``config.recall`` on this generation's calibration
        (`SlimArtifacts.stop_table`): the smallest tabulated margin whose calibrated recall@10
        is at least the target, or that reaches the table's best recall if none does. None when the depth is fixed:
        ``recall=0``, ``early_stop=False``, or a generation built before the calibration."""
        cfg = config or self.search_config
        table = self.art.stop_table
        if not cfg.recall or not cfg.early_stop or not table:
            return None
        # A target above what the calibration reached asks for its best: the smallest margin that
        # reaches the table's highest recall, not the largest margin (which reranks the whole pool:
        # median 128 rows at 300k with overlap 1, for nothing the calibration could see).
        target = min(cfg.recall, max(recall for _m, recall, _r in table))
        return next(margin for margin, recall, _rows in table if recall >= target)

    def _done(self, pool: tuple[np.ndarray, np.ndarray], exact: dict[int, float], pos: int, limit: int, k: int,
              early_stop: bool, bound: float, floor: int) -> bool:
        """True when the query needs no more waves: the rerank depth is used up, or (early stop)
        the next row still to recompute cannot beat the k-th exact score even with a bound added:
        ``pq_error`` within the first ``floor`` positions, ``bound`` (the calibrated margin of
        the adaptive depth) past them. The pool is sorted by PQ score, so that row's bound covers
        all later rows. The floor keeps the adaptive depth at least the fixed one: the margin is
        calibrated on passages used as queries, and short questions sit farther from every
        passage (real MiniLM questions: recall@10 0.88 with the margin alone, test_slim_index)."""
        rows, pq_scores = pool
        while pos < limit and int(rows[pos]) in exact:  # already scored for free (cache)
            pos += 1
        if pos >= limit:
            return True
        if not early_stop or len(exact) < k:
            return False
        kth = sorted(exact.values(), reverse=True)[k - 1]
        return float(pq_scores[pos]) + (self.art.pq_error if pos < floor else bound) < kth

    def _recompute(self, rows: np.ndarray) -> np.ndarray:
        vecs = np.asarray(self.recompute(rows), dtype=np.float32)
        if vecs.shape != (len(rows), self.art.dim):
            raise ValueError(
                f"recompute returned shape {vecs.shape} for {len(rows)} rows; expected ({len(rows)}, {self.art.dim})"
            )
        return vecs


def wave_ends(pool: int, k: int, floor: int, wave: int) -> list[int]:
    """Pool positions where the rerank waves of an early-stopping query end (`SlimSearcher._rerank`
    walks them; `build.calibrate_stop` simulates a stop at each): ``k``, then every ``wave``
    more, with one wave cut short to end at ``floor`` (so the fixed depth is a wave boundary);
    the last is the pool's end."""
    ends, pos = [], min(k, pool)
    while pos < pool:
        ends.append(pos)
        nxt = pos + wave
        pos = min(nxt, floor) if pos < floor else nxt
    return [*ends, pool]
