"""Warm prefill: how the embedded engine reuses passage KV across requests.

The engine (:mod:`slimrag.llm.local`) asks a :class:`KVReuse` for a :class:`Lease` on the
cacheable segments of a prompt (``[system][passage]...``; the question segment never is). The
lease says how many leading segments are served from the cache and hands their K/V, joined along
the sequence axis (new tensors; the tree's copies are never aliased); the engine seeds its
``KVCache`` with them, prefills the remaining segments, and gives the lease the
per-layer K/V of the whole prompt so the segments it computed are stored.

Three strategies, picked by what the engine is given (a null object, not ``if enabled:`` branches):

- :class:`NoReuse`: nothing is cached; every request prefills from position 0.
- :class:`TreeReuse`: the knowledge tree (:mod:`slimrag.llm.kv.tree`). Its root key is the system
  segment's key namespaced by the model name, so two models or two system prompts never share
  entries; its edges are the passages' content-addressed keys (``Prompt.passage_key``).
- :class:`slimrag.llm.kv.blend.BlendReuse` (``CacheConfig(reuse="blend")``): the same tree, plus
  passages placed wherever they stand from their position-independent entries (not exact; its
  module header says how and what it costs in fidelity).

A lease prefills the prompt itself (:meth:`Lease.prefill`, given the engine's
:class:`PrefillEngine` hooks), so a strategy decides both what is served and how the rest is
computed; the engine only decodes.

Exactness. The engine computes each segment's K/V the same way whether or not anything before
it is cached: one forward over the uncached segments with attention per segment, where the
model's products do not depend on the rows around a row (:mod:`slimrag.llm.model.prefill`),
else one forward per segment on top of the cache so far. A segment's K/V then come from the same
arithmetic, on the same prefix values, in the request that stored them and in a request that
prefills them itself, so a cached run is bitwise identical to an uncached one, not merely close
(a plain whole-prompt forward through row-dependent products sums in another order and differs
by ~1e-7 in the logits, enough to flip a greedy tie now and then).

Pins: a lease pins its matched nodes from :meth:`KVReuse.lease` to the end of the ``with``
block; the engine leaves the block right after prefill, before decoding, so decode never holds
tree pins.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Protocol

from slimrag.llm.kv.events import KVEvent
from slimrag.llm.kv.payload import assemble_kv, split_kv
from slimrag.llm.kv.tree import KVTree, KVTreeStats, Match
from slimrag.prompt import CachedSegment, Prompt, root_key

if TYPE_CHECKING:  # types only: the tree stays free of torch and of the engine at run time
    import torch

    from slimrag.llm.model import Decoder, KVCache

#: Per-layer (K, V) of a run of positions, each ``[1, kv_heads, tokens, head_dim]`` (the engine's
#: :class:`~slimrag.llm.model.KVCache` layout, which the tree stores as is).
Layers = list[tuple["torch.Tensor", "torch.Tensor"]]


class PrefillEngine(Protocol):
    """What a lease prefills with: the engine's model, its cache factory, its segment-exact
    prefill and one forward under the engine's lock (:class:`slimrag.llm.engine.runner.ModelRunner`
    implements it). Every call may load the model first; every forward holds the engine's model
    lock, so a lease may call them while decode steps of other requests run."""

    @property
    def model(self) -> Decoder:
        """The loaded decoder: blend reads its ``config`` (layers, heads) and its ``rope``."""
        ...

    def new_cache(self, past: Layers | None = None) -> KVCache:
        """A model cache on the model's device and dtype: empty, or seeded with ``past`` (copied,
        so the tree's tensors are never aliased), its length ``past``'s token count."""
        ...

    def prefill_segments(self, seg_ids: list[list[int]], cache: KVCache, first: int) -> torch.Tensor:
        """Prefill ``seg_ids[first:]`` on top of ``cache``, which must hold exactly the segments
        before ``first``; the last segment must be non-empty (a ValueError otherwise). Returns the
        last prompt position's logits ``[vocab]``; ``cache`` then holds the whole prompt.
        Guarantee: each segment's K/V are bitwise those of a run that computed the same segments
        before it, whether they came from a cache or were prefilled here (exact reuse rests on it)."""
        ...

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, cache: KVCache, *,
                mask: torch.Tensor | None = None, stop_after: int | None = None) -> torch.Tensor | None:
        """:meth:`Decoder.forward` of ``ids`` at ``positions`` on ``cache`` (their K/V appended),
        under the engine's lock and ``torch.inference_mode``: the last position's logits, or None
        when ``stop_after`` ends the forward after that layer (blend's deviation probe).
        ``mask``: ``[len(ids), cache length + len(ids)]`` booleans (True = seen, keys in cache
        order) replacing the causal rule; None is causal."""
        ...


class Lease:
    """The cached prefix of one request: ``segments`` leading cacheable segments (system first)
    holding ``tokens`` prompt tokens. This base is the empty lease of :class:`NoReuse`.
    ``recomputed``: cached tokens computed again anyway (blend's recompute set; they are not in
    ``tokens``); ``reuse``: the mode name reported in ``Usage.reuse``."""

    segments: int = 0
    tokens: int = 0
    recomputed: int = 0
    reuse: str = "exact"

    def past(self) -> Layers | None:
        """Per-layer (K, V) of the cached prefix, on the engine's device; None when nothing is."""
        return None

    def prefill(self, engine: PrefillEngine, seg_ids: list[list[int]]) -> tuple[KVCache, torch.Tensor]:
        """Prefill the prompt ``seg_ids`` (one list per segment, the question last) on top of what
        this lease serves; returns the model cache holding the whole prompt in position order and
        the last position's logits. Exact reuse: seed the cache with :meth:`past` and prefill the
        segments after the cached ones."""
        cache = engine.new_cache(self.past())
        return cache, engine.prefill_segments(seg_ids, cache, self.segments)

    def store(self, layers: Layers, lengths: Sequence[int]) -> int:
        """Keep the segments this request computed. ``layers``: the prompt's per-layer (K, V);
        ``lengths``: token counts of the cacheable segments in prompt order. Returns how many
        segments were added (0 here)."""
        return 0


class KVReuse(ABC):
    """A strategy for reusing passage KV across requests (see the module header)."""

    @abstractmethod
    def lease(self, root_key: str, path: Sequence[str]) -> AbstractContextManager[Lease]:
        """The cached prefix of ``[root_key, *path]``, held for the ``with`` block.

        Yields a :class:`Lease`: ``segments`` leading segments (0 to ``1 + len(path)``; the root,
        the system segment, first) served from the cache, holding ``tokens`` prompt tokens, whose
        K/V :meth:`Lease.past` hands joined (new tensors on the engine's device); the lease's
        :meth:`Lease.prefill` computes the rest and :meth:`Lease.store` keeps it. The root key is
        the namespace (the model name and the system segment, :func:`slimrag.prompt.root_key`):
        keys are compared exactly, so two models never share entries.

        Side effects (the knowledge tree's; :meth:`KVTree.match`): the matched nodes are pinned
        until the block exits (never moved or evicted meanwhile: leave it before decoding), their
        hit counts and eviction priorities are refreshed, and they may be promoted to a faster
        tier, demoting or dropping other, unpinned nodes; a node that lives only on disk and fits
        no memory tier ends the match there. Nothing is inserted here."""

    def cached_tokens(self, root_key: str, path: Sequence[str]) -> int:
        """Tokens of the longest cached prefix of the path, without side effects (the scheduler's
        score). 0 here."""
        return 0

    def walk(self, root_key: str, choose: Callable[[Mapping[str, CachedSegment]], str | None],
             ) -> tuple[list[str], int]:
        """The planner's walk (``KVTree.walk``); nothing is cached here."""
        return [], 0

    @property
    def enabled(self) -> bool:
        """True when something may be cached (the planner is worth running)."""
        return False

    @property
    def keeps_paths(self) -> bool:
        """True when a computed prompt prefix is stored as an exact path that a later prompt
        starting with it is served from (what ``LocalGenerator.keep`` needs). Blend reuse stores
        only system segments and position-independent entries, so it does not."""
        return False

    def subscribe(self, listener: Callable[[KVEvent], None]) -> bool:
        """Tell ``listener`` every change of the cache as KV events; False when it keeps none."""
        return False

    def stats(self) -> KVTreeStats | None:
        """Counters and per-tier bytes of the cache, None when there is none."""
        return None

    def close(self) -> None:  # noqa: B027  (a no-op by default, on purpose)
        """Free whatever the cache holds (files included)."""


class NoReuse(KVReuse):
    """Every request prefills from scratch (the reference for exactness and the benchmarks)."""

    @contextmanager
    def lease(self, root_key: str, path: Sequence[str]) -> Iterator[Lease]:
        yield Lease()


class _TreeLease(Lease):
    def __init__(self, tree: KVTree, match: Match, device: str | None) -> None:
        self.tree, self.match, self.device = tree, match, device
        self.segments, self.tokens = len(match.nodes), match.tokens

    def past(self) -> Layers | None:
        return assemble_kv(self.match.payloads, self.device) if self.match.nodes else None

    def store(self, layers: Layers, lengths: Sequence[int]) -> int:
        n = next((i for i, length in enumerate(lengths) if length <= 0), len(lengths))
        if n <= self.segments:
            return 0  # everything storable was served from the cache (or a segment is empty)
        m = self.match
        payloads = split_kv(layers, list(lengths[:n]), first=self.segments)
        return self.tree.insert(m.root_key, m.path[: n - 1], payloads)


class TreeReuse(KVReuse):
    """The knowledge tree behind the engine. ``device``: where assembled K/V must live (the
    model's device); the tree's own tiers come from its config."""

    def __init__(self, tree: KVTree, device: str | None = None) -> None:
        self.tree = tree
        self.device = device

    @contextmanager
    def lease(self, root_key: str, path: Sequence[str]) -> Iterator[Lease]:
        match = self.tree.match(root_key, path)
        try:
            yield _TreeLease(self.tree, match, self.device)
        finally:
            self.tree.release(match)

    def cached_tokens(self, root_key: str, path: Sequence[str]) -> int:
        rest = list(path)

        def follow(children: Mapping[str, CachedSegment]) -> str | None:
            return rest.pop(0) if rest and rest[0] in children else None

        return self.tree.walk(root_key, follow)[1]

    def walk(self, root_key: str, choose: Callable[[Mapping[str, CachedSegment]], str | None],
             ) -> tuple[list[str], int]:
        return self.tree.walk(root_key, choose)

    @property
    def enabled(self) -> bool:
        return True

    @property
    def keeps_paths(self) -> bool:
        return True

    def stats(self) -> KVTreeStats:
        return self.tree.stats()

    def subscribe(self, listener: Callable[[KVEvent], None]) -> bool:
        self.tree.subscribe(listener)
        return True

    def close(self) -> None:
        self.tree.close()


class PlanningView:
    """What the planner sees of an engine's cache: the walk and the namespaced root key
    (:class:`slimrag.rag.plan.PlanningCache`)."""

    def __init__(self, reuse: KVReuse, namespace: str) -> None:
        self.reuse, self.namespace = reuse, namespace

    def root_key(self, prompt: Prompt) -> str:
        """The tree root under which the engine files ``prompt``."""
        return root_key(self.namespace, prompt.system_key())

    def walk(self, root_key: str, choose: Callable[[Mapping[str, CachedSegment]], str | None],
             ) -> tuple[list[str], int]:
        return self.reuse.walk(root_key, choose)
