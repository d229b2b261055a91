"""Grouped-query attention of one decoder layer over the engine's :class:`KVCache`.

``q``, ``k`` and ``v`` come out of one fused projection (``[q; k; v]`` rows stacked at load,
one matrix product instead of three). Qwen3 normalizes each head's q and k (RMSNorm over
``head_dim``) before RoPE. The new keys are rotated at their positions and written into the
cache; the queries then attend over every cached position with PyTorch's
``scaled_dot_product_attention`` and ``enable_gqa`` (each KV head serves
``num_heads / num_kv_heads`` query heads without copying K/V per query head).

Masks. A single new token (decode) sees every cached key: no mask. Several new tokens (a prefill
segment on top of a cache of ``past`` positions) see key ``j`` when ``j <= past + i``: a boolean
mask built here. Blend reuse passes its own mask by position (keys in cache order, not position
order), which replaces the causal one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from slimrag.llm.model.cache import KVCache
from slimrag.llm.model.norm import rms_norm
from slimrag.llm.model.qlinear import QuantLinear
from slimrag.llm.model.rope import Rope


@dataclass(slots=True)
class AttentionWeights:
    """One layer's attention parameters. ``qkv``: ``[(heads + 2 kv_heads) * head_dim, hidden]``;
    ``qkv_bias``: matching bias or None; ``q_norm``/``k_norm``: per-head RMSNorm weights (Qwen3)
    or None; ``o``: ``[hidden, heads * head_dim]``. A projection is a float tensor or a
    :class:`~slimrag.llm.model.qlinear.QuantLinear` (the GGUF's blocks, the default on CPU)."""

    qkv: torch.Tensor | QuantLinear
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o: torch.Tensor | QuantLinear


def causal_mask(n: int, past: int, device: torch.device) -> torch.Tensor:
    """``[n, past + n]`` booleans: query ``i`` (at position ``past + i``) sees keys ``<= past + i``."""
    q = torch.arange(past, past + n, device=device)
    return torch.arange(past + n, device=device)[None, :] <= q[:, None]


def attention(x: torch.Tensor, w: AttentionWeights, layer: int, cache: KVCache, rope: Rope,
              cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None, *,
              heads: int, kv_heads: int, head_dim: int, eps: float) -> torch.Tensor:
    """Attention output (``[n, hidden]``) for ``x`` (``[n, hidden]``, normalized), writing the
    new K/V into ``cache`` at the cache's current length. ``mask``: ``[n, length + n]`` booleans,
    or None for the causal rule (see the module header)."""
    return F.linear(attend(F.linear(x, w.qkv, w.qkv_bias), w, layer, cache, rope, cos, sin, mask, heads=heads,
                           kv_heads=kv_heads, head_dim=head_dim, eps=eps), w.o)


def attend(qkv: torch.Tensor, w: AttentionWeights, layer: int, cache: KVCache, rope: Rope,
           cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None, *,
           heads: int, kv_heads: int, head_dim: int, eps: float, at: int | None = None,
           compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The part of :func:`attention` between its two projections: ``qkv`` (``[n, (heads + 2
    kv_heads) * head_dim]``, one sequence's new positions) split into heads, normalized (Qwen3)
    and rotated, K/V written into ``cache``, and the attended values ``[n, heads * head_dim]``
    before the output projection. A batched decode step (:mod:`slimrag.llm.model.batch`) runs the
    projections over many sequences' rows at once and this per sequence; a prefill of several
    segments in one forward (:mod:`slimrag.llm.model.prefill`) runs this per segment, with ``at``
    its first position (default: the cache's length). ``compute_dtype``: the dtype the attention
    itself runs in (queries, keys and values rounded to it, the output back to ``qkv``'s; default
    ``qkv``'s own; the output is in it): a bfloat16 prefill's, with the cache's K/V written as they are."""
    n = qkv.shape[0]
    q_end, k_end = heads * head_dim, (heads + kv_heads) * head_dim
    q = qkv[:, :q_end].view(n, heads, head_dim).transpose(0, 1)
    k = qkv[:, q_end:k_end].view(n, kv_heads, head_dim).transpose(0, 1)
    v = qkv[:, k_end:].view(n, kv_heads, head_dim).transpose(0, 1)
    if w.q_norm is not None and w.k_norm is not None:
        q, k = rms_norm(q, w.q_norm, eps), rms_norm(k, w.k_norm, eps)
    q, k = rope.apply(q, cos, sin), rope.apply(k, cos, sin)
    past = cache.length if at is None else at
    keys, values = cache.write(layer, k[None], v[None], past)
    if mask is None and n > 1:
        mask = causal_mask(n, past, qkv.device)
    if compute_dtype is not None and compute_dtype != qkv.dtype:
        q, keys, values = q.to(compute_dtype), keys.to(compute_dtype), values.to(compute_dtype)
    out = F.scaled_dot_product_attention(q[None], keys, values, attn_mask=mask, enable_gqa=heads != kv_heads)
    return out[0].transpose(0, 1).reshape(n, heads * head_dim)
