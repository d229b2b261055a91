"""`Node`: one cached segment of the knowledge tree, with the bookkeeping eviction reads.

The tree (:mod:`slimrag.llm.kv.tree`) links nodes by key; the tiers (:mod:`slimrag.llm.kv.tiers`)
move their payloads and files; the policies (:mod:`slimrag.llm.kv.eviction`) rank them by
``hits``, ``last_use``, ``clock``, ``cost`` and ``nbytes``.
"""

from __future__ import annotations

from slimrag.llm.kv.payload import SegmentKV


class Node:
    """One cached segment. ``tier`` indexes the tree's tier list (the disk tier when only the file
    holds it); ``kv`` is None exactly then. ``disk`` is the file handle, kept after promotion.
    The tree's hidden sentinel is the one node without a parent; it sits in tier 0, so its
    children (the roots) may live in any tier."""

    __slots__ = ("key", "parent", "children", "id", "kv", "tokens", "nbytes", "cost", "hits",
                 "last_use", "clock", "pins", "tier", "disk")

    def __init__(self, key: str, parent: Node | None, node_id: int, kv: SegmentKV | None = None,
                 cost: float = 0.0, tier: int = 0) -> None:
        self.key, self.parent, self.id = key, parent, node_id
        self.children: dict[str, Node] = {}
        self.kv = kv
        self.tokens = kv.tokens if kv else 0
        self.nbytes = kv.nbytes if kv else 0
        self.cost = cost
        self.hits = 1
        self.last_use = 0
        self.clock = 0.0  # GDSF: the global clock at the last access
        self.pins = 0
        self.tier = tier
        self.disk: str | None = None

    def __repr__(self) -> str:
        return f"Node({self.key!r}, tokens={self.tokens}, tier={self.tier}, hits={self.hits}, pins={self.pins})"

    def path(self) -> tuple[str, ...]:
        """The keys from the root down to this node (root key first; empty for the sentinel)."""
        keys: list[str] = []
        node: Node | None = self
        while node is not None and node.parent is not None:
            keys.append(node.key)
            node = node.parent
        return tuple(reversed(keys))
