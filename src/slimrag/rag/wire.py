"""Hits, passages, evidence, support and answers as JSON: one home for the shape every shell sends.

A hit's or a chunk's ``label`` is `Hit.label` / `Chunk.label` (``source#ordinal``) and its ``page``
`Hit.page` / `Chunk.page`: this module never derives either again, and no shell derives them itself.
A hit's ``score`` ranks it within its search (cosine, BM25 or fused, by mode); its ``similarity`` is
`Hit.similarity`, the query's cosine against the chunk where the search computed one (``null`` for a
hit only keyword search found): the one score comparable across queries.
`checked_json` is what the check decided (issue 29): ``mode`` (free or grounded), ``verdict``
(supported, partial, not_backed, or "" when no check ran), ``shown`` (the text to present: cited and
marked, or the not-backed notice with the passages quoted), with the evidence, each sentence's support,
the labels used and the marked text. Every shell sends it the same way:

- the CLI's ``--json``: `answer_json` (``text`` and ``shown``, sources, `checked_json`, finish and usage);
- the HTTP API (`slimrag.serve.chat`): ``hit_json`` for search hits and a completion's sources,
  `checked_json` inside the completion's ``slimrag`` field, `excerpt_json` for ``GET /v1/passages``;
- MCP (`slimrag.mcp.results`): its result dataclasses are built from these dictionaries, field for
  field, so a tool returns what the API and the CLI send.

Shells choose only what they add (the OpenAI wire's usage and finish reason, a snippet length).
"""

from __future__ import annotations

from typing import Any

from slimrag.types import Answer, Chunk, Evidence, Excerpt, Hit, Support


def hit_json(h: Hit, snippet: int | None = None) -> dict[str, Any]:
    """A hit as JSON; ``text`` cut to ``snippet`` characters (with "…") when given."""
    text = h.text if snippet is None or len(h.text) <= snippet else h.text[:snippet] + "…"
    return {"chunk_id": h.chunk_id, "source": h.source, "label": h.label, "score": h.score,
            "similarity": h.similarity, "text": text, "metadata": h.metadata, "page": h.page}


def chunk_json(c: Chunk) -> dict[str, Any]:
    """A chunk shown beside a passage: its id, label, place in its document, page and text."""
    return {"chunk_id": c.chunk_id, "label": c.label, "ordinal": c.ordinal, "page": c.page, "text": c.text}


def excerpt_json(ex: Excerpt) -> dict[str, Any]:
    """A chunk in its document (`slimrag.index.core.Index.passage`) with its neighbours before and after."""
    c = ex.chunk
    return {"chunk_id": c.chunk_id, "source": c.source, "doc_id": c.doc_id, "ordinal": c.ordinal,
            "label": c.label, "page": ex.page, "text": c.text, "metadata": c.metadata,
            "before": [chunk_json(b) for b in ex.before], "after": [chunk_json(a) for a in ex.after]}


def evidence_json(e: Evidence) -> dict[str, Any]:
    """An evidence sentence: its text, passage label and chunk id, offsets in the passage, score, and
    the signature it documents ("" when none)."""
    return {"text": e.text, "label": e.label, "chunk_id": e.chunk_id, "start": e.start, "end": e.end,
            "score": e.score, "signature": e.signature}


def support_json(s: Support) -> dict[str, Any]:
    """An answer sentence's support: whether backed, by which labels, what no passage holds."""
    return {"sentence": s.sentence, "supported": s.supported, "labels": list(s.labels),
            "unknown_terms": list(s.unknown_terms)}


def checked_json(a: Answer) -> dict[str, Any]:
    """What the check of an answer decided and found (module header)."""
    return {"mode": a.mode, "verdict": a.verdict, "shown": a.shown, "marked": a.marked, "used": list(a.used),
            "evidence": [evidence_json(e) for e in a.evidence], "support": [support_json(s) for s in a.support]}


def answer_json(a: Answer, snippet: int | None = None) -> dict[str, Any]:
    """An answer with its sources, the check's findings (`checked_json`) and its usage (module header)."""
    u = a.usage
    return {"text": a.text, "backed": a.backed, "abstained": a.abstained, "finish_reason": a.finish_reason,
            "notice": a.notice, "unknown_citations": list(a.unknown_citations),
            "sources": [hit_json(h, snippet) for h in a.sources], **checked_json(a),
            "usage": {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                      "cached_tokens": u.cached_tokens, "ttft_s": u.ttft_s, "total_s": u.total_s,
                      "recomputed_tokens": u.recomputed_tokens, "reuse": u.reuse}}
