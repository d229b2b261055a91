"""One decode step for several sequences at once, each row bitwise the one-token forward of its sequence alone.

Why this shape. On a CPU (torch with MKL) a row of a float32 matrix product is not always the
product of that row alone: the library picks its kernel by the shape, and kernels sum in
different orders. One row (``F.linear`` at M = 1, the one-token :meth:`Decoder.forward`) is a
matrix-vector product (``gemv``); two or more rows go through ``gemm``, whose rows differ from
``gemv``'s in the last bits, and ``gemm`` at small M also pays for packing the weights: measured
here (one thread, SmolLM2-135M shapes), ``gemm`` at 4 rows cost 2-3.5x ``gemv`` at one row (the
49152 x 576 output head: 71 ms against 20 ms), so padding a lone request to 4 rows to keep it
equal to a batched one cost more than its products.

So a step here computes **every row as its own matrix-vector product**, the very product of the
one-token forward:

- one sequence: exactly :meth:`Decoder.forward` on its one token (no padding, no copies: a lone
  stream pays nothing for batching);
- several: the row-wise parts (norms, projections, the MLP, the output head) run over the rows
  together, each projection as ``torch.mv`` per row over blocks of :data:`BLOCK_ROWS` output rows
  of the weight (a block stays in the core's cache while every row multiplies it, so the weights
  are read from memory about once per step, not once per row); attention runs per sequence (its
  new token over its own :class:`KVCache`, as :func:`slimrag.llm.model.attention.attend` does
  for an unbatched step).

A block's ``mv`` gives bitwise the matching slice of the whole matrix's ``mv``, which equals
``F.linear`` at M = 1 (``gemv`` sums each output over the input axis in one order whatever the
number of output rows). A quantized weight (:mod:`slimrag.llm.model.qlinear`) is multiplied by
its kernel over all rows at once: that kernel's rows do not depend on each other. Both are
checked, not assumed: :func:`rows_are_exact` multiplies random rows by the model's own matrices
both ways and compares; where it fails (another BLAS, a GPU), a step makes one product call per
row instead (exact by construction, slower for many rows). A float matrix with a bias (Qwen2's
qkv) always goes that way. Either way a row's
logits are those of its sequence stepped alone, so tokens do not depend on who else is served,
and batched and unbatched decoding (``BatchConfig(width=1)``) give the same tokens.

A quantized model (every projection on the GGUF's blocks) runs its one-token forward as one
fused ONNX Runtime graph (:mod:`slimrag.llm.model.step`); a step of several rows runs that graph
once per row, so each row is its one-token forward by construction. A row then reads the weights
on its own (the products are about half of the embedded model's ~22 ms step at 1 thread,
``docs/benchmarks.md``), but the per-operation cost the rows used to share is gone from every row.

Knob: :data:`BLOCK_ROWS` = 256 (a 256 x 1536 float32 block is 1.5 MB, inside a 2 MB L2 per
core; smaller blocks pay more Python calls per step, larger ones fall out of L2).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from slimrag.llm.model.attention import attend
from slimrag.llm.model.cache import KVCache
from slimrag.llm.model.model import Decoder
from slimrag.llm.model.norm import rms_norm

#: Output rows of a weight block multiplied by every row of a step before the next block (see the
#: module header).
BLOCK_ROWS = 256


def _one_row(w: Any, dense_rows: int | None) -> Any:
    """What the one-token forward multiplies by: a float tensor, or a quantized weight (a callable
    ``x -> x @ W.T`` on its blocks, :class:`slimrag.llm.model.qlinear.QuantLinear`), or that
    weight's float32 copy when the model multiplies even one row in float32 (``dense_rows <= 1``)."""
    if isinstance(w, torch.Tensor) or dense_rows is None or dense_rows > 1:
        return w
    return w.dense()


def _rowwise(x: torch.Tensor, w: Any, bias: torch.Tensor | None, dense_rows: int | None,
             together: bool) -> torch.Tensor:
    """``x @ w.T (+ bias)``, each row bitwise the one-row product of the forward. ``together``:
    one call for all rows (weight blocks for a float matrix; the kernel over all rows for a
    quantized one), where :func:`rows_are_exact` found that exact; else one call per row."""
    w = _one_row(w, dense_rows)
    if not isinstance(w, torch.Tensor):  # quantized: the kernel's rows do not depend on each other
        y = w(x) if together else torch.cat([w(x[r : r + 1]) for r in range(x.shape[0])])
        return y if bias is None else y + bias
    b = x.shape[0]
    if b == 1 or bias is not None or not together:
        return torch.cat([F.linear(x[r : r + 1], w, bias) for r in range(b)])
    out = x.new_empty(b, w.shape[0])
    for a in range(0, w.shape[0], BLOCK_ROWS):
        block = w[a : a + BLOCK_ROWS]
        for r in range(b):
            torch.mv(block, x[r], out=out[r, a : a + BLOCK_ROWS])
    return out


def decode_step(model: Decoder, ids: Sequence[int], positions: Sequence[int], caches: Sequence[KVCache],
                width: int | None = None, *, together: bool = True) -> torch.Tensor:
    """Feed token ``ids[i]`` at ``positions[i]`` to sequence ``caches[i]`` (which gains its K/V)
    for every ``i``. Returns float32 logits ``[len(ids), vocab]``, row ``i`` bitwise the logits of
    ``model.forward`` on that token alone. ``width``: the most rows the caller allows (checked);
    ``together``: one product call for all rows (only where :func:`rows_are_exact` said so). Run
    it under ``torch.inference_mode``."""
    b = len(ids)
    if not 0 < b <= (width or b) or len(positions) != b or len(caches) != b:
        raise ValueError(f"{b} ids, {len(positions)} positions and {len(caches)} caches for width {width}")
    dev = model.device
    if b == 1 or getattr(model, "fused_step", False):  # the lone stream, or the fused step row by row
        rows = [model.forward(torch.tensor([t], dtype=torch.long, device=dev),
                              torch.tensor([p], dtype=torch.long, device=dev), cache)
                for t, p, cache in zip(ids, positions, caches, strict=True)]
        return rows[0].unsqueeze(0) if b == 1 else torch.stack(rows)  # a lone row: a view, not a copy
    c, dense = model.config, getattr(model, "dense_rows", None)
    kw = {"heads": c.num_heads, "kv_heads": c.num_kv_heads, "head_dim": c.head_dim, "eps": c.rms_eps}
    x = model.embed.rows(torch.tensor(list(ids), dtype=torch.long, device=dev))
    cos, sin = model.rope.cos_sin(torch.tensor(list(positions), dtype=torch.long, device=dev), x.dtype)
    attended = x.new_empty(b, c.num_heads * c.head_dim)
    for i, layer in enumerate(model.layers):
        a = layer.attn
        qkv = _rowwise(_norm_rows(x, layer.input_norm, c.rms_eps), a.qkv, a.qkv_bias, dense, together)
        for r, cache in enumerate(caches):
            attended[r : r + 1] = attend(qkv[r : r + 1], a, i, cache, model.rope, cos[r : r + 1], sin[r : r + 1],
                                         None, **kw)
        x = x + _rowwise(attended, a.o, None, dense, together)
        h = _norm_rows(x, layer.post_norm, c.rms_eps)
        gate, up = _rowwise(h, layer.gate_up, None, dense, together).chunk(2, dim=-1)
        x = x + _rowwise(F.silu(gate) * up, layer.down, None, dense, together)
    for cache in caches:
        cache.advance(1)
    return _rowwise(_norm_rows(x, model.norm, c.rms_eps), model.lm_head, None, dense, together).float()


def _norm_rows(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:func:`rms_norm` of each row on its own (a reduction over a ``[b, hidden]`` tensor may sum
    in another order than over ``[1, hidden]``; per row it is the forward's own call)."""
    return torch.cat([rms_norm(x[r : r + 1], weight, eps) for r in range(x.shape[0])])


def rows_are_exact(model: Decoder, rows: int = 3, *, seed: int = 0) -> bool:
    """True when one product call for several rows (weight blocks of :data:`BLOCK_ROWS` for a
    float matrix, the kernel over all rows for a quantized one) gives, for the model's own
    matrices (layer 0's projections and the output head), bitwise the one-row product of every
    row (see the module header)."""
    layer = model.layers[0]
    dense = getattr(model, "dense_rows", None)
    mats = [layer.attn.qkv, layer.attn.o, layer.gate_up, layer.down, model.lm_head]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.inference_mode():
        for w in mats:
            x = torch.randn(rows, w.shape[1], generator=gen).to(dtype=model.dtype, device=model.device)
            if not torch.equal(_rowwise(x, w, None, dense, True), _rowwise(x, w, None, dense, False)):
                return False
    return True
