"""The slim index: graph + PQ codes, no embeddings; two-level search: PQ-guided graph walk, then exact rerank of a few recomputed embeddings.

The slim index keeps no full embeddings: a pruned graph (``graph.py``), PQ codes (``pq.py``),
the fp16 vectors of a few hub nodes and the ids of an entry layer. A query is answered in two
levels (after LEANN and DiskANN):

1. **Entry.** The ``entries`` best hubs by exact (fp16) inner product, plus the ``entries`` best rows
   of the *entry layer* (a seeded random sample of ~n/16 rows, scored by PQ in one gather) seed the
   walk. The entry layer is a flat stand-in for HNSW's upper layers: on clustered data a walk that
   starts in the wrong cluster stays there (recall@10 0.70 with 16 entry points, 1.00 with 312, on
   the 5k synthetic set); it costs 2 bytes per entry and ~n/16 table lookups per query.
2. **Approximate level.** Best-first beam search over the graph (HNSW's search-layer loop): pop the
   best unexpanded node, score its unvisited neighbours by normalized PQ asymmetric distance (one
   table gather per batch, see ``pq.py``), keep the best ``ef``, stop when the best unexpanded
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

Build knobs (``SlimConfig``, written into the manifest; graph knobs in ``GraphConfig``)
----------------------------------------------------------------------------------------
- ``pq`` (default ``PQConfig()``: m and bits chosen from n, rule in ``pq.py``): the one knob
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
  variant recomputes 23-24. Set ``PQConfig(m=..., bits=...)`` explicitly to opt out. From
  ~300k rows (where its ``2 d^2`` bytes cost <= 1 B/vector) the rule also learns an OPQ rotation
  (``pq.train_rotation``): same code bytes, and at 1M stand-in vectors the default recall target
  (0.96) then costs a median of 32 recomputed rows instead of 72 (docs/benchmarks.md, "Slim recall
  target").
- ``error_quantile`` (default 0.999): quantile behind ``pq_error``; 0.99 stops ~7% sooner at k=10.
- ``hubs`` (default 0 = auto: ``n // 512``, at least ``min(n, 8)``, at most 4096): hub vectors kept
  in fp16, ``2 d`` bytes each (768 for d=384: ~1.5 bytes per vector at the auto rule).
- ``entry_points`` (default 0 = auto: ``n // 16``, at least ``min(n, 64)``, at most 8192): size of
  the entry layer; 2 bytes each on disk.
- ``entries`` (default 4): seeds taken from the hubs and, again, from the entry layer.
- ``cache_bytes`` (default 16 MiB): budget of the LRU of recomputed float32 vectors (``4 d`` bytes
  each: 16 MiB holds ~10,900 MiniLM vectors). 0 disables it. Memory only, never on disk: read
  when the index is opened, not per query. One cache per generation per process, shared by every
  open handle of it (`vcache.shared`): the server's threads, and a handle reopened after an ``add``.

Query knobs (``slimrag.config.SearchConfig``, per query: ``Index.search(..., config=...)``)
------------------------------------------------------------------------------------------
Manifests written before these moved out of ``SlimConfig`` still carry them; they are ignored.

- ``ef`` (default 128): beam width, the pool rerank draws from. Recall@10 at rerank 24 on 6,000
  MiniLM vectors: 0.955 at ef=64, 0.971 at 128, 0.977 at 192; at 3,000 (table below) ef barely
  matters. Each step costs ~2-10 ms of Python per query (~600 nodes scored at 128), noise next to
  the recomputation. Must be >= ``rerank``.
- ``rerank`` (default 20, was 24): positions eligible for exact rerank: *the* latency knob, since
  every position is one passage re-embedded. 20 is the smallest depth with recall@10 >= 0.95 on
  the 3,000-passage pydocs set; 43k-row indexes may want 24-32 (0.966 at 24 there, see ``pq``).
- ``wave`` (default 4): positions per extra wave. 2 saves ~1% more recomputation than 4, at twice
  the ``recompute`` calls; 8 stops later.
- ``early_stop`` (default True): the wave-wise stop above. False reranks exactly ``rerank`` rows.
  At k=10 it saves ~1% (a top-10 is a flat stretch of near-equal scores); at k=3-5 a third.
- ``recall`` (default 0.96): a recall@10 target that makes the rerank depth adapt to the index's
  size and to each query. The build searches 512 of its own rows as queries and stores, for a grid
  of PQ-score margins, the recall and median rows each gives (``stop_table`` in ``slim.json``).
  Past the fixed ``rerank`` floor, reranking continues into the ``ef`` pool until the next row's
  PQ score plus the margin for the target falls below the k-th exact score. At a fixed depth
  recall falls as N grows (100k synthetic, rerank 20: 0.978); with the target it holds (0.993 at
  100k, 0.986 at 300k, 22 median rows both; docs/benchmarks.md "Slim at scale"). 0 keeps the
  fixed depth.

Latency frontier (issue 10: slim median <= 3x flat at recall@10 >= 0.95, 3,000 passages).
Measured on the first 3,000 pydocs paragraphs (real MiniLM, 4-bit m=96, 1,000 self-queries,
``python -m bench.slim_sweep --vectors ... --knobs``; disfl_qa's 1,204 contexts in brackets):

      rerank   recall@10 ef=48   ef=64   ef=128        rows recomputed per query
      12                 0.877   0.879   0.880 [0.864] 12.0
      16                 0.933   0.934   0.937 [0.935] 15.9
      18                 0.948   0.949   0.953         17.9
      20                 0.957   0.959   0.962 [0.965] 19.8
      24                 0.969   0.971   0.974 [0.979] 23.6

Recall is set by the PQ ranking, not the walk, so the rows to recompute for 0.95 are ~18-20 at
any ef. Each is a passage re-embedded; a flat query embeds one short question. From query text,
cold vector cache (``python -m bench.index --corpus pydocs --limit 3000 --systems flat,slim``,
20 queries, load average ~10 on 2 cores): flat p50 365 ms, slim (ef 64, rerank 20) 6,974 ms
(19x, recall@10 0.960), slim (128, 24) 5,316 ms (15x, load noise; 0.985). **3x is out of reach
with a cold cache**: it would allow ~2 recomputed passages per query, where 0.95 needs ~18. What
does reach it is the vector cache (default 16 MiB, ~10,900 MiniLM vectors: a 3,000-passage corpus
fits): once earlier queries have recomputed a row, later ones score it for free. Defaults
(ef 128, rerank 20), from query text, 20 timed queries after ``w`` other queries warmed the cache
(``python -m bench.slim_sweep --latency 3000``; flat p50 112 ms in the same run):

      warm-up queries  rows cached  slim p50   x flat  rows recomputed  recall@10
      0                  360        3,010 ms   26.9    18.0             0.955
      300              2,439          545 ms    4.9     3.5             0.985
      900              2,901          144 ms    1.3     0.3             1.000

So <= 3x holds only for a long-lived index (a server) whose cache has come to hold most of the
corpus, i.e. once slim's memory approaches flat's (its disk stays at ~76 B/vec against 1,536);
a one-shot command always pays the cold row. The cache is the right lever for ``serve``.

Incremental updates (``update.py``: `update_slim`, `UpdateConfig`; edits in ``edit.py``)
----------------------------------------------------------------------------------------
Compaction of a slim generation inserts the delta rows into the graph (PQ walk, robust prune,
reverse edges), repairs the edges of deleted rows (FreshDiskANN's consolidation), and keeps the
PQ codebooks unless the new rows' quantization error has drifted (ratio over the build's held-out
error > 1.1 plus 3 standard errors). Measured with ``python -m bench.compaction --data pydocs`` (3,000 real MiniLM
vectors; a full rebuild re-embeds every old row, modelled at 389 ms/row, MiniLM measured here on
the corpus's texts under a load average of ~10 on 2 cores):

      added   incremental: rows re-embedded, s      full rebuild: rows, s          ratio
      1%      29, 11.8 (0.5 s compute)              2,970, 1,164 (8.8 s compute)   0.010
      10%      0,  5.8 (5.8 s compute)              2,727, 1,071 (10.3 s compute)  0.005

Recall@10 (default query knobs) after 5 rounds of +2% / -2% / compact, against a fresh build of
the same live rows: 0.9620 vs 0.9627 on pydocs; recomputing 2-8 pool rows per new row gives
0.9637-0.9640. Drift ratios (20% new rows): 0.999 for more pydocs paragraphs; 1.54-1.60 with half
of them from disfl_qa or synthetic vectors, 2.08-2.22 with all (recall with the kept codebooks
0.009-0.07 below retrained ones); on disfl_qa, 0.995 for more contexts and 1.15-1.24 with all rows
from pydocs or synthetic (0.016-0.022 below), hence the threshold 1.1 (``update.py``).

Bytes on disk per vector at the defaults (d=384, n < 65,536): 48 (codes, either width) + ~2 x 10.5
(edges) + 4 (indptr) + ~1.5 (hubs) + 0.125 (entry ids) ~ 75; plus the fp16 codebooks, 12 KB at 4
bits (10 B/vec at 1,204 rows) or 197 KB at 8 bits (at most 6 B/vec, by the rule): 75-88 B/vec
measured. From 65,536 rows on, edges take 4 bytes: ~96 + codebooks, at the budget's edge (not
measured there); ``GraphConfig(base_degree=8)`` saves ~5.

Thread-safety: one ``SlimSearcher`` may be searched from several threads at once: each thread
walks with its own visited stamps (4 bytes a row, made at its first search) and the recomputed
rows' cache locks itself. ``SlimArtifacts`` is read-only and may be shared.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slimrag.index.store.slim.artifacts import SlimArtifacts, slim_bytes
    from slimrag.index.store.slim.build import build_slim, calibrate_pq_error
    from slimrag.index.store.slim.config import GraphConfig, SlimConfig
    from slimrag.index.store.slim.graph import Graph, build_graph
    from slimrag.index.store.slim.pq import PQConfig, ProductQuantizer, train_pq
    from slimrag.index.store.slim.searcher import SearchStats, SlimSearcher, WalkResult
    from slimrag.index.store.slim.store import SlimVectors
    from slimrag.index.store.slim.update import SlimUpdate, UpdateConfig, UpdateStats, update_slim
    from slimrag.index.store.slim.vcache import VectorCache

#: each public name's module: imported on first use (PEP 562), so opening a flat index, whose
#: manifest names a `SlimConfig`, does not import the graph builder, the searcher and the updater
_HOMES = {
    "SlimArtifacts": "artifacts", "slim_bytes": "artifacts", "build_slim": "build", "calibrate_pq_error": "build",
    "GraphConfig": "config", "SlimConfig": "config", "Graph": "graph", "build_graph": "graph",
    "PQConfig": "pq", "ProductQuantizer": "pq", "train_pq": "pq", "SearchStats": "searcher",
    "SlimSearcher": "searcher", "WalkResult": "searcher", "SlimVectors": "store", "SlimUpdate": "update",
    "UpdateConfig": "update", "UpdateStats": "update", "update_slim": "update", "VectorCache": "vcache",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


__all__ = [
    "Graph", "GraphConfig", "PQConfig", "ProductQuantizer", "WalkResult", "SearchStats",
    "SlimArtifacts", "SlimConfig", "SlimSearcher", "SlimUpdate", "SlimVectors", "UpdateConfig", "UpdateStats",
    "VectorCache", "build_graph", "build_slim", "calibrate_pq_error", "slim_bytes", "train_pq", "update_slim",
]
