"""The read path of an `Index`: vector, keyword and hybrid search.

- **vector**: embed the query, then the index's vector store answers (`FlatVectors`: exact;
  `SlimVectors`: graph walk + exact rerank of recomputed embeddings, plus the exact delta rows).
  Removed chunks are masked by the store's liveness mask until `compact` drops them.
- **keyword**: BM25 over chunk text, FTS5's scores (`Catalog.keyword_search`).
- **hybrid**: both lists, ``SearchConfig.candidates`` (default 50) long each, fused by
  `slimrag.index.fusion.fuse` (score-aware: min-max normalised scores, weighted, and a decisive
  keyword match stays first; the strategies and their measurements are in its header), cut to ``k``.

Similarity: every hit carries `Hit.similarity`, the query's cosine with the chunk where the
search computed it: a vector hit's score; in hybrid, the cosine of each fused hit that was among
the vector candidates (filled ones included, below), None for one only the keyword list held (and
for every keyword-mode hit). The result, a `Hits` list, also carries the best cosine of all the
vector candidates (`Hits.similarity`), which the fused cut may have dropped: the relevance floor
(`slimrag.rag.guards`) reads that, so it never searches again. A keyword-only hit's cosine is not
computed: free on a flat store (its row is read), it costs a slim store one chunk embedding per
such hit (its rows are recomputed from text), more than the whole search, and no floor decision
needs it (the share of such questions and the timings: ``bench/floor.py``; docs/benchmarks.md,
"Relevance floor from the hits").

The default mode is ``SearchConfig.mode`` (hybrid, chosen by `bench.retrieval`; see
docs/benchmarks.md), the one default `RAG`, the CLI and the HTTP server read too.

A ``source`` glob (``docs/*.md``) filters every mode *inside* the search, before the top-k cut, so
``k`` hits come back whenever ``k`` matching chunks exist: the vector stores take it as a row mask
(flat: masked rows score -inf before the partial sort; slim: masked rows are walked through but
never kept, and a filter leaving few graph rows scores them exactly), and the keyword search puts
it in the SQL ``WHERE`` before ``LIMIT``. A `SearchConfig` given per call sets ``k``, the mode,
the fusion knobs and the slim index's walk and rerank knobs (ef, rerank, wave, early_stop) for
that query alone.

Chunks awaiting vectors (progressive indexing, `slimrag.index.coverage`): while a build embeds, or
after an interrupted one, some live chunks have no vector row. Vector and hybrid search then use
the vectors that exist, keyword search covers the rest, and the best `FILL` (default 8) keyword
candidates (of ``SearchConfig.candidates``) that await vectors are embedded by the search itself
and scored exactly, as if they had their rows, so the vector list (and the similarity the
relevance floor of `slimrag.rag.guards` reads) sees them. That costs `FILL` chunk embeddings per
query at most (~0.7 s on two CPU cores for MiniLM at 256 tokens; nothing once every chunk has its
vector), and they are kept for later queries of this handle (`FILL_CACHE` vectors, 4,096 by
default, ~6 MB at d=384). Each search records what it covered in `IndexQuery.last_coverage`
(chunks, embedded, filled: `Coverage`), which ``slimrag search --json`` reports.

A part of `Index` built on its `IndexState` (`slimrag.index.state`): it reads the catalog, the
embedder and the vector store from there and nothing else. Hybrid fusion is one call (`fuse`).

Threads: searches from many threads run at once on one `Index` (`slimrag.index.threads`): each
holds the state's ``guard`` shared (a catch-up or a write of the view waits for it), reads its
thread's catalog connection, and records its coverage for its own thread (``last_coverage``); the
fill cache is shared under a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from slimrag.config import SearchConfig
from slimrag.errors import RequestError
from slimrag.index.coverage import Coverage
from slimrag.index.fusion import Ranked, fuse
from slimrag.types import Hit, Hits

if TYPE_CHECKING:
    from slimrag.index.state import IndexState

#: keyword candidates awaiting vectors that one search embeds and scores itself (module header)
FILL = 8
#: vectors of such candidates kept per handle, for later queries
FILL_CACHE = 4096


class IndexQuery:
    """The search methods of `Index` (see the module header), callable from many threads at once."""

    def __init__(self, state: IndexState) -> None:
        self.state = state
        self._mine = threading.local()  # this thread's last coverage
        self._filled: dict[int, np.ndarray] = {}  # chunk id -> vector, for chunks awaiting theirs
        self._filling = threading.Lock()

    @property
    def last_coverage(self) -> Coverage | None:
        """What the calling thread's last `search` covered (None before its first)."""
        return getattr(self._mine, "coverage", None)

    def search(self, query: str, k: int = 5, mode: str | None = None, source: str | None = None,
               config: SearchConfig | None = None) -> Hits:
        """Top-k chunks for ``query``, best first, with the best vector similarity the search saw
        (`Hits.similarity`; module header).

        mode: "vector", "keyword" or "hybrid" (both, fused by `slimrag.index.fusion`); None means ``config``'s
        mode, else `SearchConfig`'s default (hybrid). An explicit mode wins over ``config``'s.
        source: optional glob on the stored source path (``docs/*.md``), applied before the top-k
        cut. config: per-query knobs; when given, its ``k`` is used instead of ``k``. An empty or
        white-space query is a `RequestError` (every search would return arbitrary chunks)."""
        _check_query(query)
        cfg = config or SearchConfig(k=k)
        if mode is not None and mode != cfg.mode:
            cfg = replace(cfg, mode=mode)  # validated again: an unknown mode raises ValueError
        q = None if cfg.mode == "keyword" else self.state.embedder.embed([query])  # before the hold
        with self.state.guard.reading():
            ranked, vector, cov = self._search(query, q, cfg, source)
        self._mine.coverage = cov
        return self._hits(ranked, dict(vector))

    def _search(self, query: str, q: np.ndarray | None, cfg: SearchConfig,
                source: str | None) -> tuple[Ranked, Ranked, Coverage]:
        """(the ranked result, the vector candidates with their cosines, coverage). The vector
        candidates (filled ones included) are what `Hit.similarity` is read from; none in keyword mode."""
        catalog = self.state.catalog
        cov = self.state.coverage()
        if q is None:
            return catalog.keyword_search(query, cfg.k, source), [], cov
        n = max(cfg.candidates, cfg.k)
        kv = cfg.k if cfg.mode == "vector" else n
        vector = self._ranked(q, kv, source, cfg)[0]
        keyword = catalog.keyword_search(query, n, source) if cfg.mode == "hybrid" or not cov.complete else []
        if not cov.complete:
            vector, filled = self._fill(q[0], vector, keyword, kv)
            cov = Coverage(cov.chunks, cov.embedded, filled)
        ranked = vector if cfg.mode == "vector" else fuse(vector, keyword, cfg.rrf_k)[: cfg.k]
        return ranked, vector, cov

    def _fill(self, q: np.ndarray, vector: Ranked, keyword: Ranked, n: int) -> tuple[Ranked, int]:
        """``vector`` with the best `FILL` ``keyword`` candidates that await vectors scored
        exactly against the query vector ``q`` (embedded now, or taken from this handle's cache),
        merged in by score and cut to ``n``; and how many were scored."""
        st = self.state
        cands = np.asarray([i for i, _ in keyword], dtype=np.int64)
        todo = cands[np.isin(cands, st.awaiting())][:FILL]
        if not len(todo):
            return vector, 0
        with self._filling:
            known = {int(i): self._filled[int(i)] for i in todo if int(i) in self._filled}
        new = [int(i) for i in todo if int(i) not in known]
        if new:
            known.update(zip(new, st.recompute(np.asarray(new, dtype=np.int64)), strict=True))
            with self._filling:
                if len(self._filled) + len(new) > FILL_CACHE:
                    self._filled.clear()
                self._filled.update((i, known[i]) for i in new)
        scores = np.stack([known[int(i)] for i in todo]).astype(np.float32) @ np.asarray(q, np.float32)
        merged = {**dict(vector), **{int(i): float(x) for i, x in zip(todo, scores, strict=True)}}
        return sorted(merged.items(), key=lambda kv: (-kv[1], kv[0]))[:n], len(todo)

    def search_batch(self, queries: Sequence[str], k: int = 5, source: str | None = None,
                     config: SearchConfig | None = None) -> list[Hits]:
        """Vector search for many queries at once: one embedder call, and for a slim index one
        recomputation batch per rerank wave shared by all queries. ``config``, when given, sets
        ``k`` and the slim knobs as in `search`; its mode must be "vector" (ValueError otherwise:
        `SearchConfig`'s default mode is hybrid, so a config built for this call names the mode).
        Chunks awaiting vectors are not searched here (no keyword candidates to fill from).
        """
        cfg = config or SearchConfig(k=k, mode="vector")
        if cfg.mode != "vector":
            raise ValueError(f"search_batch does vector search only, got mode={cfg.mode!r}; "
                             "call search() per query for keyword or hybrid")
        for query in queries:
            _check_query(query)
        q = self.state.embedder.embed(list(queries))
        with self.state.guard.reading():
            ranked = self._ranked(q, cfg.k, source, cfg)
        return [self._hits(r, dict(r)) for r in ranked]

    def _ranked(self, q: np.ndarray, k: int, source: str | None, cfg: SearchConfig) -> list[Ranked]:
        """The vector store's top ``k`` for each embedded query (rows awaiting vectors have none)."""
        st = self.state
        store = st.vectors
        allow = None
        if source is not None:
            allow = np.isin(store.ids, np.asarray(st.catalog.live_ids(source), dtype=np.int64))
        ids, scores = store.search(q, k, allow, cfg)
        return [[(int(i), float(s)) for i, s in zip(ids[r], scores[r], strict=True)] for r in range(len(q))]

    def _hits(self, ranked: Ranked, cosines: dict[int, float]) -> Hits:
        """``ranked`` as hits, each with its ``cosines`` entry as `Hit.similarity` (None if absent),
        and the best of ``cosines`` as `Hits.similarity`."""
        chunks = self.state.catalog.chunks([i for i, _ in ranked])
        return Hits((Hit(i, s, chunks[i].text, chunks[i].source, chunks[i].metadata, cosines.get(i))
                     for i, s in ranked if i in chunks), max(cosines.values(), default=None))


def _check_query(query: str) -> None:
    if not query.strip():
        raise RequestError("the query is empty or white space only; give some words to search for")
