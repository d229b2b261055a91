"""What the MCP tools return: frozen dataclasses the SDK turns into structured results.

The SDK publishes each tool's return type as its ``outputSchema`` and sends the value both as
``structuredContent`` (JSON) and as a text block, so a model that reads only text sees the same
data. Every passage carries what a citation needs: its ``label`` (``source#ordinal``, the form
slimrag's answers cite), the ``source`` path, the ``page`` for PDFs (None elsewhere) and the
``chunk_id`` that `get_passage` opens; labels and pages follow the library's own rule (`Hit.label`,
`Hit.page`, `Chunk.page`). Built from the library's records (`Hit`, `Chunk`,
`Excerpt`, `Answer`, `AddReport`) by the ``from_*`` constructors here, so the tools stay thin; hits,
passages, evidence, support and answers through `slimrag.rag.wire`, field for field, so a tool returns
what the HTTP API and the CLI send.

No ``slots``: the SDK reads a plain class's fields with ``getattr`` to build the output schema, and
a slotted class's member descriptors look like (unserializable) defaults to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from slimrag.rag.wire import answer_json, excerpt_json, hit_json
from slimrag.types import Answer, Document, Excerpt, Hit


@dataclass(frozen=True)
class PassageHit:
    """One retrieved passage: where it is, how well it matched, and its text. ``score`` ranks it
    within its search; ``similarity`` is its cosine with the query where the search computed one
    (None for a passage only keyword search found; `Hit.similarity`)."""

    chunk_id: int
    label: str
    source: str
    page: int | None
    heading: str | None
    score: float
    similarity: float | None
    text: str

    @classmethod
    def from_hit(cls, hit: Hit) -> PassageHit:
        h = hit_json(hit)
        heading = h["metadata"].get("heading")
        sim = h["similarity"]
        return cls(h["chunk_id"], h["label"], h["source"], h["page"],
                   heading if isinstance(heading, str) and heading else None, round(float(h["score"]), 6),
                   None if sim is None else round(float(sim), 6), h["text"])


@dataclass(frozen=True)
class SearchResult:
    """The passages a search found, best first."""

    query: str
    mode: str
    hits: list[PassageHit]


@dataclass(frozen=True)
class DocumentInfo:
    """One stored document."""

    source: str
    size: int
    modified: str
    doc_id: str

    @classmethod
    def from_document(cls, doc: Document) -> DocumentInfo:
        when = datetime.fromtimestamp(doc.mtime, tz=UTC).isoformat(timespec="seconds")
        return cls(doc.source, doc.size, when, doc.doc_id)


@dataclass(frozen=True)
class DocumentList:
    """Stored documents sorted by source; ``total`` counts all that matched, ``documents`` holds at
    most ``limit`` of them."""

    total: int
    documents: list[DocumentInfo]
    index_chunks: int


@dataclass(frozen=True)
class PassageChunk:
    """One chunk of a document, in reading order."""

    chunk_id: int
    label: str
    ordinal: int
    page: int | None
    text: str

    @classmethod
    def from_json(cls, c: dict[str, Any]) -> PassageChunk:
        """From `slimrag.rag.wire.chunk_json`."""
        return cls(**c)


@dataclass(frozen=True)
class PassageExcerpt:
    """A chunk shown in its document: the chunk and its neighbours before and after it."""

    chunk_id: int
    label: str
    source: str
    page: int | None
    text: str
    before: list[PassageChunk]
    after: list[PassageChunk]

    @classmethod
    def from_excerpt(cls, ex: Excerpt) -> PassageExcerpt:
        e = excerpt_json(ex)
        return cls(e["chunk_id"], e["label"], e["source"], e["page"], e["text"],
                   [PassageChunk.from_json(b) for b in e["before"]], [PassageChunk.from_json(a) for a in e["after"]])


@dataclass(frozen=True)
class AnswerUsage:
    """Token and time accounting of one answer."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    ttft_s: float
    total_s: float


@dataclass(frozen=True)
class EvidenceSentence:
    """A passage sentence that answers the question: its text, its passage's label and chunk id,
    where it is in that passage's text (``text[start:end]``), and the signature it documents
    ("uuid4()" for "Generate a random UUID."; "" when none)."""

    text: str
    label: str
    chunk_id: int
    start: int
    end: int
    score: float
    signature: str = ""

    @classmethod
    def from_json(cls, e: dict[str, Any]) -> EvidenceSentence:
        """From `slimrag.rag.wire.evidence_json`."""
        return cls(**e)


@dataclass(frozen=True)
class SentenceSupport:
    """One answer sentence: whether a passage backs it, which (labels), and the numbers and names
    it states that no passage holds."""

    sentence: str
    supported: bool
    labels: list[str]
    unknown_terms: list[str]

    @classmethod
    def from_json(cls, s: dict[str, Any]) -> SentenceSupport:
        """From `slimrag.rag.wire.support_json`."""
        return cls(**s)


@dataclass(frozen=True)
class AnswerResult:
    """A generated answer with the passages it was given (its citations' targets), the evidence
    sentences that answer the question, each answer sentence's support, and the sources it used."""

    answer: str
    finish_reason: str
    notice: str | None
    abstained: bool
    unknown_citations: list[str]
    sources: list[PassageHit]
    usage: AnswerUsage
    evidence: list[EvidenceSentence]
    support: list[SentenceSupport]
    used: list[str]
    marked: str
    mode: str = "free"
    verdict: str = ""
    shown: str = ""

    @classmethod
    def from_answer(cls, a: Answer) -> AnswerResult:
        """From `slimrag.rag.wire.answer_json`: the fields the CLI and the API send, ``text`` as ``answer``."""
        j = answer_json(a)
        u = j["usage"]
        usage = AnswerUsage(u["prompt_tokens"], u["completion_tokens"], u["cached_tokens"], round(u["ttft_s"], 4),
                            round(u["total_s"], 4))
        return cls(j["text"], j["finish_reason"], j["notice"], j["abstained"], j["unknown_citations"],
                   [PassageHit.from_hit(h) for h in a.sources], usage,
                   [EvidenceSentence.from_json(e) for e in j["evidence"]],
                   [SentenceSupport.from_json(s) for s in j["support"]], j["used"], j["marked"], j["mode"],
                   j["verdict"], j["shown"])


@dataclass(frozen=True)
class SkippedInput:
    """An input the add passed over, with why."""

    source: str
    kind: str
    reason: str


@dataclass(frozen=True)
class AddResult:
    """What an add did: documents added, updated (content changed) and unchanged, chunks written,
    the inputs skipped with their reasons, and the sources behind each count."""

    added: int
    updated: int
    unchanged: int
    chunks: int
    skipped: list[SkippedInput]
    files: dict[str, list[str]]
    seconds: float

    @classmethod
    def from_report(cls, report: Any) -> AddResult:
        """From an `AddReport` (its ``to_dict``, the form the CLI's ``--json`` prints)."""
        d = report.to_dict()
        return cls(d["added"], d["updated"], d["unchanged"], d["chunks"],
                   [SkippedInput(s["source"], s["kind"], s["reason"]) for s in d["skipped"]],
                   d["files"], round(float(d["seconds"]), 3))
