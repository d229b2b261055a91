"""The read path of an `Index`: vector, keyword and hybrid search.

- **vector**: embed the query, then the index's vector store answers (`FlatVectors`: exact;
  `SlimVectors`: graph walk + exact rerank of recomputed embeddings, plus the exact delta rows).
  Removed chunks are masked by the store's liveness mask until `compact` drops them.
- **keyword**: SQLite FTS5 BM25 over chunk text (`Catalog.keyword_search`).
- **hybrid**: both lists, ``SearchConfig.candidates`` (default 50) long each, fused by reciprocal
  rank fusion (`rrf`, constant ``SearchConfig.rrf_k``, default 60), cut to ``k``.

The default mode is ``SearchConfig.mode`` (hybrid, chosen by `bench.retrieval`; see
docs/benchmarks.md), the one default `RAG`, the CLI and the HTTP server read too.

A ``source`` glob (``docs/*.md``) filters every mode *inside* the search, before the top-k cut, so
``k`` hits come back whenever ``k`` matching chunks exist: the vector stores take it as a row mask
(flat: masked rows score -inf before the partial sort; slim: masked rows are walked through but
never kept, and a filter leaving few graph rows scores them exactly), and the keyword search puts
it in the SQL ``WHERE`` before ``LIMIT``. A `SearchConfig` given per call sets ``k``, the mode,
the fusion knobs and the slim index's walk and rerank knobs (ef, rerank, wave, early_stop) for
that query alone.

Why a mixin: see `slimrag.index.writer`; the attributes of `Index` it reads are declared below.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from slimrag.config import SearchConfig
from slimrag.types import Hit

if TYPE_CHECKING:
    from slimrag.catalog import Catalog
    from slimrag.embed.base import Embedder
    from slimrag.index.flat import FlatVectors
    from slimrag.index.slim.store import SlimVectors


class IndexQuery:
    """The search methods of `Index` (see the module header). One `Index` per thread."""

    # Set by `Index.__init__`; declared here so this file type-checks on its own.
    catalog: Catalog
    embedder: Embedder
    vectors: FlatVectors | SlimVectors

    def search(self, query: str, k: int = 5, mode: str | None = None, source: str | None = None,
               config: SearchConfig | None = None) -> list[Hit]:
        """Top-k chunks for ``query``, best first.

        mode: "vector", "keyword" or "hybrid" (reciprocal rank fusion); None means ``config``'s
        mode, else `SearchConfig`'s default (hybrid). An explicit mode wins over ``config``'s.
        source: optional glob on the stored source path (``docs/*.md``), applied before the top-k
        cut. config: per-query knobs; when given, its ``k`` is used instead of ``k``."""
        cfg = config or SearchConfig(k=k)
        if mode is not None and mode != cfg.mode:
            cfg = replace(cfg, mode=mode)  # validated again: an unknown mode raises ValueError
        if cfg.mode == "keyword":
            ranked = self.catalog.keyword_search(query, cfg.k, source)
        elif cfg.mode == "vector":
            ranked = self._vectors([query], cfg.k, source, cfg)[0]
        else:
            n = max(cfg.candidates, cfg.k)
            ranked = rrf([self._vectors([query], n, source, cfg)[0], self.catalog.keyword_search(query, n, source)],
                         cfg.rrf_k)[: cfg.k]
        return self._hits(ranked)

    def search_batch(self, queries: Sequence[str], k: int = 5, source: str | None = None,
                     config: SearchConfig | None = None) -> list[list[Hit]]:
        """Vector search for many queries at once: one embedder call, and for a slim index one
        recomputation batch per rerank wave shared by all queries. ``config``, when given, sets
        ``k`` and the slim knobs as in `search`; its mode must be "vector" (ValueError otherwise:
        `SearchConfig`'s default mode is hybrid, so a config built for this call names the mode)."""
        cfg = config or SearchConfig(k=k, mode="vector")
        if cfg.mode != "vector":
            raise ValueError(f"search_batch does vector search only, got mode={cfg.mode!r}; "
                             "call search() per query for keyword or hybrid")
        ranked = self._vectors(list(queries), cfg.k, source, cfg)
        return [self._hits(r) for r in ranked]

    def _vectors(self, queries: list[str], k: int, source: str | None,
                 cfg: SearchConfig) -> list[list[tuple[int, float]]]:
        q = self.embedder.embed(queries)
        allow = None
        if source is not None:
            allow = np.isin(self.vectors.ids, np.asarray(self.catalog.live_ids(source), dtype=np.int64))
        ids, scores = self.vectors.search(q, k, allow, cfg)
        return [[(int(i), float(s)) for i, s in zip(ids[r], scores[r], strict=True)] for r in range(len(queries))]

    def _hits(self, ranked: list[tuple[int, float]]) -> list[Hit]:
        chunks = self.catalog.chunks([i for i, _ in ranked])
        return [Hit(i, s, chunks[i].text, chunks[i].source, chunks[i].metadata) for i, s in ranked if i in chunks]


def rrf(lists: list[list[tuple[int, float]]], k: int = 60) -> list[tuple[int, float]]:
    """Reciprocal rank fusion: score(d) = sum over lists of 1 / (k + rank), rank from 1.
    Ties are broken by chunk id so the fused order is deterministic."""
    scores: dict[int, float] = {}
    for ranked in lists:
        for rank, (cid, _) in enumerate(ranked, 1):
            scores[cid] = scores.get(cid, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
