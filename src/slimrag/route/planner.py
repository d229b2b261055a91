"""`RoutePlanner`: the router retrieves a chat's passages itself, to route by them (issue 31).

A slimrag replica reuses the KV of the *retrieved passages* (its knowledge tree), so what a
request will find cached depends on its passages, not on its text. With ``slimrag route --index
PATH`` the router opens the replicas' index read-only and runs the retrieval a replica would run
for the chat (`slimrag.rag.pipeline.RAG.turn`): the question is the last user message holding text,
a follow-up's query is condensed with the earlier questions' words (``"words"``, the replicas'
default), the search runs in the default mode with the chat's ``k`` and ``source``, and the
relevance floor (`slimrag.rag.guards.answerable`) is checked. The hits are passed to the chosen
replica (``X-Slimrag-Plan``), which then does not search again; a question below the floor gets
no plan (the replica abstains on its own search).

The passages' cache keys (`slimrag.prompt.Prompt.passage_key`) are what a replica's tree and its
KV events are keyed by, so `slimrag.route.kv_view.KVView.plan` can replay the replica's planner
over its view. Token counts of passages no replica holds are estimated from their text
(``chars_per_token``, default 4: English under SmolLM2's tokenizer); held ones are known exactly.

Cost: the embedder's load at start-up (``RoutePlanner`` returns with it loaded, as a replica loads its
models before it listens), then one query embedding and one search per chat, on one thread of the
router (the index's SQLite connection belongs to it): a few ms to tens of ms on a CPU, paid instead of
the replica's own search.
The router must serve the same index folder as the replicas (same chunk ids) and their system
prompt (the default one); it loads the index's embedder, not the generator. Changes by another
process (``slimrag add``/``remove`` while everything runs) are picked up before the next plan: the
index is caught up in place per plan (`slimrag.index.follow.FollowedIndex`, a stat and a pragma
when nothing moved), as the replicas catch theirs up, so a plan names the chunks a replica would find.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from slimrag.api.schemas import ChatRequest
from slimrag.config import SearchConfig
from slimrag.index.follow import FollowedIndex
from slimrag.prompt import DEFAULT_SYSTEM, Prompt
from slimrag.rag.condense import with_words
from slimrag.rag.guards import DEFAULT_FLOOR, answerable


@dataclass(frozen=True, slots=True)
class RoutePlan:
    """A chat's passages: ``hits`` ((chunk id, score), relevance order), their cache ``keys``
    (same order) and estimated ``tokens`` per passage segment."""

    hits: tuple[tuple[int, float], ...]
    keys: tuple[str, ...]
    tokens: tuple[int, ...]


def chat_turn(req: ChatRequest) -> tuple[str, list[str]]:
    """The question (the last user message holding text) and the earlier user questions."""
    at = max(i for i, m in enumerate(req.messages) if m.is_question())  # the schema requires one
    earlier = [m.text() for m in req.messages[:at] if m.role == "user" and m.text().strip()]
    return req.messages[at].text(), earlier


class RoutePlanner:
    """The retrieval of the replicas, run by the router on its own thread (module header)."""

    def __init__(self, index: str | Path, *, mode: str | None = None, floor: float | None = DEFAULT_FLOOR,
                 system: str = DEFAULT_SYSTEM, chars_per_token: float = 4.0) -> None:
        if chars_per_token <= 0:
            raise ValueError(f"chars_per_token must be positive, got {chars_per_token}")
        self.path, self.mode = Path(index), mode or SearchConfig().mode
        self.floor, self.system, self.chars_per_token = floor, system, chars_per_token
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="route-plan")
        # caught up in place before each plan (an ``add`` beside the running replicas), as the
        # replicas' sessions and the MCP server's are
        self._followed = FollowedIndex(self.path)
        # A bad folder, or an embedder that cannot load, fails here, at start-up; and the first
        # chats do not wait for the model's load (seconds on a CPU) behind their plans.
        self._pool.submit(lambda: self._followed.current().load_embedder()).result()

    def plan(self, req: ChatRequest) -> RoutePlan | None:
        """The chat's passages, or None below the relevance floor (blocking, from any thread: the
        search runs on the planner's own)."""
        return self._pool.submit(self._plan, req).result()

    def _plan(self, req: ChatRequest) -> RoutePlan | None:
        from slimrag.rag.pipeline import by_relevance, passage_of  # with the index: only with --index

        index = self._followed.current()
        question, earlier = chat_turn(req)
        query = with_words(question, earlier) if earlier else question
        queries = [question] + ([query] if query != question else [])
        hits = index.search(query, k=req.k, mode=self.mode, source=req.source)
        if not answerable(index, self.mode, queries, hits, self.floor, req.source):
            return None
        hits = by_relevance(hits)  # the replica's own order and passages (`slimrag.rag.pipeline`)
        template = Prompt(question, (), self.system)
        passages = [passage_of(h) for h in hits]
        keys = tuple(template.passage_key(p) for p in passages)
        tokens = tuple(max(1, round(len(template.passage_text(p)) / self.chars_per_token)) for p in passages)
        return RoutePlan(tuple((h.chunk_id, h.score) for h in hits), keys, tokens)

    async def aplan(self, req: ChatRequest) -> RoutePlan | None:
        """`plan` from the event loop (on the planner's thread)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._plan, req)

    def close(self) -> None:
        """Close the index and stop the thread."""
        self._pool.submit(self._followed.close).result()
        self._pool.shutdown()
