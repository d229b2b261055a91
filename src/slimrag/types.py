"""Plain data records passed between layers: documents, chunks, hits (and a search's `Hits`), excerpts, answers.

They are frozen dataclasses so they can be shared between threads and compared in tests.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Document:
    """One source file (or one text given directly) as stored in the catalog.

    ``doc_id`` is the SHA-256 of the content, so the same bytes always get the same id.
    """

    doc_id: str
    source: str
    mtime: float
    size: int


@dataclass(frozen=True, slots=True)
class Chunk:
    """A token-bounded piece of a document; the unit of retrieval and of KV caching."""

    chunk_id: int
    doc_id: str
    source: str
    ordinal: int
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """``source#ordinal``: how answers cite the chunk (the same as its `Hit.label`)."""
        return f"{self.source}#{self.ordinal}"

    @property
    def page(self) -> int | None:
        """The page (from 1) of a PDF chunk, None for formats without pages (same rule as `Hit.page`)."""
        page = self.metadata.get("page")
        return page if isinstance(page, int) and not isinstance(page, bool) and page > 0 else None


@dataclass(frozen=True, slots=True)
class Hit:
    """One search result. ``score`` ranks the hits of one search: the cosine in vector mode, the
    BM25 score in keyword mode, the fused score in hybrid (`slimrag.index.fusion`: no absolute scale).

    ``similarity``: the cosine between the query's embedding and the chunk's, where the search
    computed it: every hit of a vector search (equal to ``score``), and every hybrid hit that was
    among the vector candidates (``SearchConfig.candidates``, 50) or was embedded by the search
    itself (a chunk awaiting its vector, `slimrag.index.query`). None for a hybrid hit that only
    the keyword search found and for every keyword-mode hit (no query vector there). Unlike
    ``score`` it has an absolute scale, comparable across queries; the search's best is `Hits.similarity`."""

    chunk_id: int
    score: float
    text: str
    source: str
    metadata: dict[str, Any] = field(default_factory=dict)
    similarity: float | None = None

    @property
    def label(self) -> str:
        """``source#ordinal``: how a prompt names the passage, and what an answer cites."""
        return f"{self.source}#{self.metadata.get('ordinal', 0)}"

    @property
    def page(self) -> int | None:
        """The page (from 1) of a PDF passage, None for formats without pages. The chunker
        records it, and never merges text of two pages into one chunk."""
        page = self.metadata.get("page")
        return page if isinstance(page, int) and not isinstance(page, bool) and page > 0 else None

    @property
    def where(self) -> str:
        """Where a passage is, as a citation shows it: ``guide.pdf#3 (p. 2)``, or the label alone."""
        page = self.page
        return self.label if page is None else f"{self.label} (p. {page})"


class Hits(list[Hit]):
    """The hits of one search, best first (a plain list of `Hit` to every caller), carrying
    ``similarity``: the best cosine the search computed between the query and any chunk it scored
    by vector (its vector candidates, filled ones included), None when it scored none (keyword
    mode, an index without vectors). In hybrid mode that chunk need not be among the hits (the fused
    cut keeps ``k`` of ``SearchConfig.candidates``), so it can exceed every `Hit.similarity`. The
    relevance floor reads it (`slimrag.rag.guards`) instead of searching again, as hnswlib's
    ``knn_query`` returns distances with the labels. A list made from hits (sorted, sliced, merged)
    is a plain list again, without it."""

    __slots__ = ("similarity",)

    def __init__(self, hits: Iterable[Hit] = (), similarity: float | None = None) -> None:
        super().__init__(hits)
        self.similarity = similarity


@dataclass(frozen=True, slots=True)
class Excerpt:
    """A chunk shown in its document: the chunk and up to ``around`` neighbours of the same source
    on each side, by ordinal (`slimrag.index.browse`). ``before`` and ``after`` are in reading
    order; fewer than ``around`` at a document's start or end. What a citation opens."""

    chunk: Chunk
    before: tuple[Chunk, ...] = ()
    after: tuple[Chunk, ...] = ()

    @property
    def page(self) -> int | None:
        """The cited chunk's page (from 1) for formats with pages (PDFs), else None."""
        return self.chunk.page


@dataclass(frozen=True, slots=True)
class Usage:
    """Token and time accounting of one generation.

    ``cached_tokens`` counts prompt tokens whose key/value states were reused instead of computed.
    ``ttft_s`` is the time from request to first generated token; ``total_s`` to the last.
    ``recomputed_tokens``: cached prompt tokens computed again anyway (blend reuse's recompute set;
    not in ``cached_tokens``); ``reuse``: how the cache was used, ``"exact"`` or ``"blend"``.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    ttft_s: float = 0.0
    total_s: float = 0.0
    recomputed_tokens: int = 0
    reuse: str = "exact"


#: Human-readable notices for finish reasons a reader should be told about (`Answer.notice`).
FINISH_NOTICES: dict[str, str] = {
    "length": "[The answer was cut off at the token limit; ask for more tokens to get the rest.]",
    "loop": "[Generation was stopped because the answer started repeating itself.]",
}
#: The "length" notice of a grounded answer, whose one sentence has a fixed limit that more tokens
#: do not lift (`slimrag.rag.grounded.MAX_TOKENS`).
GROUNDED_CUT = ("[The model's one sentence was cut off at its token limit, which the grounded answer "
                "keeps short; the free answer mode writes longer answers.]")


@dataclass(frozen=True, slots=True)
class Evidence:
    """A sentence of a retrieved passage that answers the question (`slimrag.rag.evidence`):
    its text, the passage's ``label`` (``source#ordinal``) and chunk id, where it is in the
    passage's text (``text[start:end]``, what the web page highlights), its evidence score, and
    what it documents when it stands under a signature line of its passage (``signature``:
    "uuid4()" for "Generate a random UUID.", `slimrag.rag.signatures`; "" when none)."""

    text: str
    label: str
    chunk_id: int
    start: int
    end: int
    score: float
    signature: str = ""

    @property
    def line(self) -> str:
        """The sentence on one line, each run of white space one space."""
        return " ".join(self.text.split())

    @property
    def lead(self) -> str:
        """What is shown before the sentence: its signature ("`uuid4()`: "), or "" when it has none."""
        return f"`{self.signature}`: " if self.signature else ""

    def passage(self, hits: Sequence[Hit]) -> Hit | None:
        """The hit of ``hits`` this sentence was read from (by its label), None when none is."""
        return next((h for h in hits if h.label == self.label), None)

    @property
    def quoted(self) -> str:
        """The sentence as a reader reads it, on one line (`line`), after its `lead`
        ("`uuid4()`: Generate a random UUID.")."""
        return self.lead + self.line


@dataclass(frozen=True, slots=True)
class Support:
    """How one answer sentence is backed by the passages (`slimrag.rag.attribution`): the
    sentence, the labels of the passages whose sentences support it (best first), the supporting
    sentences' evidence, whether it is supported at all, and the numbers and names it states that
    no passage holds."""

    sentence: str
    labels: tuple[str, ...]
    evidence: tuple[Evidence, ...]
    supported: bool
    unknown_terms: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Answer:
    """A generated answer with the passages it was given and its usage.

    sources: the passages of this answer's retrieval, by relevance (score), best first; empty when
    the answer is the fixed reply of an abstention. ``finish_reason`` says why generation ended:
    ``"stop"`` (end of turn or a stop string), ``"length"`` (``max_new_tokens`` or the model's
    context was reached), ``"loop"`` (the pipeline stopped a degenerate repetition, see
    `slimrag.rag.guards`), or what a remote server reported. ``unknown_citations``: labels the
    model cited (``[source#n]``) that were not among the passages it was given, in order of
    appearance; the text marks or drops them (`slimrag.rag.guards.Guards.citations`).
    ``abstained``: no passage reached the relevance floor, so the model was not called and
    ``text`` is the fixed reply. ``evidence``: the passage sentences that best answer the
    question, best first (`slimrag.rag.evidence`). ``support``: each answer sentence with the
    passages that back it, and ``used``: the labels of the sources that back at least one answer
    sentence, a subset of ``sources``' labels (`slimrag.rag.attribution`); the other sources were
    only retrieved. ``marked``: ``text`` with ``[label]`` after each supported sentence that cites
    nothing itself (empty when attribution did not run); ``text`` stays what was streamed.

    ``mode``: how the answer was made, ``"free"`` (the model over the passages) or ``"grounded"``
    (the passages' best sentences first, the model's one sentence after them; `slimrag.rag.grounded`).
    ``verdict``: what the check decided the reader sees (`slimrag.rag.verdict`): ``"supported"``
    (every claim backed, and one answers the question), ``"partial"`` (some claims backed, the
    others marked where they stand), ``"not_backed"`` (no sentence backs an answer: it is not
    shown as one; ``shown`` says so and quotes the passages, cited), ``""`` when no check ran
    (an abstention, or attribution off). ``shown``: the text a shell presents once the answer is
    complete (``text`` marked and cited, or the not-backed notice and the passages' sentences);
    empty when no check ran.
    """

    text: str
    sources: list[Hit]
    usage: Usage
    finish_reason: str = "stop"
    unknown_citations: tuple[str, ...] = ()
    abstained: bool = False
    evidence: tuple[Evidence, ...] = ()
    support: tuple[Support, ...] = ()
    used: tuple[str, ...] = ()
    marked: str = ""
    mode: str = "free"
    verdict: str = ""
    shown: str = ""

    @property
    def notice(self) -> str | None:
        """A line to show after the text when the reader should know how it ended (cut at the
        token limit, stopped in a loop), else None. Kept out of ``text`` so the answer stays what
        the model wrote (an OpenAI client gets the same through ``finish_reason``). A grounded
        answer's cut says that its mode keeps it short (`GROUNDED_CUT`): past 48 tokens, more do not lift it."""
        if self.mode == "grounded" and self.finish_reason == "length":
            return GROUNDED_CUT
        return FINISH_NOTICES.get(self.finish_reason)

    @property
    def backed(self) -> bool:
        """Whether the check presents this answer as an answer (verdict supported or partial)."""
        return self.verdict in ("supported", "partial")

    @property
    def also_retrieved(self) -> list[Hit]:
        """The sources no answer sentence was matched to (all of them before attribution ran)."""
        return [h for h in self.sources if h.label not in self.used]
