"""Two-level slim search: PQ-guided graph walk, then exact rerank of a few recomputed embeddings.

The slim index keeps no full embeddings: a pruned graph (``graph.py``), PQ codes (``codes.py``),
the fp16 vectors of a few hub nodes and the ids of an entry layer. A query is answered in two
levels (after LEANN and DiskANN):

1. **Entry.** The ``entries`` best hubs by exact (fp16) inner product, plus the ``entries`` best rows
   of the *entry layer* (a seeded random sample of ~n/16 rows, scored by PQ in one gather) seed the
   walk. The entry layer is a flat stand-in for HNSW's upper layers: on clustered data a walk that
   starts in the wrong cluster stays there (recall@10 0.70 with 16 entry points, 1.00 with 312, on
   the 5k synthetic set); it costs 2 bytes per entry and ~n/16 table lookups per query.
2. **Approximate level.** Best-first beam search over the graph (HNSW's search-layer loop): pop the
   best unexpanded node, score its unvisited neighbours by normalized PQ asymmetric distance (one
   table gather per batch, see ``codes.py``), keep the best ``ef``, stop when the best unexpanded
   node is worse than the ``ef``-th kept. Tombstoned rows are walked through (they still connect
   the graph) but never kept.
3. **Exact level.** The kept rows, in PQ order, are re-scored exactly with embeddings recomputed by
   the caller's ``recompute(rows) -> (len(rows), d) float32`` (in production: re-embed the chunk
   texts, one batch per call). The first ``max(rerank, k)`` positions are eligible; rows in the LRU
   cache of recomputed vectors are scored for free wherever they rank, so a query never
   recomputes more than ``max(rerank, k)`` rows. Results carry exact scores.

Early termination (``early_stop=True``)
----------------------------------------
Recomputation dominates latency (~30 ms per passage on a laptop CPU), so rerank goes in waves: the
first wave covers ``k`` positions, later waves ``wave``; all queries of a batch share one
``recompute`` call per wave. After each wave, with ``s_k`` the k-th best exact score so far and ``p``
the PQ estimate of the next row still to recompute (the list is sorted by estimate, so ``p`` bounds
all later rows), the query stops when ``p + pq_error < s_k``. ``pq_error`` is an *empirical* bound
measured at build time: the ``error_quantile`` quantile of ``exact - estimate`` over pairs of a
sample vector and its 32 exact nearest neighbours, the pairs that decide a top-k (0.07 for m=64 on
MiniLM vectors). A sound bound exists, the residual norm ``||x - x̂||`` by Cauchy-Schwarz, but it is
~5x larger and would never stop early; with the quantile a row that belongs in the top-k is cut
with probability about ``1 - error_quantile``. Measured on 6,000 real MiniLM vectors (rerank 24):
k=3 recomputes 13.6 rows instead of 24 at the same recall@3 (0.987), k=5 18.5 instead of 24
(0.986); k=10 saves little (23.5), its top-10 being a flat stretch of near-equal scores.

Knobs (``SlimConfig``; build knobs are in ``GraphConfig`` and ``PQConfig``)
----------------------------------------------------------------------------
- ``pq`` (default ``PQConfig()``: m and bits chosen from n, rule in ``codes.py``): the one knob
  that moves bytes and recall together. The rule keeps the whole index, codebooks included, under
  100 bytes per vector and under LEANN's compact index (119.0 B/vec at 1,204 rows, 105.8 at 2,000,
  same vectors): 4-bit m=96 below 32,768 rows, 8-bit m=48 from there. Measured with
  ``python -m bench.index --systems flat,slim`` (MiniLM, d=384, ef 128, rerank 24; B/vec = every
  file / n; recall against exact search over 1,000 queries; * = what the rule picks):

      n                    PQ                      B/vec  recall@10  recall@3
      1,204  (disfl_qa)    8-bit m=64              256.8  0.997      1.000
                         * 4-bit m=96               87.7  0.979      0.999
      2,000  (pydocs)      8-bit m=64              186.7  0.997      1.000
                         * 4-bit m=96               78.5  0.982      0.999
      43,402 (pydocs)      8-bit m=64               95.1  0.983      0.999
                         * 8-bit m=48               79.1  0.966      0.997
                           4-bit m=96               74.9  0.959      0.997
                           4-bit m=96, rerank 32    74.9  0.977      0.999

  8-bit m=64, the default before the rule, is 1.9-2.6x over budget on small corpora (its 197 KB of
  codebooks) and, at 43k, over LEANN's likely size (not measured there; ~87 B/vec extrapolated).
  4-bit codes have a larger error bound (``pq_error`` 0.13 at 1-2k rows, against 0.06 for 8-bit
  m=64), so early stop fires less and queries recompute ~23 rows instead of ~20; at 43k every
  variant recomputes 23-24. Not measured above 43,402 rows or for other dimensions; set
  ``PQConfig(m=..., bits=...)`` explicitly to opt out.
- ``ef`` (default 128): beam width, the pool rerank draws from. Recall@10 at rerank 24 on the real
  set: 0.955 at ef=64, 0.971 at 128, 0.977 at 192; each step costs ~2 ms of Python per query
  (~800 nodes scored at 128). Must be >= ``rerank``.
- ``rerank`` (default 24): positions eligible for exact rerank: the latency knob. Recall@10 on the
  real set: 0.930 at 16, 0.958 at 20, 0.971 at 24, 0.981 at 32.
- ``wave`` (default 4): positions per extra wave. 2 saves ~1% more recomputation than 4, at twice
  the ``recompute`` calls; 8 stops later.
- ``early_stop`` (default True): the wave-wise stop above. False reranks exactly ``rerank`` rows.
- ``error_quantile`` (default 0.999): quantile behind ``pq_error``; 0.99 stops ~7% sooner at k=10.
- ``hubs`` (default 0 = auto: ``n // 512``, at least ``min(n, 8)``, at most 4096): hub vectors kept
  in fp16, ``2 d`` bytes each (768 for d=384: ~1.5 bytes per vector at the auto rule).
- ``entry_points`` (default 0 = auto: ``n // 16``, at least ``min(n, 64)``, at most 8192): size of
  the entry layer; 2 bytes each on disk.
- ``entries`` (default 4): seeds taken from the hubs and, again, from the entry layer.
- ``cache_bytes`` (default 16 MiB): budget of the LRU of recomputed float32 vectors (``4 d`` bytes
  each: 16 MiB holds ~10,900 MiniLM vectors). 0 disables it. Memory only, never on disk.

Bytes on disk per vector at the defaults (d=384, n < 65,536): 48 (codes, either width) + ~2 x 10.5
(edges) + 4 (indptr) + ~1.5 (hubs) + 0.125 (entry ids) ~ 75; plus the fp16 codebooks, 12 KB at 4
bits (10 B/vec at 1,204 rows) or 197 KB at 8 bits (at most 6 B/vec, by the rule): 75-88 B/vec
measured. From 65,536 rows on, edges take 4 bytes: ~96 + codebooks, at the budget's edge (not
measured there); ``GraphConfig(base_degree=8)`` saves ~5.

Thread-safety: ``SlimSearcher`` keeps a visited-stamp array and the cache, so one instance must
not be used by two threads at once (wrap it in a lock or make one per thread). ``SlimArtifacts``
is read-only and may be shared.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from slimrag.errors import IndexFormatError
from slimrag.index.codes import (
    CODEBOOKS_FILE,
    CODES_FILE,
    ADCScorer,
    PQConfig,
    ProductQuantizer,
    load_pq,
    save_pq,
    train_pq,
)
from slimrag.index.graph import (
    INDICES_FILE,
    INDPTR_FILE,
    Graph,
    GraphConfig,
    build_graph,
    pick_hubs,
    top_k_columns,
)
from slimrag.index.vcache import VectorCache

HUB_ROWS_FILE = "hub_rows.npy"
HUB_VECTORS_FILE = "hub_vectors.npy"
ENTRY_ROWS_FILE = "entry_rows.npy"
META_FILE = "slim.json"
FORMAT_VERSION = 1
SLIM_FILES = (
    INDPTR_FILE, INDICES_FILE, CODEBOOKS_FILE, CODES_FILE, HUB_ROWS_FILE, HUB_VECTORS_FILE, ENTRY_ROWS_FILE, META_FILE,
)

Recompute = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True, slots=True)
class SlimConfig:
    """Every knob of the slim index; see the module header (and graph.py, codes.py) for trade-offs."""

    graph: GraphConfig = field(default_factory=GraphConfig)
    pq: PQConfig = field(default_factory=PQConfig)
    hubs: int = 0
    entry_points: int = 0
    entries: int = 4
    ef: int = 128
    rerank: int = 24
    wave: int = 4
    early_stop: bool = True
    error_quantile: float = 0.999
    cache_bytes: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.hubs < 0 or self.entry_points < 0:
            raise ValueError(
                f"hubs and entry_points must be >= 0 (0 = automatic), got {self.hubs}, {self.entry_points}"
            )
        if self.entries < 1:
            raise ValueError(f"entries must be >= 1, got {self.entries}")
        if self.rerank < 1 or self.wave < 1:
            raise ValueError(f"rerank and wave must be >= 1, got rerank={self.rerank}, wave={self.wave}")
        if self.ef < self.rerank:
            raise ValueError(f"ef ({self.ef}) must be >= rerank ({self.rerank}): rerank draws from the beam")
        if not 0.5 <= self.error_quantile <= 1.0:
            raise ValueError(f"error_quantile must be in [0.5, 1], got {self.error_quantile}")
        if self.cache_bytes < 0:
            raise ValueError(f"cache_bytes must be >= 0, got {self.cache_bytes}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (for a manifest)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SlimConfig:
        """Inverse of :meth:`to_dict`; unknown keys raise TypeError rather than being dropped."""
        data = dict(data)
        graph = GraphConfig(**data.pop("graph", {}))
        pq = PQConfig(**data.pop("pq", {}))
        return cls(graph=graph, pq=pq, **data)

    def hub_count(self, n: int) -> int:
        """Hubs kept for ``n`` rows (resolves ``hubs=0``)."""
        if self.hubs:
            return min(self.hubs, n)
        return min(n, 4096, max(8, n // 512))

    def entry_count(self, n: int) -> int:
        """Entry-layer rows for ``n`` rows (resolves ``entry_points=0``)."""
        if self.entry_points:
            return min(self.entry_points, n)
        return min(n, 8192, max(64, n // 16))


@dataclass(frozen=True, slots=True)
class SlimArtifacts:
    """What one generation of a slim index stores: graph, PQ, codes, hubs and the PQ error bound."""

    graph: Graph
    pq: ProductQuantizer
    codes: np.ndarray
    hub_rows: np.ndarray
    hub_vectors: np.ndarray
    entry_rows: np.ndarray
    pq_error: float

    @property
    def n(self) -> int:
        """Number of rows."""
        return self.graph.n

    @property
    def dim(self) -> int:
        """Embedding dimension."""
        return self.pq.dim

    def save(self, folder: str | Path) -> None:
        """Write every artifact into ``folder`` (created if missing). The caller fsyncs and renames
        the folder into place; nothing here touches other files."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.graph.save(folder)
        save_pq(folder, self.pq, self.codes)
        np.save(folder / HUB_ROWS_FILE, self.hub_rows.astype(self.graph.indices.dtype))
        np.save(folder / HUB_VECTORS_FILE, self.hub_vectors.astype(np.float16))
        np.save(folder / ENTRY_ROWS_FILE, self.entry_rows.astype(self.graph.indices.dtype))
        meta = {"format": FORMAT_VERSION, "n": self.n, "dim": self.dim, "bits": self.pq.bits, "pq_error": self.pq_error}
        (folder / META_FILE).write_text(json.dumps(meta, indent=1))

    @classmethod
    def load(cls, folder: str | Path, mmap: bool = True) -> SlimArtifacts:
        """Read what :meth:`save` wrote; large arrays are memory-mapped by default. Raises
        IndexFormatError when a file is missing or corrupt or the format version is unknown."""
        folder = Path(folder)
        try:
            meta = json.loads((folder / META_FILE).read_text())
            if meta.get("format") != FORMAT_VERSION:
                raise IndexFormatError(
                    f"{folder} holds slim format {meta.get('format')!r}, this slimrag reads {FORMAT_VERSION}; rebuild the index"
                )
            pq, codes = load_pq(folder, int(meta["bits"]), mmap=mmap)
            art = cls(
                graph=Graph.load(folder, mmap=mmap),
                pq=pq,
                codes=codes,
                hub_rows=np.load(folder / HUB_ROWS_FILE).astype(np.int64),
                hub_vectors=np.load(folder / HUB_VECTORS_FILE),
                entry_rows=np.load(folder / ENTRY_ROWS_FILE).astype(np.int64),
                pq_error=float(meta["pq_error"]),
            )
        except (OSError, KeyError, ValueError) as exc:  # missing file, truncated .npy, bad JSON
            raise IndexFormatError(f"slim index files in {folder} are missing or corrupt ({exc}); rebuild the index") from exc
        if len(art.codes) != art.n or art.n != meta["n"]:
            raise IndexFormatError(f"{folder}: graph has {art.n} rows, codes {len(art.codes)}, manifest {meta['n']}; rebuild")
        return art


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
    return SlimArtifacts(graph, pq, codes, hub_rows, x[hub_rows].astype(np.float16), entry_rows, pq_error)


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


@dataclass(frozen=True, slots=True)
class SearchStats:
    """What one query cost: graph nodes scored by PQ, rows recomputed, rerank rows served by the cache."""

    visited: int
    recomputed: int
    cache_hits: int


@dataclass(frozen=True, slots=True)
class SearchResult:
    """Top rows by exact inner product, best first: ``rows`` int64, ``scores`` float32."""

    rows: np.ndarray
    scores: np.ndarray
    stats: SearchStats


class SlimSearcher:
    """Searches one :class:`SlimArtifacts` with exact rerank through ``recompute``. Not thread-safe
    (visited stamps and cache are per instance); see the module header."""

    def __init__(self, artifacts: SlimArtifacts, recompute: Recompute, config: SlimConfig | None = None) -> None:
        self.art = artifacts
        self.recompute = recompute
        self.config = config or SlimConfig()
        self.cache = VectorCache(self.config.cache_bytes, artifacts.dim)
        self._indptr = np.asarray(artifacts.graph.indptr, dtype=np.int64)
        self._indices = np.asarray(artifacts.graph.indices)
        self._hubs = np.asarray(artifacts.hub_vectors, dtype=np.float32)
        self._codes = artifacts.pq.unpack(np.asarray(artifacts.codes))
        self._scale = artifacts.pq.inverse_norms(self._codes)
        self._stamp = np.zeros(artifacts.n, dtype=np.uint32)
        self._epoch = 0

    def search(self, query: np.ndarray, k: int = 10, skip: np.ndarray | Iterable[int] | None = None) -> SearchResult:
        """Top-``k`` rows for one unit-norm query vector (d,)."""
        return self.search_batch(np.asarray(query, dtype=np.float32)[None, :], k, skip)[0]

    def search_batch(
        self, queries: np.ndarray, k: int = 10, skip: np.ndarray | Iterable[int] | None = None
    ) -> list[SearchResult]:
        """Top-``k`` rows for each of ``queries`` (nq, d). ``skip``: a bool mask of length n or row
        ids that must never be returned (tombstones). Each rerank wave is one ``recompute`` call
        for the whole batch, rows shared by several queries computed once."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        q = np.asarray(queries, dtype=np.float32)
        if q.ndim != 2 or q.shape[1] != self.art.dim:
            raise ValueError(f"queries must be (nq, {self.art.dim}), got shape {q.shape}")
        mask = self._skip_mask(skip)
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
            rows, pq_scores, seen = self._beam(scorer, seeds, mask)
            pools.append((rows, pq_scores))
            visited.append(seen)
        return self._rerank(q, pools, visited, k)

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

    def _beam(self, scorer: ADCScorer, seeds: np.ndarray, skip: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """Best-first search by PQ score; returns the beam's non-skipped rows sorted by PQ score
        (descending), their scores, and the number of nodes scored."""
        ef = self.config.ef
        self._epoch += 1
        if self._epoch == 2**32 - 1:  # wrap-around: stamps from long ago could alias
            self._stamp[:] = 0
            self._epoch = 1
        stamp, epoch, indptr, indices = self._stamp, self._epoch, self._indptr, self._indices
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
        self, q: np.ndarray, pools: list[tuple[np.ndarray, np.ndarray]], visited: list[int], k: int
    ) -> list[SearchResult]:
        """Exact level. Each query's pool is walked in PQ order up to ``max(rerank, k)``
        positions, in waves; one ``recompute`` call per wave serves the whole batch."""
        cfg = self.config
        nq = len(q)
        limit = [min(len(rows), max(cfg.rerank, k)) for rows, _ in pools]
        exact: list[dict[int, float]] = [{} for _ in range(nq)]
        pos = [0] * nq
        recomputed = [0] * nq
        hits = [0] * nq
        # Free exact scores for every pooled row already in the cache, wherever it ranks.
        for i, (rows, _) in enumerate(pools):
            for r in rows.tolist():
                if r in self.cache:
                    exact[i][r] = float(self.cache.get(r) @ q[i])
                    hits[i] += 1
        first = True
        active = [i for i in range(nq) if not self._done(pools[i], exact[i], pos[i], limit[i], k)]
        while active:
            want: dict[int, list[int]] = {}
            for i in active:
                step = (k if cfg.early_stop else limit[i]) if first else cfg.wave
                end = min(limit[i], pos[i] + step)
                take = []
                for r in pools[i][0][pos[i] : end].tolist():
                    if r in exact[i]:
                        continue
                    if r in self.cache:  # recomputed by an earlier wave or another query of the batch
                        exact[i][r] = float(self.cache.get(r) @ q[i])
                        hits[i] += 1
                    else:
                        take.append(r)
                pos[i] = end
                want[i] = take
            first = False
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
            active = [i for i in active if not self._done(pools[i], exact[i], pos[i], limit[i], k)]
        out = []
        for i in range(nq):
            items = sorted(exact[i].items(), key=lambda kv: (-kv[1], kv[0]))[:k]
            out.append(
                SearchResult(
                    rows=np.array([r for r, _ in items], dtype=np.int64),
                    scores=np.array([s for _, s in items], dtype=np.float32),
                    stats=SearchStats(visited=visited[i], recomputed=recomputed[i], cache_hits=hits[i]),
                )
            )
        return out

    def _done(self, pool: tuple[np.ndarray, np.ndarray], exact: dict[int, float], pos: int, limit: int, k: int) -> bool:
        """True when the query needs no more waves: the rerank depth is used up, or (early stop)
        the next row still to recompute cannot beat the k-th exact score even with ``pq_error``
        added. The pool is sorted by PQ score, so that row's bound covers all later rows."""
        rows, pq_scores = pool
        while pos < limit and int(rows[pos]) in exact:  # already scored for free (cache)
            pos += 1
        if pos >= limit:
            return True
        if not self.config.early_stop or len(exact) < k:
            return False
        kth = sorted(exact.values(), reverse=True)[k - 1]
        return float(pq_scores[pos]) + self.art.pq_error < kth

    def _recompute(self, rows: np.ndarray) -> np.ndarray:
        vecs = np.asarray(self.recompute(rows), dtype=np.float32)
        if vecs.shape != (len(rows), self.art.dim):
            raise ValueError(
                f"recompute returned shape {vecs.shape} for {len(rows)} rows; expected ({len(rows)}, {self.art.dim})"
            )
        return vecs


def slim_bytes(folder: str | Path) -> dict[str, float]:
    """Bytes on disk of a saved slim generation: per file, ``per_vector`` (graph + codes + hubs,
    the part that grows with n, divided by n), ``fixed`` (codebooks and metadata, independent of n)
    and ``total_per_vector`` (everything divided by n)."""
    folder = Path(folder)
    sizes = {name: (folder / name).stat().st_size for name in SLIM_FILES}
    n = json.loads((folder / META_FILE).read_text())["n"]
    fixed = sizes[CODEBOOKS_FILE] + sizes[META_FILE]
    scaling = sum(sizes.values()) - fixed
    return {**sizes, "n": n, "per_vector": scaling / n, "fixed": fixed, "total_per_vector": (scaling + fixed) / n}
