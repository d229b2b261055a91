"""Guards that hold an answer to its passages: a relevance floor, citation checks, loop stops.

A RAG answer is only as honest as what the model is shown and what it writes. Three checks sit
around the generator (the pipeline applies them; `Guards` turns them on and off):

Relevance floor (before the model is called)
    When nothing retrieved is about the question, a model asked to "answer from the passages"
    still answers, from its own memory or from the unrelated passages, and the answer looks as
    sourced as a real one. So when no passage reaches the floor the pipeline returns the fixed
    reply :data:`NO_ANSWER` and never calls the model. The floor is an embedding cosine, because
    only the embedder's scores have an absolute scale (BM25 grows with query length and corpus
    statistics; a fused score is a function of ranks or of min-max normalised lists):

    ======== =========================================================================
    mode     the question is answerable when ...
    ======== =========================================================================
    vector   the search's best similarity reaches ``floor`` (`best_similarity`: its best
             cosine, which is its first hit's score)
    hybrid   the search's best similarity reaches ``floor``: the best cosine among its
             vector candidates, carried with the hits (`Hits.similarity`), whether or
             not that chunk survived the fused cut; so no second search
    keyword  keyword search found something and a one-hit vector search of each query
             (same ``source`` filter) reaches ``floor``: keyword mode has no query
             vector, and keeping this probe there costs keyword mode what it cost before
             (an embedding and a vector search) while vector and hybrid pay nothing
    ======== =========================================================================

    Hits that are not one search's own list (sorted, merged: a plain list) fall back to the best
    `Hit.similarity` among them. The similarity is that of the query retrieval ran (a follow-up's
    condensed query, `slimrag.rag.condense`), where keyword mode's probe takes the best over the
    question and its condensed query. The trade-off: on a flat index the carried value is the
    probe's cosine exactly (the same exact search, 50 wide instead of 1); a slim index's walk for 50
    candidates is wider than a probe's for 1 (the two may differ there); and reading the
    best of the vector candidates, not only the hits' own similarity, keeps a question whose best
    chunk the fused cut dropped. The decisions compared with the probe's and the search saved:
    ``python -m bench.floor``, docs/benchmarks.md, "Relevance floor from the hits" (and
    tests/test_floor.py on the test corpus).

    ``floor`` 0.28 is measured for all-MiniLM-L6-v2 (the default embedder): on the test corpus
    (tests/conftest.py's DOCS) twelve unrelated questions ("What is the capital of France?",
    "hello", single letters) score 0.10-0.25 and twelve answerable ones 0.51-0.76; on the
    7,969 disfl_qa questions of ``bench/`` against their 1,204 passages the best passage scores
    below 0.28 for 0.4% of questions (1st percentile 0.31, median 0.59). 0.28 sits between the
    unrelated maximum and that 1st percentile. A remote embedder has another scale: set the floor
    for it, or None to turn the check off.

Citations (while the answer streams)
    Passages are labelled ``[source#ordinal]`` and the model is asked to cite them. A label it
    writes that is not among the passages it was given (it invented one, or recalled one from
    training) is collected in `Answer.unknown_citations` and, by ``citations``: ``"mark"``
    (default) rewrites it as ``[label (not among the sources)]``, ``"remove"`` drops it,
    ``"keep"`` leaves the text alone. A bracket is a citation when every comma- or
    semicolon-separated part looks like ``something#digits``; other brackets pass untouched.
    Text from an opening ``[`` is held back until its ``]`` (at most 300 characters, never past a
    line end), so a streamed answer and the final `Answer.text` agree.

Loops (while the answer streams)
    `slimrag.llm.engine.decoding.LoopGuard` (its header has the rule): when the text's tail becomes
    periodic, the pipeline closes the generator's stream and the answer ends with
    ``finish_reason="loop"``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from slimrag.types import Hit, Hits

#: The fixed reply when no passage reaches the relevance floor.
NO_ANSWER = ("I found nothing in the indexed files about this, so I cannot answer it from them. "
             "Try other words, or add the documents that cover it.")

#: What `Guards.citations` may be.
CITATION_POLICIES = ("mark", "remove", "keep")

#: The cosine floor for all-MiniLM-L6-v2 (see the module header for the measurement).
DEFAULT_FLOOR = 0.28


@dataclass(frozen=True, slots=True)
class Guards:
    """Which guards a `RAG` applies (module header). floor: the cosine a question's best passage
    must reach, None for no floor. citations: what to do with a cited label that was not given
    (``"mark"``, ``"remove"`` or ``"keep"``). stop_loops: stop a degenerate repetition."""

    floor: float | None = DEFAULT_FLOOR
    citations: str = "mark"
    stop_loops: bool = True

    def __post_init__(self) -> None:
        if self.floor is not None and not -1.0 <= self.floor <= 1.0:
            raise ValueError(f"floor is a cosine in [-1, 1] (or None for no floor), got {self.floor}")
        if self.citations not in CITATION_POLICIES:
            raise ValueError(f"citations must be one of {CITATION_POLICIES}, got {self.citations!r}")


# -- relevance floor ------------------------------------------------------------------------------
class Searcher(Protocol):
    """What the floor reads of an index in keyword mode (its probe): `Index.search`."""

    def search(self, query: str, k: int = 5, mode: str = "vector",
               source: str | None = None) -> list[Hit]: ...


#: (index, queries, hits, floor, source) -> whether the question is answerable from the index.
FloorCheck = Callable[[Searcher, Sequence[str], Sequence[Hit], float, "str | None"], bool]


def best_similarity(hits: Sequence[Hit]) -> float | None:
    """The best cosine the search of ``hits`` saw: `Hits.similarity` for a search's own result,
    else the highest `Hit.similarity` among them; None when neither is known."""
    if isinstance(hits, Hits) and hits.similarity is not None:
        return hits.similarity
    return max((h.similarity for h in hits if h.similarity is not None), default=None)


def _similarity_floor(index: Searcher, queries: Sequence[str], hits: Sequence[Hit], floor: float,
                      source: str | None) -> bool:
    best = best_similarity(hits)
    return bool(hits) and best is not None and best >= floor


def _cosine_probe(index: Searcher, queries: Sequence[str], hits: Sequence[Hit], floor: float,
                  source: str | None) -> bool:
    if not hits:
        return False
    return any(probe[0].score >= floor for q in queries if (probe := index.search(q, 1, "vector", source)))


#: search mode -> how the floor is checked in it (module header).
FLOORS: dict[str, FloorCheck] = {"vector": _similarity_floor, "hybrid": _similarity_floor, "keyword": _cosine_probe}


def answerable(index: Searcher, mode: str, queries: Sequence[str], hits: Sequence[Hit],
               floor: float | None, source: str | None = None) -> bool:
    """Whether ``hits`` (retrieved in ``mode`` for ``queries``, the question and maybe the
    question in its chat context, the last one retrieved with) hold something about the question
    (module header: vector and hybrid read the hits' `Hit.similarity`, keyword probes the index
    once per query). No floor: any hit will do."""
    if floor is None:
        return bool(hits)
    check = FLOORS.get(mode)
    if check is None:
        raise ValueError(f"no relevance floor is defined for search mode {mode!r}; known: {sorted(FLOORS)}")
    return check(index, queries, hits, floor, source)


# -- citations ------------------------------------------------------------------------------------
_LABEL = re.compile(r"[^#\[\]\n]+#\d+")
_SEPARATOR = re.compile(r"\s*[,;]\s*")
#: Longest bracket content held back as a possible citation.
MAX_CITATION = 300


@dataclass(slots=True)
class CitationCheck:
    """Streams answer text through, rewriting cited labels that are not in ``known`` (see the
    module header). :meth:`feed` returns what may be shown now, :meth:`flush` the rest."""

    known: Collection[str]
    policy: str = "mark"
    unknown: list[str] = field(default_factory=list)
    _held: str = ""

    def feed(self, text: str) -> str:
        """Take the next piece of the answer; return the text that is settled."""
        self._held += text
        out: list[str] = []
        while self._held:
            start = self._held.find("[")
            if start < 0:
                out.append(self._held)
                self._held = ""
                break
            out.append(self._held[:start])
            self._held = self._held[start:]
            end = _bracket_end(self._held)
            if end is None:  # may still become a citation: wait for more text
                break
            if end < 0:  # cannot be one: let the '[' through and look further
                out.append("[")
                self._held = self._held[1:]
                continue
            out.append(self._rewrite(self._held[: end + 1]))
            self._held = self._held[end + 1 :]
        return "".join(out)

    def flush(self) -> str:
        """The text still held back (an unclosed bracket at the end of the answer)."""
        rest, self._held = self._held, ""
        return rest

    def _rewrite(self, bracket: str) -> str:
        parts = _SEPARATOR.split(bracket[1:-1].strip())
        if not parts or not all(_LABEL.fullmatch(p) for p in parts):
            return bracket
        bad = [p for p in parts if p not in self.known]
        if not bad:
            return bracket
        self.unknown += [p for p in bad if p not in self.unknown]
        if self.policy == "keep":
            return bracket
        if self.policy == "remove":
            kept = [p for p in parts if p in self.known]
            return f"[{', '.join(kept)}]" if kept else ""
        return "[" + ", ".join(p if p in self.known else f"{p} (not among the sources)" for p in parts) + "]"


def _bracket_end(text: str) -> int | None:
    """For ``text`` starting with '[': the index of its closing ']', -1 when it cannot close as a
    citation (another '[' or a line end first, or too long), None when more text is needed."""
    for i in range(1, min(len(text), MAX_CITATION + 2)):
        ch = text[i]
        if ch == "]":
            return i
        if ch in "[\n":
            return -1
    return -1 if len(text) > MAX_CITATION + 1 else None
