"""KV events: the knowledge tree's changes in vLLM's vocabulary (``BlockStored``, ``BlockRemoved``,
``AllBlocksCleared``), their msgpack encoding, and the decoding a router runs on them.

A router that reads vLLM's KV events (``--kv-events-config``; llm-d, Dynamo, SGLang's gateway) can
read ours: the records, field names and framing are vLLM's (``vllm/distributed/kv_events.py``);
what differs is what a "block" is. A vLLM block is a fixed run of tokens; ours is a whole
segment of the knowledge tree (the system segment, or one passage after the path above it), so:

- ``block_hashes``: one hash per event, the segment's **chained key hash** (`chain_hash`):
  ``blake2b(parent_hash + key, 16 bytes)``, with ``parent_hash`` empty for a root. The key is the
  tree's content-addressed key (a root: ``model|system@digest``; a passage: ``chunk@digest``, see
  `slimrag.prompt`), so the hash names the whole path, as vLLM's chained block hashes name the
  whole token prefix: a router that knows a request's keys computes the same hashes.
- ``parent_block_hash``: the parent's chained hash, None for a root (a system segment).
- ``token_ids``: empty (the router needs none); ``block_size``: the segment's token count.
- ``medium``: the tier, ``GPU`` (device), ``CPU`` (host) or ``DISK`` (`MEDIUMS`). A move between
  tiers is a ``BlockStored`` in the new medium, then a ``BlockRemoved`` in the old one, as vLLM's
  offloading reports a block copied down and freed above.
- ``BlockRemoved``: the segment left the tree (its subtree went first, children before parents).
- ``AllBlocksCleared``: the first event of every stream (and the tree closing).

Encodings. vLLM encodes with msgspec: events are tagged structs (the tag, the class name, under
``type``), before its June 2026 change as **arrays** (``["BlockStored", hashes, parent, ...]``,
fields in declaration order, trailing defaults omitted) and since as **maps** (``{"type":
"BlockStored", "block_hashes": ...}``); the batch is ``[ts, events, data_parallel_rank]`` or a
map with those names. `encode_batch` writes either (maps by default); `decode_batch` reads both,
by field name, ignoring fields it does not know (array positions past the known ones included).
msgpack (and pyzmq, for the sockets) come with the ``route`` extra: ``pip install slimrag[route]``.
A malformed event raises `MalformedEvent` and the batch's other events still decode
(`DecodedBatch.malformed` counts them).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from slimrag.llm.kv.node import Node

#: Tier name -> vLLM medium (vLLM's offloading reports ``GPU`` and ``CPU``).
MEDIUMS = {"device": "GPU", "host": "CPU", "disk": "DISK"}

#: Field names in vLLM's declaration order (the array encoding's positions after the tag).
STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                 "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window")
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
BATCH_FIELDS = ("ts", "events", "data_parallel_rank")
#: The encodings `encode_batch` writes.
LAYOUTS = ("map", "array")


def chain_hash(parent: bytes | None, key: str) -> bytes:
    """The block hash of the segment ``key`` under the segment hashed ``parent`` (None: a root)."""
    return hashlib.blake2b((parent or b"") + key.encode(), digest_size=16).digest()


def path_hash(path: Sequence[str]) -> bytes:
    """The block hash of the segment at the end of ``path`` (root key first)."""
    h: bytes | None = None
    for key in path:
        h = chain_hash(h, key)
    if h is None:
        raise ValueError("an empty path names no segment")
    return h


@dataclass(frozen=True, slots=True)
class BlockStored:
    """A segment is cached in ``medium`` (see the module header for each field's meaning here)."""

    block_hashes: tuple[bytes | int, ...]
    parent_block_hash: bytes | int | None
    block_size: int
    medium: str | None
    token_ids: tuple[int, ...] = ()
    lora_id: int | None = None
    lora_name: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Segments left ``medium`` (None: every medium)."""

    block_hashes: tuple[bytes | int, ...]
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """Everything is gone: a new stream, or the tree closed."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    """One message's events in order, its timestamp, and how many of its events were malformed
    (skipped)."""

    ts: float
    events: tuple[KVEvent, ...]
    malformed: int = 0
    data_parallel_rank: int | None = None


class MalformedEvent(ValueError):
    """A message or event that does not follow vLLM's schema."""


def _stored_map(e: BlockStored) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": list(e.block_hashes), "parent_block_hash": e.parent_block_hash,
            "token_ids": list(e.token_ids), "block_size": e.block_size, "lora_id": e.lora_id, "medium": e.medium,
            "lora_name": e.lora_name}


def _event_map(e: KVEvent) -> dict[str, Any]:
    if isinstance(e, BlockStored):
        return _stored_map(e)
    if isinstance(e, BlockRemoved):
        return {"type": "BlockRemoved", "block_hashes": list(e.block_hashes), "medium": e.medium}
    return {"type": "AllBlocksCleared"}


def _as_array(m: dict[str, Any]) -> list[Any]:
    names = {"BlockStored": STORED_FIELDS, "BlockRemoved": REMOVED_FIELDS}.get(m["type"], ())
    return [m["type"], *(m[n] for n in names if n in m)]


def encode_batch(events: Sequence[KVEvent], ts: float | None = None, layout: str = "map",
                 data_parallel_rank: int | None = None) -> bytes:
    """A ``KVEventBatch`` as msgpack in vLLM's map (default) or array layout (`LAYOUTS`)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    maps = [_event_map(e) for e in events]
    stamp = time.time() if ts is None else ts
    if layout == "array":
        body: Any = [stamp, [_as_array(m) for m in maps]]
        if data_parallel_rank is not None:
            body.append(data_parallel_rank)
    else:
        body = {"ts": stamp, "events": maps}
        if data_parallel_rank is not None:
            body["data_parallel_rank"] = data_parallel_rank
    import msgpack  # the `route` extra; a tree without subscribers never needs it

    return msgpack.packb(body, use_bin_type=True)


def _named(obj: Any, names: Sequence[str], what: str) -> dict[str, Any]:
    """A struct as a dict by field name, from a map (unknown keys dropped) or an array (positions
    past ``names`` dropped)."""
    if isinstance(obj, dict):
        return {k: v for k, v in obj.items() if k in names}
    if isinstance(obj, (list, tuple)):
        return dict(zip(names, obj, strict=False))
    raise MalformedEvent(f"{what} is a {type(obj).__name__}, not a map or an array")


def _hashes(value: Any) -> tuple[bytes | int, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(h, (bytes, int)) for h in value):
        raise MalformedEvent(f"block_hashes must be a list of bytes or ints, got {value!r:.80}")
    return tuple(value)


def decode_event(obj: Any) -> KVEvent:
    """One event from either encoding, by field name; raises `MalformedEvent`."""
    if isinstance(obj, dict):
        tag, body = obj.get("type"), obj
    elif isinstance(obj, (list, tuple)) and obj:
        tag, body = obj[0], list(obj[1:])
    else:
        raise MalformedEvent(f"an event is a {type(obj).__name__}, not a tagged map or array")
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    if tag == "BlockRemoved":
        f = _named(body, REMOVED_FIELDS, "BlockRemoved")
        medium = f.get("medium")
        if medium is not None and not isinstance(medium, str):
            raise MalformedEvent(f"medium must be a string, got {medium!r:.80}")
        return BlockRemoved(_hashes(f.get("block_hashes")), medium)
    if tag == "BlockStored":
        f = _named(body, STORED_FIELDS, "BlockStored")
        parent, size, medium = f.get("parent_block_hash"), f.get("block_size"), f.get("medium")
        if parent is not None and not isinstance(parent, (bytes, int)):
            raise MalformedEvent(f"parent_block_hash must be bytes, an int or None, got {parent!r:.80}")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise MalformedEvent(f"block_size must be a count, got {size!r:.80}")
        if medium is not None and not isinstance(medium, str):
            raise MalformedEvent(f"medium must be a string, got {medium!r:.80}")
        tokens = f.get("token_ids") or ()
        if not isinstance(tokens, (list, tuple)):
            raise MalformedEvent("token_ids must be a list")
        return BlockStored(_hashes(f.get("block_hashes")), parent, size, medium, tuple(tokens),
                           f.get("lora_id"), f.get("lora_name"))
    raise MalformedEvent(f"unknown event type {tag!r:.40}")


def decode_batch(payload: bytes) -> DecodedBatch:
    """A ``KVEventBatch`` from msgpack in either encoding. Raises `MalformedEvent` when the
    payload is not a batch at all; a malformed event inside one is skipped and counted."""
    import msgpack

    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as e:  # ExtraData and FormatError are ValueErrors
        raise MalformedEvent(f"not msgpack: {e}") from e
    f = _named(obj, BATCH_FIELDS, "the batch")
    ts, raw = f.get("ts"), f.get("events")
    if not isinstance(ts, (int, float)) or not isinstance(raw, (list, tuple)):
        raise MalformedEvent("a batch needs a numeric ts and a list of events")
    events: list[KVEvent] = []
    bad = 0
    for item in raw:
        try:
            events.append(decode_event(item))
        except MalformedEvent:
            bad += 1
    rank = f.get("data_parallel_rank")
    return DecodedBatch(float(ts), tuple(events), bad, rank if isinstance(rank, int) else None)


@dataclass(slots=True)
class EventLog:
    """Events collected in order (a listener for tests and tools: ``tree.subscribe(log.append)``)."""

    events: list[KVEvent] = field(default_factory=list)

    def append(self, event: KVEvent) -> None:
        """Record one event."""
        self.events.append(event)


def tier_observer(listener: Callable[[KVEvent], None], tier_names: Sequence[str],
                  held: Sequence[Node] = ()) -> Callable[[str, Node, int], None]:
    """The `Tiers.observer` that turns a tree's changes into events for ``listener`` (see the module
    header): stored -> ``BlockStored``; removed -> ``BlockRemoved``; moved -> ``BlockStored`` in
    the new medium, then ``BlockRemoved`` in the old one. Sends ``AllBlocksCleared`` and a
    ``BlockStored`` for each of the ``held`` nodes (parents before children) first."""

    def medium(tier: int) -> str:
        name = tier_names[tier]
        return MEDIUMS.get(name, name.upper())

    # each held node's block hash, so a change costs one hash, not a walk to the root re-hashing
    # every ancestor (this runs under the tree's lock); a node is known by identity
    hashes: dict[Node, bytes] = {}

    def hash_of(node: Node) -> bytes:
        return hashes.get(node) or path_hash(node.path())

    def stored(node: Node) -> BlockStored:
        up = node.parent
        parent = None if up is None or up.parent is None else hash_of(up)  # a root's parent is the sentinel
        block = hashes[node] = chain_hash(parent, node.key)
        return BlockStored((block,), parent, node.tokens, medium(node.tier))

    def observe(change: str, node: Node, tier: int) -> None:
        if change == "removed":
            listener(BlockRemoved((hashes.pop(node, None) or path_hash(node.path()),), medium(tier)))
            return
        event = stored(node)
        listener(event)
        if change == "moved" and tier != node.tier:
            listener(BlockRemoved(event.block_hashes, medium(tier)))

    listener(AllBlocksCleared())
    for node in held:
        listener(stored(node))
    return observe
