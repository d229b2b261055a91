"""Prefill of several prompt segments in one forward pass, each segment's K/V bitwise those of a forward of its own.

Why. A RAG prompt is ``[system][passage]...[question]``, each segment tokenized on its own, and
the knowledge tree stores each segment's K/V computed after the segments before it. The engine
used to prefill one forward per segment (six passes over the weights for four passages), which
is what kept cached and uncached runs bitwise equal: a segment's K/V came from the same forward
shapes whether or not its predecessors were cached. Here one pass carries every uncached
segment:

- the row-wise parts (embedding, norms, projections, the MLP) run over all the pass's rows at
  once: one product per weight and layer, however many segments;
- attention runs per segment: its queries over the cache up to its own end (the segments before
  it, cached or written by this layer just before), exactly the shapes of a forward of its own
  (:func:`slimrag.llm.engine.attention.attend` with ``at``).

That is exact only where a row's product does not depend on how many rows share the call nor
where the row sits. :func:`prefill_mode` checks it on the model's own matrices and picks a mode:

- ``rows`` (a quantized model without ``dense_rows``): each weight's kernel over all rows at
  once; MLAS ``MatMulNBits`` quantizes and sums each row on its own (checked here for 1 to 976
  rows at any offset, 1 and 2 threads);
- ``chunks`` (float weights, or a quantized model that allows float32 copies: ``dense_rows``):
  float32 ``F.linear`` (MKL) is *not* row-independent across row counts (another kernel for 1-15
  rows, and with 2 threads for some larger counts), so every product call gets exactly
  :data:`CHUNK` rows (the last call padded with zeros); at one shape a row's result does not
  depend on its place in the call nor its neighbours (checked);
- ``segments``: neither holds (another BLAS, a GPU): the engine keeps one forward per segment.

RMSNorm and attention were checked row- and stride-invariant on this CPU (SDPA's result does not
depend on the cache's capacity).

Only the last position's logits are computed (the question's last token), as in
:meth:`Decoder.forward`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from slimrag.llm.engine.attention import attend
from slimrag.llm.engine.cache import KVCache
from slimrag.llm.engine.model import Decoder
from slimrag.llm.engine.norm import rms_norm

#: Rows per float32 product call in ``chunks`` mode: a pass's rows are cut into calls of exactly
#: this many (the last padded with zero rows), so every call has one shape. Smaller wastes less on
#: short passes (a 20-token question computes 64 rows), larger runs nearer the GEMM's peak.
CHUNK = 64
#: How a pass multiplies (chosen by :func:`prefill_mode`; see the module header).
ROWS, CHUNKS, SEGMENTS = "rows", "chunks", "segments"


def _product(x: torch.Tensor, w: Any, bias: torch.Tensor | None, mode: str = ROWS) -> torch.Tensor:
    """``x @ w.T (+ bias)``: ``rows``: the weight's own product (a float ``F.linear`` or a
    quantized weight's kernel); ``chunks``: float32 (a quantized weight's dense copy) in calls of
    :data:`CHUNK` rows."""
    if mode == CHUNKS:
        dense = w if isinstance(w, torch.Tensor) else w.dense()
        n = x.shape[0]
        pad = -n % CHUNK
        if pad:
            x = torch.cat([x, x.new_zeros(pad, x.shape[1])])
        return torch.cat([F.linear(x[i : i + CHUNK], dense, bias) for i in range(0, n + pad, CHUNK)])[:n]
    if isinstance(w, torch.Tensor):
        return F.linear(x, w, bias)
    y = w(x)
    return y if bias is None else y + bias


def prefill_mode(model: Decoder, *, seed: int = 0) -> str:
    """How this model's prompts may be prefilled in one pass: ``rows`` for a quantized model
    without ``dense_rows`` whose kernel's rows are independent, else ``chunks`` where a row's
    float32 product in a :data:`CHUNK`-row call does not depend on its place in the call nor its
    neighbours, else ``segments`` (one forward per segment). Both checked on layer 0's
    projections with random rows at several offsets and counts (the output head multiplies one
    row per pass, so it needs no check; leaving it out keeps the check under ~0.1 s)."""
    layer = model.layers[0]
    mats = [layer.attn.qkv, layer.attn.o, layer.gate_up, layer.down]
    quantized = not isinstance(layer.attn.qkv, torch.Tensor)
    mode = ROWS if quantized and getattr(model, "dense_rows", None) is None else CHUNKS
    gen = torch.Generator(device="cpu").manual_seed(seed)
    rows = CHUNK + 24
    cuts = [(0, 1), (5, 7), (9, 12), (20, 27), (30, 47), (10, 10 + CHUNK + 3), (0, rows)]
    with torch.inference_mode():
        for w in mats:
            x = torch.randn(rows, w.shape[1], generator=gen).to(dtype=model.dtype, device=model.device)
            full = _product(x, w, None, mode)
            if not all(torch.equal(_product(x[a:b], w, None, mode), full[a:b]) for a, b in cuts):
                return SEGMENTS
    return mode


def prefill(model: Decoder, ids: torch.Tensor, positions: torch.Tensor, cache: KVCache,
            spans: Sequence[int], mode: str = ROWS) -> torch.Tensor:
    """Run the segments whose token counts are ``spans`` (in order; ``ids`` and ``positions``
    their tokens joined) on top of ``cache``, which gains their K/V; returns the float32 logits
    of the last position. ``mode``: what :func:`prefill_mode` returned for the model (never
    ``segments``: segment K/V would then differ from a forward of their own). Run it under
    ``torch.inference_mode``."""
    if mode not in (ROWS, CHUNKS):
        raise ValueError(f"one-pass prefill runs in mode {ROWS!r} or {CHUNKS!r}, not {mode!r}")
    n = int(ids.shape[0])
    if not spans or any(s <= 0 for s in spans) or sum(spans) != n or positions.shape[0] != n:
        raise ValueError(f"spans {list(spans)} must be positive and cover the {n} tokens")
    model.warm_step(wait=False)  # decode comes next: its graph loads beside this pass
    c = model.config
    kw = {"heads": c.num_heads, "kv_heads": c.num_kv_heads, "head_dim": c.head_dim, "eps": c.rms_eps}
    base = cache.length
    cache.reserve(base + n)
    bounds = list(itertools.pairwise(itertools.accumulate(spans, initial=0)))
    x = F.embedding(ids, model.embed)
    cos, sin = model.rope.cos_sin(positions, x.dtype)
    for i, layer in enumerate(model.layers):
        a = layer.attn
        qkv = _product(rms_norm(x, layer.input_norm, c.rms_eps), a.qkv, a.qkv_bias, mode)
        att = torch.cat([attend(qkv[s:e], a, i, cache, model.rope, cos[s:e], sin[s:e], None, at=base + s, **kw)
                         for s, e in bounds])
        x = x + _product(att, a.o, None, mode)
        gate, up = _product(rms_norm(x, layer.post_norm, c.rms_eps), layer.gate_up, None, mode).chunk(2, dim=-1)
        x = x + _product(F.silu(gate) * up, layer.down, None, mode)
    cache.advance(n)
    # one row: the weight's own product, the same in every run of this prompt
    return _product(rms_norm(x[-1:], model.norm, c.rms_eps), model.lm_head, None).float()[0]
