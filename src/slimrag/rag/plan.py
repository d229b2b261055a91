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

Without a tree the plan is the relevance order. Remote backends keep their own prefix caches;
:mod:`slimrag.rag.shadow` mirrors what was sent to them in a simulated tree (token estimates, no
tensors), so the same planner orders their passages too, and the deterministic rendering makes
the backend's cache hit.

Multi-turn chat: passages already given earlier in the conversation are not repeated. They stay
in the prompt as a fixed ``prefix`` (in the order they were first given, so the conversation's
KV is a cached prefix of the next turn), the walk follows that prefix first, new passages are
planned after it, and the relevance ranking stated after the passages names the earlier ones too
(``Plan.earlier``), which is how the question segment refers to them.

Cost: :func:`plan_prompt` computes k content digests (about a microsecond each) and one walk.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from slimrag.prompt import DEFAULT_SYSTEM, CachedSegment, Passage, PlanningCache, PrefixCache, Prompt


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
                  present: Collection[str] = (), prefix: Sequence[str] = ()) -> Plan:
    """Order retrieved passages for cache reuse.

    ranked: passage keys in relevance order, best first (duplicates keep their first place).
    tree / root_key: the KV tree and the system segment's root key; without a tree the order is
    the relevance order. present: keys already given earlier in the conversation; they go to
    ``Plan.earlier`` instead of ``Plan.order``. prefix: keys that precede the planned passages in
    the prompt whatever the plan (a chat's earlier passages); the walk follows them first and
    plans nothing cached when they are not all cached. ``Plan.cached`` counts planned passages
    only, ``Plan.cached_tokens`` the system segment, the prefix and them. No side effects.
    """
    turn = split_turn(ranked, present)
    if tree is None or not turn.new:
        return Plan(turn.new, turn.new, earlier=turn.repeated)
    rank = {key: i for i, key in enumerate(turn.new)}
    remaining = dict(rank)
    fixed = list(prefix)
    broken = False

    def choose(children: Mapping[str, CachedSegment]) -> str | None:
        nonlocal broken
        if fixed or broken:  # still inside the fixed prefix: follow it or stop for good
            key = fixed.pop(0) if fixed else None
            if key is None or key not in children:
                broken = True
                return None
            return key
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
    if broken or fixed:  # the prefix is not (all) cached: what the walk found is not usable
        return Plan(turn.new, turn.new, earlier=turn.repeated)
    planned = path[len(prefix):]
    order = tuple(planned) + tuple(k for k in turn.new if k in remaining)
    return Plan(order, turn.new, len(planned), tokens, turn.repeated)


def plan_prompt(question: str, ranked: Sequence[Passage], cache: PlanningCache | None = None, *,
                system: str = DEFAULT_SYSTEM, history: tuple[tuple[str, str], ...] = (),
                earlier: Sequence[Passage] = (), questions: tuple[str, ...] = ()) -> tuple[Prompt, Plan]:
    """The prompt for ``question`` over ``ranked`` passages (relevance order), ordered for reuse.

    earlier: passages already in the conversation (their prompt order); retrieved passages among
    them are not repeated, the rest follow them in plan order. The prompt's ranking lists every
    retrieved passage (earlier ones included) by relevance, so the question segment states it.
    The plan's keys are cache keys (``Prompt.passage_key``); with no cache the order is the
    relevance order. history / questions: the chat context of `Prompt` (after the passages, so
    they never change the planned prefix). Raises ValueError when two passages share a key but
    differ in text.
    """
    by_key: dict[str, Passage] = {}
    for p in (*earlier, *ranked):
        if by_key.setdefault(p.key, p) != p:
            raise ValueError(f"two different passages share the key {p.key!r}")
    turn = split_turn([p.key for p in ranked], {p.key for p in earlier})
    template = Prompt(question, (*earlier, *(by_key[k] for k in turn.new)), system, (), history)
    if cache is None:
        plan = Plan(turn.new, turn.new, earlier=turn.repeated)
        order = [by_key[k] for k in turn.new]
    else:
        tree_key = {template.passage_key(by_key[k]): k for k in turn.new}
        tree_plan = plan_passages(list(tree_key), cache, cache.root_key(template),
                                  prefix=[template.passage_key(p) for p in earlier])
        order = [by_key[tree_key[k]] for k in tree_plan.order]
        plan = Plan(tuple(p.key for p in order), turn.new, tree_plan.cached, tree_plan.cached_tokens,
                    turn.repeated)
    ranking = tuple(dict.fromkeys(p.key for p in ranked))
    return Prompt(question, (*earlier, *order), system, ranking, history, questions), plan


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
