"""The knowledge tree: key/value states of prompt segments, reused across requests.

Sources: RAGCache (arXiv 2404.12457), SGLang RadixAttention (``mem_cache/radix_cache.py``).

Structure
---------
A prompt is ``[system][passage]...[question]`` (see :mod:`slimrag.rag.prompt`); each segment is
tokenized on its own, so the KV of a passage depends only on the segments *before* it. The tree
stores exactly that: a hidden sentinel has one child per **root key** (the system segment; hash
its token ids with :func:`segment_key`, and fold the model id in, so different system prompts or
models never share entries); below a root, each edge is a passage key (the chunk id) and each node
holds the KV of its segment computed after the path above it. A request walks the tree along its
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

Engine usage (see ``tests/test_kvtree.py::test_engine_flow_with_tensors``)::

    m = tree.match(root, keys)                       # pins the cached prefix
    try:
        past = assemble_kv(m.payloads, device) if m.nodes else None  # -> DynamicCache(past)
        ...prefill ids[m.tokens:] on top of past...
        tree.insert(root, keys, split_kv(cache_layers(cache), seg_lengths, first=len(m.nodes)))
    finally:
        tree.release(m)

Thread-safety: every public method of :class:`KVTree` takes one re-entrant lock, so any number of
threads may call it. Disk reads and writes happen under that lock (simple; a slow disk stalls
other requests for a moment). Payloads of pinned nodes are never moved or freed, so an engine may
read ``match.payloads`` outside the lock until it calls :meth:`KVTree.release`.

Simulated mode (:meth:`KVTree.simulated`) keeps only sizes: no model, no tensors, no files; the
same eviction and tier logic runs, which is what the unit tests exercise. torch is imported only
by the tensor helpers and the real storage.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

DEVICE, HOST, DISK = "device", "host", "disk"


@dataclass(frozen=True, slots=True)
class KVTreeConfig:
    """Budgets and policy of a :class:`KVTree`.

    device: where the model runs (``"cpu"``, ``"cuda"``, ``"cuda:1"``). On ``"cpu"`` there is no
    separate device tier and ``device_bytes`` is ignored.
    device_bytes / host_bytes: memory budgets. Rule of thumb: KV bytes per token = 2 (K and V) ×
    layers × kv_heads × head_dim × dtype bytes; SmolLM2-135M in float32 is 46 KB/token, so a
    200-token passage is ~9 MB and the 1 GiB host default holds ~110 passages.
    disk_bytes: budget of the disk tier; 0 (default) disables it. Reading a segment back from a
    local SSD is much cheaper than recomputing it on a CPU, less so next to a fast GPU.
    disk_dir: parent folder of the tier's scratch folder (a fresh temp folder inside it, removed
    by :meth:`KVTree.close`); None means the system temp folder.
    policy: a key of :data:`EVICTION_POLICIES`; ``"gdsf"`` (default) weighs recompute cost,
    size and frequency, ``"lru"``/``"lfu"`` are baselines.
    attention_scale: the context length at which a token's attention work equals its
    linear-layer work (≈ 6 × hidden size); only shapes :func:`prefill_cost`.
    """

    device: str = "cpu"
    device_bytes: int = 2 << 30
    host_bytes: int = 1 << 30
    disk_bytes: int = 0
    disk_dir: str | None = None
    policy: str = "gdsf"
    attention_scale: float = 4096.0

    def __post_init__(self) -> None:
        if not self.device:
            raise ValueError("device must be a torch device string such as 'cpu' or 'cuda'")
        if min(self.device_bytes, self.host_bytes, self.disk_bytes) < 0:
            raise ValueError("device_bytes, host_bytes and disk_bytes must be >= 0")
        if self.host_bytes == 0 and (self.on_cpu or self.device_bytes == 0):
            raise ValueError("at least one memory tier needs a positive budget")
        if self.policy not in EVICTION_POLICIES:
            raise ValueError(f"policy must be one of {sorted(EVICTION_POLICIES)}, got {self.policy!r}")
        if self.attention_scale <= 0:
            raise ValueError(f"attention_scale must be positive, got {self.attention_scale}")

    @property
    def on_cpu(self) -> bool:
        """True when the model runs on the CPU, so the device tier and the host tier are one."""
        return self.device.split(":")[0] == "cpu"

    def tiers(self) -> list[tuple[str, int]]:
        """The tiers in use, top first, as (name, budget); tiers with a zero budget are left out."""
        named = [(HOST, self.host_bytes)] if self.on_cpu else [(DEVICE, self.device_bytes), (HOST, self.host_bytes)]
        named.append((DISK, self.disk_bytes))
        return [(name, budget) for name, budget in named if budget > 0]


# ---------------------------------------------------------------------------------------------
# Payloads and tensor helpers


@dataclass(frozen=True, slots=True)
class SegmentKV:
    """The key/value states of one segment. ``layers``: one (K, V) pair per layer, each a tensor
    of shape ``[1, kv_heads, tokens, head_dim]``; empty for a simulated payload (sizes only)."""

    tokens: int
    nbytes: int
    layers: tuple[tuple[Any, Any], ...] = ()

    @classmethod
    def simulated(cls, tokens: int, bytes_per_token: int = 1) -> SegmentKV:
        """A payload with sizes and no data, for tests and for mirroring a remote cache."""
        return cls(tokens, tokens * bytes_per_token)

    @classmethod
    def from_layers(cls, layers: Sequence[tuple[Any, Any]]) -> SegmentKV:
        """Wrap per-layer (K, V) tensors (kept as given, not copied)."""
        layers = tuple((k, v) for k, v in layers)
        if not layers:
            raise ValueError("a real payload needs at least one layer; use SegmentKV.simulated for none")
        nbytes = sum(t.numel() * t.element_size() for pair in layers for t in pair)
        return cls(int(layers[0][0].shape[-2]), int(nbytes), layers)

    def to(self, device: str) -> SegmentKV:
        """The same payload on ``device`` (a copy when it moves; self when it is already there)."""
        if not self.layers:
            return self
        moved = tuple((k.to(device), v.to(device)) for k, v in self.layers)
        return SegmentKV(self.tokens, self.nbytes, moved)


def cache_layers(cache: Any) -> list[tuple[Any, Any]]:
    """Per-layer (K, V) tensors of a transformers ``DynamicCache`` (``.layers[i].keys/.values`` in
    transformers >= 4.56, ``key_cache``/``value_cache`` before) or of a legacy tuple of pairs."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    if hasattr(cache, "key_cache"):
        return list(zip(cache.key_cache, cache.value_cache, strict=True))
    return [(k, v) for k, v in cache]


def split_kv(layers: Sequence[tuple[Any, Any]], lengths: Sequence[int], first: int = 0) -> list[SegmentKV]:
    """Cut a prompt's per-layer (K, V) (``[1, heads, seq, head_dim]``) into per-segment payloads.

    ``lengths`` are the token counts of the segments in prompt order; positions past their sum
    (the question, generated tokens) are ignored. Only segments ``lengths[first:]`` are returned
    (the ones the tree lacks). Each payload is a contiguous copy, so the tree never keeps the
    whole prompt's tensors alive and later in-place writes to the cache cannot reach it.
    """
    if not layers:
        raise ValueError("split_kv needs at least one layer")
    seq = int(layers[0][0].shape[-2])
    if any(n <= 0 for n in lengths) or sum(lengths) > seq:
        raise ValueError(f"segment lengths {list(lengths)} do not fit a cache of {seq} positions")
    starts = list(itertools.accumulate(lengths, initial=0))
    out = []
    for i in range(first, len(lengths)):
        a, b = starts[i], starts[i + 1]
        out.append(SegmentKV.from_layers([(k[:, :, a:b].clone(), v[:, :, a:b].clone()) for k, v in layers]))
    return out


def assemble_kv(payloads: Sequence[SegmentKV], device: str | None = None) -> list[tuple[Any, Any]]:
    """Concatenate matched payloads along the sequence axis: one (K, V) per layer, new tensors
    (the tree's copies are never aliased), on ``device`` when given. Feed the result to
    ``DynamicCache(list_of_pairs)`` and prefill the rest at position ``sum(p.tokens)``."""
    import torch

    if not payloads or not payloads[0].layers:
        raise ValueError("assemble_kv needs at least one real (non-simulated) payload")
    out = []
    for i in range(len(payloads[0].layers)):
        ks = [p.layers[i][0].to(device) if device else p.layers[i][0] for p in payloads]
        vs = [p.layers[i][1].to(device) if device else p.layers[i][1] for p in payloads]
        out.append((torch.cat(ks, dim=-2), torch.cat(vs, dim=-2)))
    return out


def segment_key(data: str | bytes | Sequence[int], namespace: str = "") -> str:
    """A short stable key for a segment: SHA-256 of its token ids (or text), prefixed by
    ``namespace`` (use the model id, so two models never share a root)."""
    if isinstance(data, str):
        raw = data.encode()
    elif isinstance(data, bytes):
        raw = data
    else:
        raw = b",".join(str(int(t)).encode() for t in data)
    return f"{namespace}{hashlib.sha256(raw).hexdigest()[:24]}"


def prefill_cost(tokens: int, prefix_tokens: int, attention_scale: float = 4096.0) -> float:
    """Recompute cost of a segment in token-equivalents of linear-layer work: each token costs 1
    plus its attention work, proportional to the context it attends to (the prefix and half the
    segment on average) over ``attention_scale``."""
    return tokens * (1.0 + (prefix_tokens + (tokens + 1) / 2) / attention_scale)


# ---------------------------------------------------------------------------------------------
# Tree nodes and eviction policies


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


class EvictionPolicy:
    """Orders eviction candidates: the smallest :meth:`priority` tuple goes first."""

    def priority(self, node: Node) -> tuple[float, ...]:
        """The node's priority tuple; lower is evicted sooner."""
        raise NotImplementedError

    def aged(self, clock: float, victim: tuple[float, ...]) -> float:
        """The global clock after evicting a node of priority ``victim`` (unchanged by default)."""
        return clock


class GDSF(EvictionPolicy):
    """Greedy-Dual-Size-Frequency: ``clock_at_access + hits * cost / size``, then least recent."""

    def priority(self, node: Node) -> tuple[float, ...]:
        return (node.clock + node.hits * node.cost / max(node.nbytes, 1), float(node.last_use))

    def aged(self, clock: float, victim: tuple[float, ...]) -> float:
        return max(clock, victim[0])


class LRU(EvictionPolicy):
    """Least recently used first."""

    def priority(self, node: Node) -> tuple[float, ...]:
        return (float(node.last_use),)


class LFU(EvictionPolicy):
    """Least frequently used first, least recent among equals."""

    def priority(self, node: Node) -> tuple[float, ...]:
        return (float(node.hits), float(node.last_use))


EVICTION_POLICIES: dict[str, type[EvictionPolicy]] = {"gdsf": GDSF, "lru": LRU, "lfu": LFU}


# ---------------------------------------------------------------------------------------------
# Storage: how payloads move between tiers


class KVStorage(Protocol):
    """Moves payloads between tiers. ``move`` places a payload in a memory tier; ``write`` /
    ``read`` / ``delete`` manage the disk tier's files by an opaque handle."""

    def move(self, kv: SegmentKV, tier: str) -> SegmentKV: ...
    def write(self, kv: SegmentKV, name: str) -> str: ...
    def read(self, handle: str) -> SegmentKV: ...
    def delete(self, handle: str) -> None: ...
    def close(self) -> None: ...


class SimulatedStorage:
    """No devices, no files: payloads stay as they are and "files" live in a dict."""

    def __init__(self) -> None:
        self.files: dict[str, SegmentKV] = {}

    def move(self, kv: SegmentKV, tier: str) -> SegmentKV:
        return kv

    def write(self, kv: SegmentKV, name: str) -> str:
        self.files[name] = kv
        return name

    def read(self, handle: str) -> SegmentKV:
        return self.files[handle]

    def delete(self, handle: str) -> None:
        del self.files[handle]

    def close(self) -> None:
        self.files.clear()


class TorchStorage:
    """Real tensors: the device tier on ``config.device``, the host tier on the CPU, the disk tier
    as one ``torch.save`` file per node in a scratch folder removed on :meth:`close` (or at exit)."""

    def __init__(self, config: KVTreeConfig) -> None:
        self.device = config.device
        self.folder: Path | None = None
        self._disk_dir = config.disk_dir

    def _scratch(self) -> Path:
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="slimrag-kv-", dir=self._disk_dir))
            weakref.finalize(self, shutil.rmtree, self.folder, True)
        return self.folder

    def move(self, kv: SegmentKV, tier: str) -> SegmentKV:
        return kv.to(self.device if tier == DEVICE else "cpu")

    def write(self, kv: SegmentKV, name: str) -> str:
        import torch

        path = self._scratch() / f"{name}.pt"
        torch.save([t.to("cpu") for pair in kv.layers for t in pair], path)
        return str(path)

    def read(self, handle: str) -> SegmentKV:
        import torch

        flat = torch.load(handle, map_location="cpu", weights_only=True)
        return SegmentKV.from_layers(list(zip(flat[0::2], flat[1::2], strict=True)))

    def delete(self, handle: str) -> None:
        Path(handle).unlink(missing_ok=True)

    def close(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


# ---------------------------------------------------------------------------------------------
# The tree


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
