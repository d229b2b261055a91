"""A chat whose passages a router already retrieved (``X-Slimrag-Plan``, `slimrag.api.plan_header`).

``slimrag route --index`` searches the index to choose a replica by the passages a chat will use
(issue 31); the chosen replica takes those hits instead of searching again. The hits are read from
the served index by chunk id (text, source and metadata as a search returns them), ordered
against the replica's own KV tree by the same planner (`RAG.prompt`), and answered as any turn
(`RAG.answer`). The relevance floor was applied by the router, which sends no plan for a question
below it (the replica then searches, and abstains, itself).

When any planned chunk is gone from the index (removed since the router searched), the plan is
ignored and the replica retrieves as usual: an answer never rests on passages it cannot read.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from slimrag.config import GenerationConfig
from slimrag.rag.pipeline import by_relevance
from slimrag.rag.stream import AnswerStream
from slimrag.rag.turn import Turn
from slimrag.serve.chat import WireAnswer, wire_pieces
from slimrag.serve.workers import Worker
from slimrag.types import Hit


def planned_hits(worker: Worker, plan: Sequence[tuple[int, float]]) -> list[Hit] | None:
    """The hits of ``plan`` ((chunk id, score), relevance order) from the served index; None
    when a chunk is missing."""
    chunks = worker.index.chunks(chunk_id for chunk_id, _ in plan)
    if len(chunks) != len({chunk_id for chunk_id, _ in plan}):
        return None
    return [Hit(i, s, chunks[i].text, chunks[i].source, chunks[i].metadata) for i, s in plan]


def planned_pieces(worker: Worker, hits: list[Hit], question: str, history: tuple[tuple[str, str], ...],
                   config: GenerationConfig, answer: str | None = None) -> Iterator[str | WireAnswer]:
    """Answer ``question`` over ``hits`` without retrieving: text pieces, then a `WireAnswer`."""
    rag = worker.rag
    turn = Turn(rag.prompt(question, hits, history, answer=answer), by_relevance(hits), time.perf_counter(), question)
    yield from wire_pieces(AnswerStream(rag.answer(turn, config, answer)))
