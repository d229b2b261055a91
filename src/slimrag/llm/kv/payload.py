"""Key/value payloads of prompt segments and the tensor helpers an engine needs around them.

A :class:`SegmentKV` is what one node of the knowledge tree (:mod:`slimrag.llm.kv.tree`) holds: the
per-layer K and V of one segment, computed after the path above it, in the engine's layout
(:class:`slimrag.llm.model.KVCache`: ``[1, kv_heads, tokens, head_dim]`` per layer, keys
rotated). The helpers cut a model's cache into per-segment payloads (:func:`split_kv`) and join
matched payloads back into the tensors a cache is seeded with (:func:`assemble_kv`); both copy, so the tree never
aliases a live cache and a live cache never aliases the tree.

torch is imported lazily, inside the helpers that need it: a simulated payload (sizes only) works
without it, which is what the tree's unit tests and the remote shadow cache use.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


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
    """Per-layer (K, V) tensors of the engine's ``KVCache`` (``cache.layers()``), of a transformers
    ``DynamicCache`` (``.layers[i].keys/.values``; the tests' reference) or of a tuple of pairs."""
    layers = getattr(cache, "layers", None)
    if callable(layers):
        return list(layers())
    if layers is not None:
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
    ``KVCache.seeded`` and prefill the rest at position ``sum(p.tokens)``."""
    import torch

    if not payloads or not payloads[0].layers:
        raise ValueError("assemble_kv needs at least one real (non-simulated) payload")
    out = []
    for i in range(len(payloads[0].layers)):
        ks = [p.layers[i][0].to(device) if device else p.layers[i][0] for p in payloads]
        vs = [p.layers[i][1].to(device) if device else p.layers[i][1] for p in payloads]
        out.append((torch.cat(ks, dim=-2), torch.cat(vs, dim=-2)))
    return out


def prefill_cost(tokens: int, prefix_tokens: int, attention_scale: float = 4096.0) -> float:
    """Recompute cost of a segment in token-equivalents of linear-layer work: each token costs 1
    plus its attention work, proportional to the context it attends to (the prefix and half the
    segment on average) over ``attention_scale``."""
    return tokens * (1.0 + (prefix_tokens + (tokens + 1) / 2) / attention_scale)
