"""The retrieval plan a router passes to the replica it chose: ``X-Slimrag-Plan``.

``slimrag route --index`` retrieves a chat's passages itself to choose a replica
(`slimrag.route.planner`); it passes them on so the replica does not search again
(`slimrag.serve.app`). The header holds the hits in relevance order as ``chunk_id:score`` pairs,
comma-separated, after a version tag: ``v1;12:0.8123,40:0.7710``. Scores are kept so the
replica ranks exactly as its own search would have. The replica still checks what it gets: every
chunk must be in its index (else it searches as usual), and at most `MAX_PLAN_HITS` are read.

A client may send the header too: it can only name chunks of the served index, which it can read
anyway (``/v1/passages``), and it is checked by the same key as the request.
"""

from __future__ import annotations

from collections.abc import Sequence

#: The header's name.
PLAN_HEADER = "x-slimrag-plan"
#: Most hits a plan may carry (a chat's ``k`` is at most 50, `slimrag.api.schemas`).
MAX_PLAN_HITS = 64
_VERSION = "v1;"


def format_plan(hits: Sequence[tuple[int, float]]) -> str:
    """The header value for ``hits`` ((chunk id, score), relevance order)."""
    return _VERSION + ",".join(f"{chunk_id}:{score:.9g}" for chunk_id, score in hits)


def parse_plan(value: str | None) -> list[tuple[int, float]] | None:
    """The hits of a header value; None when absent, of another version, or malformed."""
    if not value or not value.startswith(_VERSION):
        return None
    body = value[len(_VERSION):]
    if not body:
        return []
    hits: list[tuple[int, float]] = []
    for part in body.split(",")[: MAX_PLAN_HITS + 1]:
        chunk, sep, score = part.partition(":")
        try:
            hits.append((int(chunk), float(score)))
        except ValueError:
            return None
        if not sep:
            return None
    return hits if len(hits) <= MAX_PLAN_HITS else None
