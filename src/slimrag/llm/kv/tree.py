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

Eviction and tiers
------------------
Segments live in byte-budgeted tiers (device, host, disk) and leave by prefix-aware
Greedy-Dual-Size-Frequency eviction of leaves; :mod:`slimrag.llm.kv.tiers` explains both. A
persistent disk tier (``CacheConfig.persist``, :mod:`slimrag.llm.kv.persist`) writes every node
through to a file and, when a tree opens on its folder, adopts the files found as disk-only
nodes; a file that cannot be read back is a miss (the node is dropped). Match
and insert are O(depth) plus O(log n) per eviction, n = cached segments.

Engine usage (``slimrag.llm.kv.reuse.TreeReuse`` does exactly this for the embedded engine)::

    m = tree.match(root, keys)                       # pins the cached prefix
    try:
        past = assemble_kv(m.payloads, device) if m.nodes else None  # -> KVCache.seeded(past)
        ...prefill the segments after m.nodes, one forward each, on top of past...
        tree.insert(root, keys, split_kv(cache_layers(cache), seg_lengths, first=len(m.nodes)))
    finally:
        tree.release(m)

Modules: nodes in :mod:`slimrag.llm.kv.node`, placement and eviction across tiers in
:mod:`slimrag.llm.kv.tiers`, payloads and tensor helpers in :mod:`slimrag.llm.kv.payload`,
eviction policies in :mod:`slimrag.llm.kv.eviction`, tier storage in
:mod:`slimrag.llm.kv.storage`, the budgets in :class:`slimrag.llm.kv.config.CacheConfig`.

Thread-safety: every public method of :class:`KVTree` takes one re-entrant lock, so any number of
threads may call it. Disk reads and writes happen under that lock (simple; a slow disk stalls
other requests for a moment). Payloads of pinned nodes are never moved or freed, so an engine may
read ``match.payloads`` outside the lock until it calls :meth:`KVTree.release`.

Simulated mode (:meth:`KVTree.simulated`) keeps only sizes: no model, no tensors, no files; the
same eviction and tier logic runs, which is what the unit tests exercise. torch is imported only
by the tensor helpers and the real storage.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from slimrag.llm.kv.config import CacheConfig
from slimrag.llm.kv.events import AllBlocksCleared, KVEvent, tier_observer
from slimrag.llm.kv.node import Node
from slimrag.llm.kv.payload import SegmentKV, prefill_cost
from slimrag.llm.kv.persist import StoredSegment
from slimrag.llm.kv.storage import KVStorage, SimulatedStorage, TorchStorage
from slimrag.llm.kv.tiers import Tiers


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
    (sizes only). Read-only attribute: ``tiers`` (:class:`~slimrag.llm.kv.tiers.Tiers`: tier
    names, budgets, bytes used and peak per tier; :meth:`stats` gives a consistent snapshot).
    """

    def __init__(self, config: CacheConfig | None = None, storage: KVStorage | None = None) -> None:
        self.config = config or CacheConfig()
        self.tiers = Tiers(self.config, storage if storage is not None else TorchStorage(self.config))
        self._sentinel = Node("", None, 0)
        self._lock = threading.RLock()
        self._tick = 0
        self._counts = dict.fromkeys(("requests", "hits", "misses", "served_tokens"), 0)
        self._listener: Callable[[KVEvent], None] | None = None
        scan = getattr(self.tiers.storage, "scan", None)
        if self.tiers.storage.persistent and callable(scan) and self.tiers.disk_tier is not None:
            self._restore(scan(self.tiers.budgets[self.tiers.disk_tier]))

    @classmethod
    def simulated(cls, config: CacheConfig | None = None) -> KVTree:
        """A tree that stores sizes only (use :meth:`SegmentKV.simulated` payloads)."""
        return cls(config, SimulatedStorage())

    @property
    def clock(self) -> float:
        """The eviction policy's global clock (GDSF's ``L``): the priority of the last victim."""
        return self.tiers.clock

    def priority(self, node: Node) -> tuple[float, ...]:
        """``node``'s current eviction priority under the tree's policy (lower goes sooner)."""
        return self.tiers.policy.priority(node)

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
                self.tiers.promote(child, parent.tier)
                if child.kv is None:
                    self._unpin(child)
                    self._drop_if_lost(child)
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

    def entries(self, root_key: str, keys: Sequence[str]) -> Match:
        """The position-independent entries of ``keys``: the root's children, whose KV were
        computed right after the system segment (blend reuse, :mod:`slimrag.llm.kv.blend`).

        Returns a :class:`Match` whose ``path`` holds the keys found and ``nodes`` their nodes,
        aligned; the root itself is not included. Side effects as in :meth:`match` (pin, touch,
        promotion; a node left on disk that fits no memory tier counts as absent), release it
        the same way. Call it after the request's :meth:`match`, for keys past its prefix: those
        were counted as misses there, and each one found moves from misses to hits."""
        with self._lock:
            self._tick += 1
            root = self._sentinel.children.get(root_key)
            found: list[str] = []
            nodes: list[Node] = []
            for key in keys:
                child = root.children.get(key) if root is not None else None
                if child is None or child in nodes:
                    continue
                child.pins += 1
                self.tiers.promote(child, root.tier)  # type: ignore[union-attr]
                if child.kv is None:
                    self._unpin(child)
                    self._drop_if_lost(child)
                    continue
                self._touch(child)
                found.append(key)
                nodes.append(child)
            tokens = sum(n.tokens for n in nodes)
            self._counts["hits"] += len(nodes)
            self._counts["misses"] -= len(nodes)
            self._counts["served_tokens"] += tokens
            return Match(root_key, tuple(found), tuple(nodes), tokens)

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
                        child = self.tiers.place(parent, key, kv, cost, self._tick)
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
            used = self.tiers.used
            before = used[tier]
            self.tiers.free(tier, max(0, before - bytes_needed))
            return before - used[tier]

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

    def subscribe(self, listener: Callable[[KVEvent], None]) -> None:
        """Tell ``listener`` each change as KV events (`slimrag.llm.kv.events`; under the tree's lock:
        only queue them), after ``AllBlocksCleared`` and the nodes held now, parents first."""
        with self._lock:
            self._listener, self.tiers.observer = listener, tier_observer(listener, self.tiers.names, self.nodes())

    def stats(self) -> KVTreeStats:
        """A snapshot of the counters and per-tier bytes."""
        with self._lock:
            t = self.tiers
            tiers = tuple(TierStats(t.names[i], t.budgets[i], t.used[i], t.peak[i], len(t.members[i]))
                          for i in range(len(t.names)))
            return KVTreeStats(tiers, sum(len(m) for m in t.members), **self._counts, **t.counts)

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
            t = self.tiers
            used = [0] * len(t.names)
            for node in self.nodes():
                assert node.parent is not None and node.parent.children.get(node.key) is node
                assert node.tier >= node.parent.tier, f"{node} sits above its parent"
                assert (node.kv is None) == (node.tier == t.disk_tier), f"{node} payload/tier mismatch"
                assert node in t.members[node.tier]
                if node.kv is not None:
                    used[node.tier] += node.nbytes
                if node.disk is not None:
                    assert t.disk_tier is not None
                    used[t.disk_tier] += node.nbytes
                assert node.pins >= 0
            assert used == t.used, f"byte counts {t.used} != recomputed {used}"
            assert sum(len(m) for m in t.members) == len(self.nodes()), "tier membership drifted"
            for i in range(len(t.names)):
                assert t.peak[i] <= t.budgets[i], f"tier {t.names[i]} peak over budget"

    def close(self) -> None:
        """Drop every node and delete the disk tier's files (a persistent tier keeps its files:
        the next tree on the same folder restores them)."""
        with self._lock:
            if self.tiers.storage.persistent:
                self.tiers.forget(self._sentinel)
            else:
                for root in list(self._sentinel.children.values()):
                    self.tiers.drop(root)
            self.tiers.storage.close()
            if self._listener is not None:
                self._listener(AllBlocksCleared())

    # -- internals (caller holds the lock) -----------------------------------------------------

    def _touch(self, node: Node) -> None:
        node.hits += 1
        node.last_use = self._tick
        node.clock = self.tiers.clock
        self.tiers.offer(node)

    def _unpin(self, node: Node) -> None:
        node.pins -= 1
        self.tiers.offer(node)

    def _drop_if_lost(self, node: Node) -> None:
        """Drop a node whose file could not be read back (it has neither payload nor file now)."""
        if node.kv is None and node.disk is None and not node.pins:
            self.tiers.drop(node)

    def _restore(self, stored: Sequence[StoredSegment]) -> None:
        """Adopt the segment files a persistent tier found (see :mod:`slimrag.llm.kv.persist`):
        parents before children, least recently used first (so ``last_use`` follows the files'
        modification times); a file whose parent is absent is deleted."""
        for seg in sorted(stored, key=lambda s: (len(s.path), s.mtime)):
            parent, position = self._sentinel, 0
            for key in seg.path[:-1]:
                parent = parent.children.get(key)  # type: ignore[assignment]
                if parent is None:
                    break
                position += parent.tokens
            if parent is None or seg.path[-1] in parent.children:
                self.tiers.storage.delete(seg.handle)
                continue
            self._tick += 1
            cost = prefill_cost(seg.tokens, position, self.config.attention_scale)
            self.tiers.adopt(parent, seg.path[-1], seg.tokens, seg.nbytes, seg.handle, cost, self._tick)
