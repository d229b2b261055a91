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
  (:func:`slimrag.llm.model.attention.attend` with ``at``).

That is exact only where a row's product does not depend on how many rows share the call nor
where the row sits. :func:`prefill_mode` checks it on the model's own matrices and picks a mode:

- ``bf16`` (the default on a CPU with AMX bfloat16 tiles, where the copy fits: a quantized CPU
  model without ``dense_rows``, settled at load; :mod:`slimrag.llm.model.bf16`): products and attention in
  bfloat16 over a held bfloat16 copy of the layers' weights (212 MB for SmolLM2-135M, prepacked), every
  product call one of a few fixed sizes (padded: 512 or 256 rows for a long pass where that size
  gives each row the 128-row result, 128, 64 for a short remainder), checked as for ``chunks``; K/V, norms and the residual stream stay float32. ~2.6x the ``rows`` prefill's
  tokens/s on a 1,345-token prompt here (``docs/benchmarks.md``). Against float32 it is another
  computation of the same weights (greedy agreement in ``bench/quant_agreement.py``);
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

from slimrag.llm.model import bf16
from slimrag.llm.model.attention import attend
from slimrag.llm.model.cache import KVCache
from slimrag.llm.model.model import Decoder
from slimrag.llm.model.norm import rms_norm

#: Rows per float32 product call in ``chunks`` mode: a pass's rows are cut into calls of exactly
#: this many (the last padded with zero rows), so every call has one shape. Smaller wastes less on
#: short passes (a 20-token question computes 64 rows), larger runs nearer the GEMM's peak.
CHUNK = 64
#: How a pass multiplies (chosen by :func:`prefill_mode`; see the module header).
ROWS, CHUNKS, BF16, SEGMENTS = "rows", "chunks", "bf16", "segments"


def _rows_kernel(model: Decoder) -> bool:
    """A quantized model with no ``dense_rows`` asked for: its products run on the blocks' kernel."""
    return not isinstance(model.layers[0].attn.qkv, torch.Tensor) and getattr(model, "dense_rows", None) is None


def bf16_fits(model: Decoder) -> bool:
    """Whether ``model`` may prefill in bfloat16 (:func:`slimrag.llm.model.bf16.fits`): a quantized
    model (its products already approximate float32; a float model keeps float32, the numbers its
    reference implementation gives) with no ``dense_rows`` asked for (that asks float32)."""
    return _rows_kernel(model) and bf16.fits(model.bf16_bytes(), model.device, model.dtype)


def _product(x: torch.Tensor, w: Any, bias: torch.Tensor | None, mode: str = ROWS,
             w16: bf16.Copy | None = None) -> torch.Tensor:
    """``x @ w.T (+ bias)``: ``rows``: the weight's own product (a float ``F.linear`` or a
    quantized weight's kernel); ``chunks``: float32 (a quantized weight's dense copy) in calls of
    :data:`CHUNK` rows; ``bf16``: ``x`` rounded to bfloat16 times ``w16`` (the weight's bfloat16
    copy) in the fixed-size calls :func:`slimrag.llm.model.bf16.calls` gives, bfloat16 out (float32
    with a bias)."""
    if mode == BF16:
        assert w16 is not None, "bf16 products need the weight's bfloat16 copy"
        return bf16.linear(x, w16, bias)
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


def _row_independent(model: Decoder, mode: str, seed: int,
                     copies: tuple[bf16.Copy | None, ...] = (None,) * 4) -> bool:
    """Whether layer 0's four products give each row the same result whatever rows share its
    call, at several offsets and counts (random rows). ``copies``: layer 0's bfloat16 copy, for
    ``bf16``, its call sizes settled (the counts then reach its widest calls)."""
    layer = model.layers[0]
    mats = [layer.attn.qkv, layer.attn.o, layer.gate_up, layer.down]
    chunk = max(bf16.WIDE) if mode == BF16 else CHUNK
    gen = torch.Generator(device="cpu").manual_seed(seed)
    rows = chunk + 24
    cuts = [(0, 1), (5, 7), (9, 12), (20, 27), (30, 47), (10, 10 + chunk + 3), (0, rows)]
    with torch.inference_mode():
        for w, w16 in zip(mats, copies, strict=True):
            x = torch.randn(rows, w.shape[1], generator=gen).to(dtype=model.dtype, device=model.device)
            full = _product(x, w, None, mode, w16)
            if not all(torch.equal(_product(x[a:b], w, None, mode, w16), full[a:b]) for a, b in cuts):
                return False
    return True


def _first_copy(model: Decoder, seed: int) -> tuple[bf16.Copy, ...]:
    """Layer 0's bfloat16 copy, each product allowed the call sizes :func:`bf16.sizes` checks."""
    return tuple(bf16.sizes(w, seed) for w in model.bf16_weights(layers=1)[0])


def prefill_mode(model: Decoder, *, seed: int = 0, bf16: bool | None = None) -> str:
    """How this model's prompts may be prefilled in one pass: ``bf16`` where :func:`bf16_fits`
    (or ``bf16=True``) and a row's bfloat16 product does not depend on its place in the call nor its
    neighbours, in calls of the sizes :func:`slimrag.llm.model.bf16.sizes` allowed each product
    (each checked against :data:`slimrag.llm.model.bf16.CHUNK`-row calls; the bfloat16 copy is then built and held:
    :meth:`Decoder.bf16_weights`); else ``rows`` for a quantized model without ``dense_rows``
    whose kernel's rows are independent; else ``chunks`` where the same holds for float32 in
    :data:`CHUNK`-row calls; else ``segments`` (one forward per segment). Each checked on layer
    0's projections with random rows at several offsets and counts (the output head multiplies
    one row per pass, so it needs no check; leaving it out keeps the check under ~0.1 s)."""
    if bf16_fits(model) if bf16 is None else bf16:
        first = _first_copy(model, seed)
        if _row_independent(model, BF16, seed, first):
            model.bf16_weights(first=first)  # layer 0's copy is the check's, not built again
            return BF16
    mode = ROWS if _rows_kernel(model) else CHUNKS
    return mode if _row_independent(model, mode, seed) else SEGMENTS


def prefill(model: Decoder, ids: torch.Tensor, positions: torch.Tensor, cache: KVCache,
            spans: Sequence[int], mode: str = ROWS) -> torch.Tensor:
    """Run the segments whose token counts are ``spans`` (in order; ``ids`` and ``positions``
    their tokens joined) on top of ``cache``, which gains their K/V; returns the float32 logits
    of the last position. ``mode``: what :func:`prefill_mode` returned for the model (never
    ``segments``: segment K/V would then differ from a forward of their own). Run it under
    ``torch.inference_mode``."""
    if mode not in (ROWS, CHUNKS, BF16):
        raise ValueError(f"one-pass prefill runs in mode {ROWS!r}, {CHUNKS!r} or {BF16!r}, not {mode!r}")
    n = int(ids.shape[0])
    if not spans or any(s <= 0 for s in spans) or sum(spans) != n or positions.shape[0] != n:
        raise ValueError(f"spans {list(spans)} must be positive and cover the {n} tokens")
    model.warm_step(wait=False)  # decode comes next: its graph loads beside this pass
    c = model.config
    kw = {"heads": c.num_heads, "kv_heads": c.num_kv_heads, "head_dim": c.head_dim, "eps": c.rms_eps}
    base = cache.length
    cache.reserve(base + n)
    bounds = list(itertools.pairwise(itertools.accumulate(spans, initial=0)))
    x = model.embed.rows(ids)
    cos, sin = model.rope.cos_sin(positions, x.dtype)
    sdpa_dtype = torch.bfloat16 if mode == BF16 else None
    copies = model.bf16_weights() if mode == BF16 else [(None,) * 4] * len(model.layers)
    for i, (layer, (qkv16, o16, gate_up16, down16)) in enumerate(zip(model.layers, copies, strict=True)):
        a = layer.attn
        # K/V are stored in float32; a bfloat16 product's output is added into the float32 x
        qkv = _product(rms_norm(x, layer.input_norm, c.rms_eps), a.qkv, a.qkv_bias, mode, qkv16).float()
        att = torch.cat([attend(qkv[s:e], a, i, cache, model.rope, cos[s:e], sin[s:e], None, at=base + s,
                                compute_dtype=sdpa_dtype, **kw) for s, e in bounds])
        x = x + _product(att, a.o, None, mode, o16)
        h = rms_norm(x, layer.post_norm, c.rms_eps)
        gate, up = _product(h, layer.gate_up, None, mode, gate_up16).chunk(2, dim=-1)
        x = x + _product(F.silu(gate) * up, layer.down, None, mode, down16)
    cache.advance(n)
    # one row: the weight's own product, the same in every run of this prompt
    return _product(rms_norm(x[-1:], model.norm, c.rms_eps), model.lm_head, None).float()[0]
