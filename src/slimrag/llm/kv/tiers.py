"""The tiers of the knowledge tree: where each node's KV lives, and how nodes move between tiers.

The tree (:mod:`slimrag.llm.kv.tree`) decides which segments are cached; :class:`Tiers` decides
where, within byte budgets, and what leaves to make room.

Eviction: prefix-aware Greedy-Dual-Size-Frequency
--------------------------------------------------
Each node carries ``priority = L + hits * cost / nbytes`` where ``L`` is the value of the global
clock at the node's last access, ``cost`` its recompute cost (``payload.prefill_cost``: tokens times
position-dependent attention work, or a measured figure) and ``nbytes`` its size. The victim is
the lowest-priority **leaf** of a tier (a node none of whose children live in that tier), so a
prefix always outlives its continuations; evicting a leaf may expose its parent. Pinned nodes
(held by an unreleased ``Match``) are never moved. After each eviction the clock rises to
the victim's priority (GDSF aging), so old popularity decays without any per-node timers. Other
policies (``"lru"``, ``"lfu"``) live in :data:`EVICTION_POLICIES`.

Tiers
-----
``device`` (the model's accelerator), ``host`` (CPU memory) and ``disk`` (files), each with a
byte budget in :class:`CacheConfig`. With ``device="cpu"`` the device *is* host memory and the
tiers collapse to host + disk. A node evicted from a tier is demoted to the next tier with room;
it is written to disk once and the file is kept after a later promotion, so a second demotion
costs nothing. A node is dropped from the tree only when no lower tier can take it (dropping a
node drops its subtree, which by the invariant below lives in lower tiers and holds no pins).
A hit promotes nodes back up (never above their parent's tier). Kept files count against the
disk budget; when it is short, the disk tier deletes the lowest-priority kept files (their nodes
live on above) or drops disk-only leaves. Invariant: a child's tier is never above its parent's,
and every tier's byte count stays within its budget at all times, peaks included.

Cost
----
O(log n) per eviction, n = cached segments: each tier keeps a heap of its evictable nodes, fed
whenever a node may become evictable (placed, moved, unpinned, a child gone) and checked lazily
when popped; it is rebuilt by a full scan when stale entries outnumber the nodes four to one.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Callable

from slimrag.llm.kv.config import DISK, CacheConfig
from slimrag.llm.kv.eviction import EVICTION_POLICIES
from slimrag.llm.kv.node import Node
from slimrag.llm.kv.payload import SegmentKV
from slimrag.llm.kv.storage import KVStorage


class Tiers:
    """Where the nodes of one tree live (see the module header).

    Read-only attributes: ``names`` (tier names, top first; tier arguments are indexes into it),
    ``budgets``, ``used`` and ``peak`` (bytes per tier), ``members`` (the nodes of each tier),
    ``disk_tier`` (index or None), ``memory_tiers`` (how many tiers hold payloads in memory),
    ``clock`` (the policy's global clock: the priority of the last victim), ``counts``
    (``inserted_tokens``, ``evictions``, ``demotions``, ``promotions``, ``discards``).

    Not locked: the tree calls it under its own lock.
    """

    def __init__(self, config: CacheConfig, storage: KVStorage) -> None:
        self.storage = storage
        self.policy = EVICTION_POLICIES[config.policy]()
        named = config.tiers()
        self.names = [name for name, _ in named]
        self.budgets = [budget for _, budget in named]
        self.used = [0] * len(named)
        self.peak = [0] * len(named)
        self.members: list[set[Node]] = [set() for _ in named]
        self.disk_tier: int | None = self.names.index(DISK) if DISK in self.names else None
        self.memory_tiers = len(named) - (self.disk_tier is not None)
        self.clock = 0.0
        self.counts = dict.fromkeys(("inserted_tokens", "evictions", "demotions", "promotions", "discards"), 0)
        # Per tier, a heap of (priority, seq, node) holding a current entry for every evictable
        # node; stale entries (priority changed, node moved or pinned) are skipped when popped.
        self._heaps: list[list[tuple[tuple[float, ...], int, Node]]] = [[] for _ in named]
        self._seq = itertools.count()
        self._ids = itertools.count(1)  # node ids (disk file names); the sentinel is 0
        #: Told of every change: ("stored" | "removed" | "moved", node, the tier it was in before
        #: a move, else its tier); set by `KVTree.subscribe` (`slimrag.llm.kv.events`).
        self.observer: Callable[[str, Node, int], None] | None = None

    def offer(self, node: Node | None) -> None:
        """Push ``node`` as a candidate of every tier it may now be evictable from (call it when
        a node may have become evictable: placed, moved, touched, unpinned, a child gone)."""
        if node is None or node.parent is None or node.pins:  # None, the sentinel, or pinned
            return
        self._push(node.tier, node)
        if node.disk is not None and node.tier != self.disk_tier:
            assert self.disk_tier is not None
            self._push(self.disk_tier, node)

    def place(self, parent: Node, key: str, kv: SegmentKV, cost: float, tick: int) -> Node | None:
        """A new child of ``parent`` holding ``kv``, in the highest memory tier with room not
        above its parent's (evicting as needed); None when it fits nowhere."""
        for tier in range(parent.tier, self.memory_tiers):
            if self._make_room(tier, kv.nbytes):
                node = Node(key, parent, next(self._ids), self.storage.move(kv, self.names[tier]), cost, tier)
                node.last_use, node.clock = tick, self.clock
                parent.children[key] = node
                self.members[tier].add(node)
                self._account(tier, node.nbytes)
                self.counts["inserted_tokens"] += node.tokens
                if self.storage.persistent:
                    self._write_through(node)
                self.offer(node)
                self._observe("stored", node, tier)
                return node
        return None

    def adopt(self, parent: Node, key: str, tokens: int, nbytes: int, handle: str, cost: float,
              tick: int) -> Node | None:
        """A disk-only child of ``parent`` for a file a persistent tier found when it opened
        (``handle``; see :mod:`slimrag.llm.kv.persist`), evicting on disk as needed; None (and
        the file deleted) when it fits nowhere or there is no disk tier."""
        disk = self.disk_tier
        parent.pins += 1  # making room must not evict the parent: the child would hang off nothing
        try:
            room = disk is not None and self._make_room(disk, nbytes)
        finally:
            parent.pins -= 1
            self.offer(parent)
        if not room:
            self.storage.delete(handle)
            return None
        assert disk is not None
        node = Node(key, parent, next(self._ids), None, cost, disk)
        node.tokens, node.nbytes, node.disk = tokens, nbytes, handle
        node.last_use, node.clock = tick, self.clock
        parent.children[key] = node
        self.members[disk].add(node)
        self._account(disk, nbytes)
        self.offer(node)
        self._observe("stored", node, disk)
        return node

    def forget(self, sentinel: Node) -> None:
        """Forget every node without deleting any file (a persistent tier closing)."""
        sentinel.children.clear()
        self.members = [set() for _ in self.names]
        self.used = [0] * len(self.names)
        self._heaps = [[] for _ in self.names]

    def promote(self, node: Node, floor: int) -> None:
        """Move a pinned node up to the highest memory tier in [floor, node.tier) with room."""
        for tier in range(floor, min(node.tier, self.memory_tiers)):
            if not self._make_room(tier, node.nbytes):
                continue
            if node.kv is None:
                assert node.disk is not None
                try:
                    kv = self.storage.read(node.disk)
                except (OSError, ValueError) as e:  # gone (another process evicted it) or damaged
                    logging.getLogger(__name__).info("KV segment %s is a miss: %s", node.disk, e)
                    self._delete_file(node)  # the node is left without payload or file: the tree drops it
                    return
            else:
                kv = node.kv
                self._account(node.tier, -node.nbytes)
            self._move(node, tier, self.storage.move(kv, self.names[tier]))
            self.counts["promotions"] += 1
            return

    def free(self, tier: int, target: int) -> bool:
        """Evict lowest-priority candidates from ``tier`` until its usage is <= ``target``; False
        when everything left there is pinned."""
        while self.used[tier] > target:
            heap = self._heaps[tier]  # fetched each time: a cascade may have rebuilt it
            if not heap:
                return False
            prio, _, node = heapq.heappop(heap)
            if not self._evictable(node, tier) or self.policy.priority(node) != prio:
                continue  # stale: a current entry exists if the node is a candidate at all
            self.clock = self.policy.aged(self.clock, prio)
            self._evict_one(node, tier)
        return True

    def drop(self, node: Node) -> None:
        """Remove ``node`` and its subtree from the tree (none of them may be pinned)."""
        for child in list(node.children.values()):
            self.drop(child)
        assert node.pins == 0, f"dropping pinned {node}"
        self._observe("removed", node, node.tier)
        if node.kv is not None:
            self._account(node.tier, -node.nbytes)
        if node.disk is not None:
            self._delete_file(node)
        self.members[node.tier].discard(node)
        node.kv = None
        self.counts["evictions"] += 1
        if node.parent is not None:
            del node.parent.children[node.key]
            self.offer(node.parent)

    # -- internals -----------------------------------------------------------------------------

    def _push(self, tier: int, node: Node) -> None:
        heap = self._heaps[tier]
        heapq.heappush(heap, (self.policy.priority(node), next(self._seq), node))
        if len(heap) > 4 * sum(len(m) for m in self.members) + 256:
            self._heaps[tier] = [(self.policy.priority(n), next(self._seq), n) for n in self._candidates(tier)]
            heapq.heapify(self._heaps[tier])

    def _account(self, tier: int, delta: int) -> None:
        self.used[tier] += delta
        self.peak[tier] = max(self.peak[tier], self.used[tier])

    def _move(self, node: Node, tier: int, kv: SegmentKV | None) -> None:
        """Re-home ``node`` in ``tier`` (its old tier's bytes are already uncounted)."""
        old = node.tier
        self.members[node.tier].discard(node)
        self.members[tier].add(node)
        node.tier, node.kv = tier, kv
        if kv is not None:
            self._account(tier, node.nbytes)
        self.offer(node)
        self.offer(node.parent)  # it may have lost its last child in the old tier
        self._observe("moved", node, old)

    def _observe(self, change: str, node: Node, tier: int) -> None:
        if self.observer is not None:
            self.observer(change, node, tier)

    def _evictable(self, node: Node, tier: int) -> bool:
        if node.pins:
            return False
        if tier == self.disk_tier:
            # The disk tier frees a kept file (the node lives above) or drops a disk-only leaf.
            return node.disk is not None and (node.tier < tier or not node.children)
        return node in self.members[tier] and all(c.tier != tier for c in node.children.values())

    def _candidates(self, tier: int) -> list[Node]:
        pool = self.members[tier]
        if tier == self.disk_tier:
            pool = {n for m in self.members for n in m if n.disk is not None}
        return [n for n in pool if self._evictable(n, tier)]

    def _make_room(self, tier: int, nbytes: int) -> bool:
        """Evict from ``tier`` until ``nbytes`` more fit; False when the budget is too small or
        everything left there is pinned (what was evicted meanwhile stays evicted)."""
        if nbytes > self.budgets[tier]:
            return False
        return self.free(tier, self.budgets[tier] - nbytes)

    def _evict_one(self, node: Node, tier: int) -> None:
        if tier == self.disk_tier:
            if node.tier < tier:  # the node lives above: lose only its kept file
                self._delete_file(node)
                self.counts["discards"] += 1
            else:
                self.drop(node)
            return
        # Demote to the next tier with room, never below a child (that would break tier order).
        limit = min([c.tier for c in node.children.values()] + [len(self.names) - 1])
        for lower in range(tier + 1, limit + 1):
            if self._demote(node, tier, lower):
                self.counts["demotions"] += 1
                return
        self.drop(node)

    def _demote(self, node: Node, tier: int, lower: int) -> bool:
        assert node.kv is not None
        kv: SegmentKV | None = None
        if lower == self.disk_tier:
            if node.disk is None:  # written once; a kept file makes later demotions free
                if not self._make_room(lower, node.nbytes):
                    return False
                node.disk = self.storage.write(node.kv, node.path())
                self._account(lower, node.nbytes)
        elif self._make_room(lower, node.nbytes):
            kv = self.storage.move(node.kv, self.names[lower])
        else:
            return False
        self._account(tier, -node.nbytes)
        self._move(node, lower, kv)
        return True

    def _write_through(self, node: Node) -> None:
        """Give a new node its file now (a persistent tier keeps every node, not only demoted
        ones); a full or unwritable disk leaves it without one, with a warning."""
        disk = self.disk_tier
        if disk is None or node.kv is None or not self._make_room(disk, node.nbytes):
            return
        try:
            node.disk = self.storage.write(node.kv, node.path())
        except OSError as e:
            logging.getLogger(__name__).warning("could not keep a KV segment on disk (%s); it stays in "
                                                "memory only. Free space or lower disk_bytes.", e)
            return
        self._account(disk, node.nbytes)

    def _delete_file(self, node: Node) -> None:
        assert node.disk is not None and self.disk_tier is not None
        self.storage.delete(node.disk)
        node.disk = None
        self._account(self.disk_tier, -node.nbytes)
