"""Eviction policies of the knowledge tree: each orders eviction candidates by a priority tuple.

A policy is a tiny class (SGLang's ``mem_cache`` style) that turns a node's bookkeeping into a
tuple; the tree (:mod:`slimrag.llm.kv.tree`) evicts the smallest tuple among the unpinned leaves of
a tier. Policies are picked by name from :data:`EVICTION_POLICIES`, never by an if/elif chain.

- ``gdsf`` (default, RAGCache's prefix-aware Greedy-Dual-Size-Frequency):
  ``clock_at_last_access + hits * recompute_cost / bytes``. Cheap-to-recompute, large, rarely used
  segments go first; the clock (raised to each victim's priority) ages old popularity without
  timers.
- ``lru``: least recently used first. ``lfu``: least frequently used first, least recent among
  equals. Both are baselines for the benchmarks.
"""

from __future__ import annotations

from typing import Protocol


class EvictionCandidate(Protocol):
    """What a policy reads of a node (see ``kvtree.Node``)."""

    hits: int
    last_use: int
    clock: float
    cost: float
    nbytes: int


class EvictionPolicy:
    """Orders eviction candidates: the smallest :meth:`priority` tuple goes first."""

    def priority(self, node: EvictionCandidate) -> tuple[float, ...]:
        """The node's priority tuple; lower is evicted sooner."""
        raise NotImplementedError

    def aged(self, clock: float, victim: tuple[float, ...]) -> float:
        """The global clock after evicting a node of priority ``victim`` (unchanged by default)."""
        return clock


class GDSF(EvictionPolicy):
    """Greedy-Dual-Size-Frequency: ``clock_at_access + hits * cost / size``, then least recent."""

    def priority(self, node: EvictionCandidate) -> tuple[float, ...]:
        return (node.clock + node.hits * node.cost / max(node.nbytes, 1), float(node.last_use))

    def aged(self, clock: float, victim: tuple[float, ...]) -> float:
        return max(clock, victim[0])


class LRU(EvictionPolicy):
    """Least recently used first."""

    def priority(self, node: EvictionCandidate) -> tuple[float, ...]:
        return (float(node.last_use),)


class LFU(EvictionPolicy):
    """Least frequently used first, least recent among equals."""

    def priority(self, node: EvictionCandidate) -> tuple[float, ...]:
        return (float(node.hits), float(node.last_use))


EVICTION_POLICIES: dict[str, type[EvictionPolicy]] = {"gdsf": GDSF, "lru": LRU, "lfu": LFU}
