"""The planner: choose the order of retrieved passages so the prompt's prefix is already cached.

Sources: RAGCache (arXiv 2404.12457, cache-aware reordering) and ContextPilot (put shared
context first). Attention over a prefix is order-sensitive, so a cached passage KV is reusable
only when the passages before it are the same, in the same order. Retrieval returns a *set* of
passages with a relevance order; any order carries the same facts, and the relevance order is
stated again after the passages (``Prompt.ranking``), so the model still knows it.

Algorithm (greedy, ``O(k * depth)`` per request for k passages, no pairwise clustering):

1. Start at the tree root of the system segment. If the root is not cached, nothing is.
2. Among the current node's cached children whose key is in the retrieved set, take the one with
   the most cached tokens (the longest cached continuation one step ahead); break ties by
   relevance. Repeat from that child until no retrieved passage continues the path.
3. Append the remaining passages in relevance order.

Each step looks every remaining candidate up in the child dict (or the children up in the
candidate dict, whichever is smaller), so a step costs ``O(min(k, fan-out))``. A deeper look-ahead
(the longest cached *path*) would need a search over orderings; one step is what keeps the
planner in the microseconds. The plan is a hint: ``KVTree.match`` is what actually pins and
serves the cache, and a node evicted between planning and matching only costs a recompute.

Without a tree (remote backends keep their own prefix caches), the plan is the relevance order;
the deterministic rendering then makes repeated passage sets hit the backend's cache. A
simulated :class:`~slimrag.llm.kvtree.KVTree` fed with token counts can mirror a remote cache.

Multi-turn chat: passages already given earlier in the conversation are not repeated; the plan
lists them in ``earlier`` so the question segment can refer to them by label.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from slimrag.rag.prompt import DEFAULT_SYSTEM, Passage, Prompt


class CachedSegment(Protocol):
    """What the planner reads of a cached node: its token count."""

    @property
    def tokens(self) -> int: ...


class PrefixCache(Protocol):
    """A tree the planner can walk (``KVTree.walk``): ``choose`` is given the current node's
    children and returns the key to descend to, or None to stop; returns (keys, cached tokens)."""

    def walk(self, root_key: str, choose: Callable[[Mapping[str, CachedSegment]], str | None],
             ) -> tuple[list[str], int]: ...


@dataclass(frozen=True, slots=True)
class Plan:
    """A passage order for one prompt.

    order: passage keys in prompt order; the first ``cached`` are expected to be served from
    the KV tree (``cached_tokens`` counts them plus the system segment). ranking: the keys of
    ``order`` by relevance, to be stated after the passages. earlier: relevant keys already
    given in an earlier chat turn, left out of ``order``, in relevance order.
    """

    order: tuple[str, ...]
    ranking: tuple[str, ...]
    cached: int = 0
    cached_tokens: int = 0
    earlier: tuple[str, ...] = ()

    def arrange(self, passages: Sequence[Passage]) -> tuple[Passage, ...]:
        """``passages`` (any order, keyed by ``Passage.key``) in plan order; keys the plan left
        out (``earlier``) are dropped. Raises KeyError when a planned key has no passage."""
        by_key = {p.key: p for p in passages}
        return tuple(by_key[k] for k in self.order)

    def prompt(self, question: str, passages: Sequence[Passage], system: str = DEFAULT_SYSTEM,
               history: tuple[tuple[str, str], ...] = ()) -> Prompt:
        """The :class:`Prompt` for this plan: passages in plan order, relevance ranking after."""
        return Prompt(question, self.arrange(passages), system, self.ranking, history)


def plan_passages(ranked: Sequence[str], tree: PrefixCache | None = None, root_key: str = "",
                  present: Collection[str] = ()) -> Plan:
    """Order retrieved passages for cache reuse.

    ranked: passage keys in relevance order, best first (duplicates keep their first place).
    tree / root_key: the KV tree and the system segment's root key; without a tree the order is
    the relevance order. present: keys already given earlier in the conversation; they go to
    ``Plan.earlier`` instead of ``Plan.order``. No side effects on the tree.
    """
    turn = split_turn(ranked, present)
    if tree is None or not turn.new:
        return Plan(turn.new, turn.new, earlier=turn.repeated)
    rank = {key: i for i, key in enumerate(turn.new)}
    remaining = dict(rank)

    def choose(children: Mapping[str, CachedSegment]) -> str | None:
        # Scan whichever side is smaller; both are plain dict lookups.
        pool = remaining if len(remaining) <= len(children) else children
        best, best_score = None, None
        for key in pool:
            child = children.get(key)
            if child is None or key not in remaining:
                continue
            score = (child.tokens, -remaining[key])
            if best_score is None or score > best_score:
                best, best_score = key, score
        if best is not None:
            del remaining[best]
        return best

    path, tokens = tree.walk(root_key, choose)
    order = tuple(path) + tuple(k for k in turn.new if k in remaining)
    return Plan(order, turn.new, len(path), tokens, turn.repeated)


@dataclass(frozen=True, slots=True)
class TurnPassages:
    """Retrieved passages of one chat turn: ``new`` ones to add to the prompt and ``repeated``
    ones already present in the conversation, each in relevance order."""

    new: tuple[str, ...]
    repeated: tuple[str, ...]


def split_turn(ranked: Sequence[str], present: Collection[str]) -> TurnPassages:
    """Split ``ranked`` keys (relevance order, duplicates dropped) by whether the conversation
    already holds them. ``present`` should be a set for large conversations."""
    seen: set[str] = set()
    new: list[str] = []
    repeated: list[str] = []
    for key in ranked:
        if key in seen:
            continue
        seen.add(key)
        (repeated if key in present else new).append(key)
    return TurnPassages(tuple(new), tuple(repeated))
