"""Hits, evidence, support and answers as JSON: one home for the shape every shell sends.

A hit's ``label`` is `Hit.label` (``source#ordinal``) and its ``page`` `Hit.page`: this module never
derives either again. `answer_json` carries what the check decided (issue 29): ``mode`` (free or
grounded), ``verdict`` (supported, partial, not_backed, or "" when no check ran), ``shown`` (the text
to present: cited and marked, or the not-backed notice with the passages quoted) next to ``text``
(what streamed). The CLI's ``--json`` uses it; the HTTP API (`slimrag.api`) and MCP
(`slimrag.mcp.results`) still build their own today and can move to it field for field.
"""

from __future__ import annotations

from typing import Any

from slimrag.types import Answer, Evidence, Hit, Support


def hit_json(h: Hit, snippet: int | None = None) -> dict[str, Any]:
    """A hit as JSON; ``text`` cut to ``snippet`` characters (with "…") when given."""
    text = h.text if snippet is None or len(h.text) <= snippet else h.text[:snippet] + "…"
    return {"chunk_id": h.chunk_id, "source": h.source, "label": h.label, "score": h.score, "text": text,
            "metadata": h.metadata, "page": h.page}


def evidence_json(e: Evidence) -> dict[str, Any]:
    """An evidence sentence: its text, passage label and chunk id, offsets in the passage, score."""
    return {"text": e.text, "label": e.label, "chunk_id": e.chunk_id, "start": e.start, "end": e.end,
            "score": e.score}


def support_json(s: Support) -> dict[str, Any]:
    """An answer sentence's support: whether backed, by which labels, what no passage holds."""
    return {"sentence": s.sentence, "supported": s.supported, "labels": list(s.labels),
            "unknown_terms": list(s.unknown_terms)}


def answer_json(a: Answer, snippet: int | None = None) -> dict[str, Any]:
    """An answer with its sources, evidence, support, verdict and usage (module header)."""
    u = a.usage
    return {"text": a.text, "shown": a.shown, "mode": a.mode, "verdict": a.verdict, "backed": a.backed,
            "abstained": a.abstained, "finish_reason": a.finish_reason, "notice": a.notice,
            "unknown_citations": list(a.unknown_citations), "marked": a.marked,
            "sources": [hit_json(h, snippet) for h in a.sources], "used": list(a.used),
            "evidence": [evidence_json(e) for e in a.evidence], "support": [support_json(s) for s in a.support],
            "usage": {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                      "cached_tokens": u.cached_tokens, "ttft_s": u.ttft_s, "total_s": u.total_s,
                      "recomputed_tokens": u.recomputed_tokens, "reuse": u.reuse}}
