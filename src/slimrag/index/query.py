"""The read path of an `Index`: vector, keyword and hybrid search.

- **vector**: embed the query, then the index's vector store answers (`FlatVectors`: exact;
  `SlimVectors`: graph walk + exact rerank of recomputed embeddings, plus the exact delta rows).
  Removed chunks are masked by the store's liveness mask until `compact` drops them.
- **keyword**: BM25 over chunk text, FTS5's scores (`Catalog.keyword_search`).
- **hybrid**: both lists, ``SearchConfig.candidates`` (default 50) long each, fused by
  `slimrag.index.fusion.fuse` (score-aware: min-max normalised scores, weighted, and a decisive
  keyword match stays first; the strategies and their measurements are in its header), cut to ``k``.

The default mode is ``SearchConfig.mode`` (hybrid, chosen by `bench.retrieval`; see
docs/benchmarks.md), the one default `RAG`, the CLI and the HTTP server read too.

A ``source`` glob (``docs/*.md``) filters every mode *inside* the search, before the top-k cut, so
``k`` hits come back whenever ``k`` matching chunks exist: the vector stores take it as a row mask
(flat: masked rows score -inf before the partial sort; slim: masked rows are walked through but
never kept, and a filter leaving few graph rows scores them exactly), and the keyword search puts
it in the SQL ``WHERE`` before ``LIMIT``. A `SearchConfig` given per call sets ``k``, the mode,
the fusion knobs and the slim index's walk and rerank knobs (ef, rerank, wave, early_stop) for
that query alone.

A part of `Index` built on its `IndexState` (`slimrag.index.state`): it reads the catalog, the
embedder and the vector store from there and nothing else. Hybrid fusion is one call (`fuse`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from slimrag.config import SearchConfig
from slimrag.errors import RequestError
from slimrag.index.fusion import fuse
from slimrag.types import Hit

if TYPE_CHECKING:
    from slimrag.index.state import IndexState


class IndexQuery:
    """The search methods of `Index` (see the module header). One `Index` per thread."""

    def __init__(self, state: IndexState) -> None:
        self.state = state

    def search(self, query: str, k: int = 5, mode: str | None = None, source: str | None = None,
               config: SearchConfig | None = None) -> list[Hit]:
        """Top-k chunks for ``query``, best first.

        mode: "vector", "keyword" or "hybrid" (both, fused by `slimrag.index.fusion`); None means ``config``'s
        mode, else `SearchConfig`'s default (hybrid). An explicit mode wins over ``config``'s.
        source: optional glob on the stored source path (``docs/*.md``), applied before the top-k
        cut. config: per-query knobs; when given, its ``k`` is used instead of ``k``. An empty or
        white-space query is a `RequestError` (every search would return arbitrary chunks)."""
        _check_query(query)
        cfg = config or SearchConfig(k=k)
        if mode is not None and mode != cfg.mode:
            cfg = replace(cfg, mode=mode)  # validated again: an unknown mode raises ValueError
        catalog = self.state.catalog
        if cfg.mode == "keyword":
            ranked = catalog.keyword_search(query, cfg.k, source)
        elif cfg.mode == "vector":
            ranked = self._vectors([query], cfg.k, source, cfg)[0]
        else:
            n = max(cfg.candidates, cfg.k)
            ranked = fuse(self._vectors([query], n, source, cfg)[0], catalog.keyword_search(query, n, source),
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
        for query in queries:
            _check_query(query)
        ranked = self._vectors(list(queries), cfg.k, source, cfg)
        return [self._hits(r) for r in ranked]

    def _vectors(self, queries: list[str], k: int, source: str | None,
                 cfg: SearchConfig) -> list[list[tuple[int, float]]]:
        st = self.state
        q = st.embedder.embed(queries)
        store = st.vectors
        allow = None
        if source is not None:
            allow = np.isin(store.ids, np.asarray(st.catalog.live_ids(source), dtype=np.int64))
        ids, scores = store.search(q, k, allow, cfg)
        return [[(int(i), float(s)) for i, s in zip(ids[r], scores[r], strict=True)] for r in range(len(queries))]

    def _hits(self, ranked: list[tuple[int, float]]) -> list[Hit]:
        chunks = self.state.catalog.chunks([i for i, _ in ranked])
        return [Hit(i, s, chunks[i].text, chunks[i].source, chunks[i].metadata) for i, s in ranked if i in chunks]


def _check_query(query: str) -> None:
    if not query.strip():
        raise RequestError("the query is empty or white space only; give some words to search for")
