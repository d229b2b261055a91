"""Plain data records passed between layers: documents, chunks, hits, answers.

They are frozen dataclasses so they can be shared between threads and compared in tests.
"""

from __future__ import annotations

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


@dataclass(frozen=True, slots=True)
class Hit:
    """One search result. ``score`` is cosine similarity for vector search, fused score for hybrid."""

    chunk_id: int
    score: float
    text: str
    source: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Usage:
    """Token and time accounting of one generation.

    ``cached_tokens`` counts prompt tokens whose key/value states were reused instead of computed.
    ``ttft_s`` is the time from request to first generated token; ``total_s`` to the last.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    ttft_s: float = 0.0
    total_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Answer:
    """A generated answer with the passages it was given (in prompt order) and its usage.

    ``finish_reason`` says why generation ended, as OpenAI names it: ``"stop"`` (end of turn or a
    stop string), ``"length"`` (``max_new_tokens`` or the model's context was reached), or what a
    remote server reported.
    """

    text: str
    sources: list[Hit]
    usage: Usage
    finish_reason: str = "stop"
