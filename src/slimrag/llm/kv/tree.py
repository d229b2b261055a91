"""The knowledge tree: key/value states of prompt segments, reused across requests.

Sources: RAGCache (arXiv 2404.12457), SGLang RadixAttention (``mem_cache/radix_cache.py``).

Structure
---------
A prompt is ``[system][passage]...[question]`` (see :mod:`slimrag.prompt`); each segment is
tokenized on its own, so the KV of a passage depends only on the segments *before* it. The tree
stores exactly that: a hidden sentinel has one child per **root key** (the system segment's
content key with the model name folded in, so different system prompts or models never share
entries); below a root, each edge is a passage's content key (``Prompt.passage_key``: chunk id
plus a digest of its text) and each node holds the KV of its segment computed after the path
above it. A request walks the tree along its
passage order (:meth:`KVTree.match`), prefills only the unmatched suffix, and adds it
(:meth:`KVTree.insert`). A key must identify its segment's token ids: if a chunk's text can change
under the same id, fold a content hash into the key.

Eviction: prefix-aware Greedy-Dual-Size-Frequency
--------------------------------------------------
Each node carries ``priority = L + hits * cost / nbytes`` where ``L`` is the value of the global
clock at the node's last access, ``cost`` its recompute cost (:func:`prefill_cost`: tokens times
position-dependent attention work, or a measured figure) and ``nbytes`` its size. The victim is
the lowest-priority **leaf** of a tier (a node none of whose children live in that tier), so a
prefix always outlives its continuations; evicting a leaf may expose its parent. Pinned nodes
(held by an unreleased :class:`Match`) are never moved. After each eviction the clock rises to
the victim's priority (GDSF aging), so old popularity decays without any per-node timers. Other
policies (``"lru"``, ``"lfu"``) live in :data:`EVICTION_POLICIES`.

Tiers
-----
``device`` (the model's accelerator), ``host`` (CPU memory) and ``disk`` (files), each with a
byte budget in :class:`KVTreeConfig`. With ``device="cpu"`` the device *is* host memory and the
tiers collapse to host + disk. A node evicted from a tier is demoted to the next tier with room;
it is written to disk once and the file is kept after a later promotion, so a second demotion
costs nothing. A node is dropped from the tree only when no lower tier can take it (dropping a
node drops its subtree, which by the invariant below lives in lower tiers and holds no pins).
A hit promotes nodes back up (never above their parent's tier). Kept files count against the
disk budget; when it is short, the disk tier deletes the lowest-priority kept files (their nodes
live on above) or drops disk-only leaves. Invariant: a child's tier is never above its parent's,
and every tier's byte count stays within its budget at all times, peaks included.

Cost: match and insert are O(depth) plus O(log n) per eviction, n = cached segments: each tier
keeps a heap of its evictable nodes, fed whenever a node may become evictable (placed, moved,
unpinned, a child gone) and checked lazily when popped; it is rebuilt by a full scan when stale
entries outnumber the nodes four to one.

Engine usage (``slimrag.llm.kv.reuse.TreeReuse`` does exactly this for the embedded engine)::

    m = tree.match(root, keys)                       # pins the cached prefix
    try:
        past = assemble_kv(m.payloads, device) if m.nodes else None  # -> DynamicCache(past)
        ...prefill the segments after m.nodes, one forward each, on top of past...
        tree.insert(root, keys, split_kv(cache_layers(cache), seg_lengths, first=len(m.nodes)))
    finally:
        tree.release(m)

Modules: payloads and tensor helpers live in :mod:`slimrag.llm.kv.payload`, eviction policies in
:mod:`slimrag.llm.kv.eviction`, tier storage in :mod:`slimrag.llm.kv.storage`, the budgets in
:class:`slimrag.config.CacheConfig` (``KVTreeConfig`` is the same class); this module re-exports
the names it always had.

Thread-safety: every public method of :class:`KVTree` takes one re-entrant lock, so any number of
threads may call it. Disk reads and writes happen under that lock (simple; a slow disk stalls
other requests for a moment). Payloads of pinned nodes are never moved or freed, so an engine may
read ``match.payloads`` outside the lock until it calls :meth:`KVTree.release`.

Simulated mode (:meth:`KVTree.simulated`) keeps only sizes: no model, no tensors, no files; the
same eviction and tier logic runs, which is what the unit tests exercise. torch is imported only
by the tensor helpers and the real storage.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from slimrag.llm.kv.config import DISK, CacheConfig
from slimrag.llm.kv.eviction import EVICTION_POLICIES
from slimrag.llm.kv.payload import (  # noqa: F401  (re-exported: the tree's public helpers)
    SegmentKV,
    assemble_kv,
    cache_layers,
    prefill_cost,
    segment_key,
    split_kv,
)
from slimrag.llm.kv.storage import KVStorage, SimulatedStorage, TorchStorage

#: The tree's configuration; it lives in :mod:`slimrag.config` as ``CacheConfig``.
KVTreeConfig = CacheConfig

__all__ = ["EVICTION_POLICIES", "KVTree", "KVTreeConfig", "KVTreeStats", "Match", "Node", "SegmentKV",
           "TierStats", "assemble_kv", "cache_layers", "prefill_cost", "segment_key", "split_kv"]


# ---------------------------------------------------------------------------------------------
# Nodes and matches


class Node:
    """One cached segment. ``tier`` indexes the tree's tier list (the disk tier when only the file
    holds it); ``kv`` is None exactly then. ``disk`` is the file handle, kept after promotion."""

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


@dataclass(slots=True, eq=False)
class Match:
    """The cached prefix of one request: ``nodes`` (system segment first, then passages in path
    order) and their total ``tokens``. Its nodes stay pinned until :meth:`KVTree.release`."""

    root_key: str
    path: tuple[str, ...]
    nodes: tuple[Node, ...]
    tokens: int
    released: bool = field(default=False, repr=False)

    @property
    def passages(self) -> int:
        """How many passages of ``path`` are cached (the system segment not counted)."""
        return max(0, len(self.nodes) - 1)

    @property
    def payloads(self) -> list[SegmentKV]:
        """The matched segments' KV, in prompt order; valid until release."""
        return [n.kv for n in self.nodes if n.kv is not None]


@dataclass(frozen=True, slots=True)
class TierStats:
    """Bytes held by one tier now and at most, its budget and its node count."""

    name: str
    budget: int
    used: int
    peak: int
    nodes: int


@dataclass(frozen=True, slots=True)
class KVTreeStats:
    """Counters since the tree was made. ``hits``/``misses`` count segments, the system segment
    included: a request for 3 passages whose system segment and first passage are cached is 2
    hits and 2 misses. ``evictions`` counts nodes dropped from the tree, ``demotions`` /
    ``promotions`` moves between tiers, ``discards`` disk backups deleted while the node lives on
    above. ``served_tokens`` are prompt tokens matched, ``inserted_tokens`` tokens added."""

    tiers: tuple[TierStats, ...]
    nodes: int
    requests: int
    hits: int
    misses: int
    served_tokens: int
    inserted_tokens: int
    evictions: int
    demotions: int
    promotions: int
    discards: int


class KVTree:
    """The knowledge tree; see the module header for the algorithm and the thread-safety rule.

    Build with ``KVTree(config)`` (real tensors, torch storage) or ``KVTree.simulated(config)``
    (sizes only). Read-only attributes: ``names`` (tier names, top first; tier arguments are
    indexes into it), ``budgets``, ``used`` and ``peak`` (bytes per tier; :meth:`stats` gives a
    consistent snapshot), ``disk_tier`` (index or None).
    """

    def __init__(self, config: KVTreeConfig | None = None, storage: KVStorage | None = None) -> None:
        self.config = config or KVTreeConfig()
        self.storage: KVStorage = storage if storage is not None else TorchStorage(self.config)
        self.policy = EVICTION_POLICIES[self.config.policy]()
        named = self.config.tiers()
        self.names = [name for name, _ in named]
        self.budgets = [budget for _, budget in named]
        self.used = [0] * len(named)
        self.peak = [0] * len(named)
        self.members: list[set[Node]] = [set() for _ in named]
        self.disk_tier: int | None = self.names.index(DISK) if DISK in self.names else None
        self.memory_tiers = len(named) - (self.disk_tier is not None)
        # Per tier, a heap of (priority, seq, node) holding a current entry for every evictable
        # node; stale entries (priority changed, node moved or pinned) are skipped when popped.
        self._heaps: list[list[tuple[tuple[float, ...], int, Node]]] = [[] for _ in named]
        self._seq = itertools.count()
        self._sentinel = Node("", None, 0)
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._tick = 0
        self._clock = 0.0
        self._counts = dict.fromkeys(
            ("requests", "hits", "misses", "served_tokens", "inserted_tokens", "evictions",
             "demotions", "promotions", "discards"), 0)

    @classmethod
    def simulated(cls, config: KVTreeConfig | None = None) -> KVTree:
        """A tree that stores sizes only (use :meth:`SegmentKV.simulated` payloads)."""
        return cls(config, SimulatedStorage())

    @property
    def clock(self) -> float:
        """The eviction policy's global clock (GDSF's ``L``): the priority of the last victim."""
        return self._clock

    def priority(self, node: Node) -> tuple[float, ...]:
        """``node``'s current eviction priority under the tree's policy (lower goes sooner)."""
        return self.policy.priority(node)

    # -- public API ---------------------------------------------------------------------------

    def match(self, root_key: str, path: Sequence[str]) -> Match:
        """Find the longest cached prefix of ``[root_key, *path]``.

        Returns a :class:`Match` with the cached nodes (possibly none: a root miss) and their
        token count. Side effects: each matched node is pinned (never moved or evicted until
        :meth:`release`), its hit count and last use are bumped and its GDSF priority refreshed,
        and it is promoted to the highest memory tier with room that is not above its parent's;
        promoting may demote or drop other, unpinned nodes. A node that only lives on disk and
        fits no memory tier ends the match there. Hit/miss/served-token counters are updated.
        Keys are compared exactly: the root key is the namespace.
        """
        with self._lock:
            self._tick += 1
            nodes: list[Node] = []
            parent = self._sentinel
            for key in (root_key, *path):
                child = parent.children.get(key)
                if child is None:
                    break
                child.pins += 1
                self._promote(child, self._tier_floor(parent))
                if child.kv is None:
                    self._unpin(child)
                    break
                self._touch(child)
                nodes.append(child)
                parent = child
            tokens = sum(n.tokens for n in nodes)
            self._counts["requests"] += 1
            self._counts["hits"] += len(nodes)
            self._counts["misses"] += len(path) + 1 - len(nodes)
            self._counts["served_tokens"] += tokens
            return Match(root_key, tuple(path), tuple(nodes), tokens)

    def release(self, match: Match) -> None:
        """Unpin a match's nodes (they become evictable again). Releasing twice is an error."""
        with self._lock:
            if match.released:
                raise ValueError("this match was already released")
            match.released = True
            for node in match.nodes:
                self._unpin(node)

    @contextmanager
    def matching(self, root_key: str, path: Sequence[str]) -> Iterator[Match]:
        """``with tree.matching(root, path) as m:`` – :meth:`match`, then :meth:`release` on exit."""
        m = self.match(root_key, path)
        try:
            yield m
        finally:
            self.release(m)

    def insert(self, root_key: str, path: Sequence[str], payloads: Sequence[SegmentKV],
               costs: Sequence[float] | None = None) -> int:
        """Add freshly computed segments after a prefill; returns how many nodes were added.

        ``payloads`` are the KV of the *last* ``len(payloads)`` segments of ``[root_key, *path]``
        (typically the unmatched suffix, ``split_kv(..., first=len(match.nodes))``); the
        segments before them must already be in the tree (hold the match while inserting so they
        cannot be evicted meanwhile), otherwise nothing is added. Segments that another request
        inserted meanwhile are kept, not replaced (the given payload is dropped). ``costs``
        (optional, aligned with ``payloads``) override :func:`prefill_cost`; use one kind of cost
        for a whole tree. New nodes go to the highest memory tier with room not above their
        parent's, evicting as needed; a segment that fits nowhere (or whose parent lives only on
        disk) ends the insertion.
        """
        keys = (root_key, *path)
        start = len(keys) - len(payloads)
        if start < 0:
            raise ValueError(f"{len(payloads)} payloads for a path of only {len(keys)} segments")
        if costs is not None and len(costs) != len(payloads):
            raise ValueError("costs must be aligned with payloads")
        with self._lock:
            self._tick += 1
            held: list[Node] = []  # the walked path is pinned so making room cannot evict it
            try:
                parent, position = self._sentinel, 0
                for key in keys[:start]:
                    child = parent.children.get(key)
                    if child is None:
                        return 0
                    child.pins += 1
                    held.append(child)
                    parent, position = child, position + child.tokens
                added = 0
                for i, key in enumerate(keys[start:]):
                    kv = payloads[i]
                    child = parent.children.get(key)
                    if child is None:
                        cost = costs[i] if costs is not None else prefill_cost(
                            kv.tokens, position, self.config.attention_scale)
                        child = self._place(parent, key, kv, cost)
                        if child is None:
                            break
                        added += 1
                    else:
                        self._touch(child)
                    child.pins += 1
                    held.append(child)
                    parent, position = child, position + child.tokens
                return added
            finally:
                for node in held:
                    self._unpin(node)

    def evict(self, bytes_needed: int, tier: int = 0) -> int:
        """Free at least ``bytes_needed`` in tier ``tier`` (0 = the top memory tier) by demoting or
        dropping lowest-priority unpinned leaves; returns the bytes actually freed (less when
        everything left is pinned)."""
        with self._lock:
            before = self.used[tier]
            self._free(tier, max(0, before - bytes_needed))
            return before - self.used[tier]

    def walk(self, root_key: str, choose: Callable[[Mapping[str, Node]], str | None]) -> tuple[list[str], int]:
        """Follow a path chosen step by step, with no side effects (for the planner).

        From the root ``root_key``, call ``choose(children)`` with the current node's children
        (key -> node; read ``.tokens``, do not mutate) and descend to the key it returns, until it
        returns None. Returns the chosen keys and the cached tokens along them, the system segment
        included; ``([], 0)`` when the root is not cached. ``choose`` must return one of the
        children's keys or None; it runs under the tree's lock, so keep it short.
        """
        with self._lock:
            node = self._sentinel.children.get(root_key)
            if node is None:
                return [], 0
            keys, tokens = [], node.tokens
            while (key := choose(node.children)) is not None:
                node = node.children[key]
                keys.append(key)
                tokens += node.tokens
            return keys, tokens

    def stats(self) -> KVTreeStats:
        """A snapshot of the counters and per-tier bytes."""
        with self._lock:
            tiers = tuple(TierStats(self.names[t], self.budgets[t], self.used[t], self.peak[t],
                                    len(self.members[t])) for t in range(len(self.names)))
            return KVTreeStats(tiers, sum(len(m) for m in self.members), **self._counts)

    def nodes(self) -> list[Node]:
        """Every node, parents before children (a snapshot list; do not mutate the nodes)."""
        with self._lock:
            out, stack = [], list(self._sentinel.children.values())
            while stack:
                node = stack.pop()
                out.append(node)
                stack.extend(node.children.values())
            return out

    def check(self) -> None:
        """Verify the invariants (budgets, tier order, byte counts); raises AssertionError. For tests."""
        with self._lock:
            used = [0] * len(self.names)
            for node in self.nodes():
                assert node.parent is not None and node.parent.children.get(node.key) is node
                assert node.tier >= self._tier_floor(node.parent), f"{node} sits above its parent"
                assert (node.kv is None) == (node.tier == self.disk_tier), f"{node} payload/tier mismatch"
                assert node in self.members[node.tier]
                if node.kv is not None:
                    used[node.tier] += node.nbytes
                if node.disk is not None:
                    assert self.disk_tier is not None
                    used[self.disk_tier] += node.nbytes
                assert node.pins >= 0
            assert used == self.used, f"byte counts {self.used} != recomputed {used}"
            assert sum(len(m) for m in self.members) == len(self.nodes()), "tier membership drifted"
            for t in range(len(self.names)):
                assert self.peak[t] <= self.budgets[t], f"tier {self.names[t]} peak over budget"

    def close(self) -> None:
        """Drop every node and delete the disk tier's files."""
        with self._lock:
            for root in list(self._sentinel.children.values()):
                self._drop(root)
            self.storage.close()

    # -- internals (caller holds the lock) -----------------------------------------------------

    def _tier_floor(self, parent: Node) -> int:
        return 0 if parent is self._sentinel else parent.tier

    def _touch(self, node: Node) -> None:
        node.hits += 1
        node.last_use = self._tick
        node.clock = self._clock
        self._offer(node)

    def _unpin(self, node: Node) -> None:
        node.pins -= 1
        self._offer(node)

    def _offer(self, node: Node | None) -> None:
        """Push ``node`` as a candidate of every tier it may now be evictable from."""
        if node is None or node is self._sentinel or node.pins:
            return
        self._push(node.tier, node)
        if node.disk is not None and node.tier != self.disk_tier:
            assert self.disk_tier is not None
            self._push(self.disk_tier, node)

    def _push(self, tier: int, node: Node) -> None:
        heap = self._heaps[tier]
        heapq.heappush(heap, (self.policy.priority(node), next(self._seq), node))
        if len(heap) > 4 * sum(len(m) for m in self.members) + 256:
            self._heaps[tier] = [(self.policy.priority(n), next(self._seq), n) for n in self._candidates(tier)]
            heapq.heapify(self._heaps[tier])

    def _account(self, tier: int, delta: int) -> None:
        self.used[tier] += delta
        self.peak[tier] = max(self.peak[tier], self.used[tier])

    def _place(self, parent: Node, key: str, kv: SegmentKV, cost: float) -> Node | None:
        for tier in range(self._tier_floor(parent), self.memory_tiers):
            if self._make_room(tier, kv.nbytes):
                node = Node(key, parent, next(self._ids), self.storage.move(kv, self.names[tier]), cost, tier)
                node.last_use, node.clock = self._tick, self._clock
                parent.children[key] = node
                self.members[tier].add(node)
                self._account(tier, node.nbytes)
                self._counts["inserted_tokens"] += node.tokens
                self._offer(node)
                return node
        return None

    def _promote(self, node: Node, floor: int) -> None:
        """Move a pinned node up to the highest memory tier in [floor, node.tier) with room."""
        for tier in range(floor, min(node.tier, self.memory_tiers)):
            if not self._make_room(tier, node.nbytes):
                continue
            if node.kv is None:
                assert node.disk is not None
                kv = self.storage.read(node.disk)
            else:
                kv = node.kv
                self._account(node.tier, -node.nbytes)
            self._move(node, tier, self.storage.move(kv, self.names[tier]))
            self._counts["promotions"] += 1
            return

    def _move(self, node: Node, tier: int, kv: SegmentKV | None) -> None:
        """Re-home ``node`` in ``tier`` (its old tier's bytes are already uncounted)."""
        self.members[node.tier].discard(node)
        self.members[tier].add(node)
        node.tier, node.kv = tier, kv
        if kv is not None:
            self._account(tier, node.nbytes)
        self._offer(node)
        self._offer(node.parent)  # it may have lost its last child in the old tier

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
        return self._free(tier, self.budgets[tier] - nbytes)

    def _free(self, tier: int, target: int) -> bool:
        """Evict lowest-priority candidates from ``tier`` until its usage is <= ``target``."""
        while self.used[tier] > target:
            heap = self._heaps[tier]  # fetched each time: a cascade may have rebuilt it
            if not heap:
                return False
            prio, _, node = heapq.heappop(heap)
            if not self._evictable(node, tier) or self.policy.priority(node) != prio:
                continue  # stale: a current entry exists if the node is a candidate at all
            self._clock = self.policy.aged(self._clock, prio)
            self._evict_one(node, tier)
        return True

    def _evict_one(self, node: Node, tier: int) -> None:
        if tier == self.disk_tier:
            if node.tier < tier:  # the node lives above: lose only its kept file
                self._delete_file(node)
                self._counts["discards"] += 1
            else:
                self._drop(node)
            return
        # Demote to the next tier with room, never below a child (that would break tier order).
        limit = min([c.tier for c in node.children.values()] + [len(self.names) - 1])
        for lower in range(tier + 1, limit + 1):
            if self._demote(node, tier, lower):
                self._counts["demotions"] += 1
                return
        self._drop(node)

    def _demote(self, node: Node, tier: int, lower: int) -> bool:
        assert node.kv is not None
        kv: SegmentKV | None = None
        if lower == self.disk_tier:
            if node.disk is None:  # written once; a kept file makes later demotions free
                if not self._make_room(lower, node.nbytes):
                    return False
                node.disk = self.storage.write(node.kv, str(node.id))
                self._account(lower, node.nbytes)
        elif self._make_room(lower, node.nbytes):
            kv = self.storage.move(node.kv, self.names[lower])
        else:
            return False
        self._account(tier, -node.nbytes)
        self._move(node, lower, kv)
        return True

    def _delete_file(self, node: Node) -> None:
        assert node.disk is not None and self.disk_tier is not None
        self.storage.delete(node.disk)
        node.disk = None
        self._account(self.disk_tier, -node.nbytes)

    def _drop(self, node: Node) -> None:
        """Remove ``node`` and its subtree from the tree (none of them may be pinned)."""
        for child in list(node.children.values()):
            self._drop(child)
        assert node.pins == 0, f"dropping pinned {node}"
        if node.kv is not None:
            self._account(node.tier, -node.nbytes)
        if node.disk is not None:
            self._delete_file(node)
        self.members[node.tier].discard(node)
        node.kv = None
        self._counts["evictions"] += 1
        if node.parent is not None:
            del node.parent.children[node.key]
            self._offer(node.parent)
