"""Fusion of ranked lists: how hybrid search merges the vector and the keyword hits.

Every function here is pure: it takes ranked lists of ``(chunk_id, score)``, best first, and
returns one fused list of the same shape, best first, ties broken by chunk id so the order is
deterministic.

- `rrf`, reciprocal rank fusion: ``score(d) = sum over lists of 1 / (k + rank)``, rank from 1.
  Robust because it never compares scores of different kinds (a cosine and a BM25 score have no
  common scale), and blind for the same reason: a keyword hit that beats the next one by a factor
  of four counts exactly as much as one that beats it by a hair. Issue 19's case: a unique phrase
  scored BM25 45.3 against 11.3 for the next hit, keyword rank 1, and fell to rank 5 in hybrid
  because its vector rank was poor.
- `keep_decisive`, the margin rule: when the keyword list's first hit scores at least ``margin``
  times its second (or is the only keyword hit), the keyword search has found something decisive
  (a name, a code, a phrase that one chunk holds), so that hit goes first and the rest keep their
  fused order. BM25 scores are ratio-comparable within one query (same terms, same corpus
  statistics), which is what makes a ratio meaningful where a difference is not. Knob: ``margin``
  (`MARGIN`, 2.0): on `bench.fusion`'s corpora it fires for about a quarter of the queries and
  its hit was the gold passage every time it fired (1.5 fires on 45%, also always right; 3 on 3-6%).
- `rrf_margin`: RRF with the margin rule.
- `convex`, score-aware fusion: each list's scores min-max normalised over its candidates, then
  ``alpha * vector + (1 - alpha) * keyword`` (a chunk missing from a list gets 0 there). Unlike
  RRF it sees that 45.3 is far above 11.3. Knob: ``alpha`` (`ALPHA`, 0.4): the vector list's
  weight; 0.3 to 0.5 beat RRF on both corpora of `bench.fusion`, 0.6 and above fall back to or
  below it (the embedder is the weaker retriever on both).
- `convex_margin`, the default (`fuse`): `convex` with the margin rule, so a decisive keyword match
  is first whatever the normalisation does with the rest of the lists.

Measured by `bench.fusion` (the same 50 + 50 candidates fused every way; 300 questions each;
docs/benchmarks.md, "Fusion"), gold passage in the top 5 / top 1: disfl_qa RRF 0.953 / 0.820,
convex 0.4 + margin 0.973 / 0.857; pydocs RRF 0.957 / 0.773, convex 0.4 + margin 0.983 / 0.837.
The margin rule alone keeps RRF's top 5 and lifts its top 1 (disfl_qa 0.827, pydocs 0.783).

`FUSIONS` names them for benchmarks; `fuse` is the one call hybrid search makes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

#: A ranked list: (chunk id, score), best first.
Ranked = list[tuple[int, float]]

#: The keyword margin (first score / second score) at which `rrf_margin` keeps the keyword hit first.
MARGIN = 2.0
#: The vector weight of `convex`.
ALPHA = 0.4


def _sorted(scores: dict[int, float]) -> Ranked:
    return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))


def rrf(lists: Sequence[Ranked], k: int = 60) -> Ranked:
    """Reciprocal rank fusion: score(d) = sum over lists of 1 / (k + rank), rank from 1.
    Ties are broken by chunk id so the fused order is deterministic."""
    scores: dict[int, float] = {}
    for ranked in lists:
        for rank, (cid, _) in enumerate(ranked, 1):
            scores[cid] = scores.get(cid, 0.0) + 1.0 / (k + rank)
    return _sorted(scores)


def decisive(keyword: Ranked, margin: float = MARGIN) -> int | None:
    """The chunk id of ``keyword``'s first hit when its score is at least ``margin`` times the
    second's (or it is the only hit with a positive score), else None. Scores must be positive and
    ratio-comparable (BM25 within one query)."""
    if not keyword or keyword[0][1] <= 0:
        return None
    if len(keyword) == 1 or keyword[1][1] <= 0:
        return keyword[0][0]
    return keyword[0][0] if keyword[0][1] >= margin * keyword[1][1] else None


def keep_decisive(fused: Ranked, keyword: Ranked, margin: float = MARGIN) -> Ranked:
    """``fused`` with a decisive keyword hit (`decisive`) moved first, its score lifted just above
    the best one (by 1e-6 of it, at least 1e-9) so scores stay decreasing; unchanged otherwise."""
    top = decisive(keyword, margin)
    if top is None or not fused or fused[0][0] == top:
        return fused
    best = fused[0][1]
    rest = [(cid, s) for cid, s in fused if cid != top]
    return [(top, best + max(abs(best) * 1e-6, 1e-9))] + rest


def rrf_margin(vector: Ranked, keyword: Ranked, k: int = 60, margin: float = MARGIN) -> Ranked:
    """RRF of the two lists, except that a decisive keyword hit (`decisive`) comes first."""
    return keep_decisive(rrf([vector, keyword], k), keyword, margin)


def _minmax(ranked: Ranked) -> dict[int, float]:
    if not ranked:
        return {}
    lo, hi = min(s for _, s in ranked), max(s for _, s in ranked)
    span = hi - lo
    return {cid: ((s - lo) / span if span > 0 else 1.0) for cid, s in ranked}


def convex(vector: Ranked, keyword: Ranked, alpha: float = ALPHA) -> Ranked:
    """Score-aware fusion: ``alpha`` * min-max(vector) + (1 - ``alpha``) * min-max(keyword), a
    chunk absent from a list scoring 0 there."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha is a weight in [0, 1], got {alpha}")
    v, w = _minmax(vector), _minmax(keyword)
    return _sorted({cid: alpha * v.get(cid, 0.0) + (1 - alpha) * w.get(cid, 0.0) for cid in v.keys() | w.keys()})


def convex_margin(vector: Ranked, keyword: Ranked, alpha: float = ALPHA, margin: float = MARGIN) -> Ranked:
    """`convex`, except that a decisive keyword hit (`decisive`) comes first."""
    return keep_decisive(convex(vector, keyword, alpha), keyword, margin)


#: Fusion strategies by name: (vector, keyword, rrf_k) -> fused.
FUSIONS: dict[str, Callable[[Ranked, Ranked, int], Ranked]] = {
    "rrf": lambda v, w, k: rrf([v, w], k),
    "rrf_margin": lambda v, w, k: rrf_margin(v, w, k),
    "convex": lambda v, w, k: convex(v, w),
    "convex_margin": lambda v, w, k: convex_margin(v, w),
}

#: The strategy `fuse` applies (chosen by `bench.fusion`, see the module header).
DEFAULT_FUSION = "convex_margin"


def fuse(vector: Ranked, keyword: Ranked, rrf_k: int = 60) -> Ranked:
    """Hybrid search's fusion of its vector and keyword candidates (`DEFAULT_FUSION`; ``rrf_k``
    is read by the RRF strategies only)."""
    return FUSIONS[DEFAULT_FUSION](vector, keyword, rrf_k)
