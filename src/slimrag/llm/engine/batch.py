"""One decode step for several sequences at once, each row's numbers independent of the batch.

Why this shape. On a CPU (torch with MKL) a row of a float32 matrix product is not always the
product of that row alone: the library picks its kernel by the shape, and kernels sum in
different orders. Measured here (``docs/bench_generation.md``, "Batched decode") for every
projection of SmolLM2-135M (576 -> 960 qkv, 576 -> 576 o, 576 -> 3072 gate/up, 1536 -> 576 down,
576 -> 49152 output head):

- ``F.linear(x, W)`` with ``x`` of M rows: M = 1 is one class, M = 2-3 another, M >= 4 a third;
  M = 4 costs about 1.4x M = 1 per step, so padding a lone request to 4 rows slows it.
- ``(W @ x.T).T`` (the rows as the columns of the right-hand operand): M = 4 and M = 8 give
  bitwise the same row whatever row it sits in and whatever the other rows hold, with 1 or 2
  threads, and M = 4 costs about what ``F.linear`` does at M = 1 (the kernel works in blocks of 4
  columns; M = 5-7 and 9-11 put the last rows through an edge kernel and differ).

So a decode step here

- runs the row-wise parts (norms, projections, the MLP, the output head) over every sequence's
  row together in the ``(W @ x.T).T`` form, padded with zero rows to the smallest allowed width
  that holds them (:data:`WIDTHS`: 4 or 8), and
- runs attention per sequence (its one new token over its own :class:`KVCache`, the very shapes
  of an unbatched decode step: :func:`slimrag.llm.engine.attention.attend`),

which gives every sequence bitwise the logits of a step of its own, whichever requests share the
step. That is what lets batched serving give the tokens of unbatched runs. (The one-token
:meth:`Decoder.forward` uses ``F.linear`` at M = 1, another class: its logits may differ in the
last bits from this step's, so a generator decodes every step one way or the other, never both.)

The widths are checked, not assumed: :func:`invariant_widths` multiplies random rows by the
model's own matrices (layer 0's projections and the output head) at each allowed width with the
rows shuffled, and keeps the widths only if each row equals its product at the largest width;
otherwise (another BLAS, another CPU, a GPU) it returns the largest width alone, and every step
is padded to it: still exact, only slower for a lone request.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from slimrag.llm.engine.attention import attend
from slimrag.llm.engine.cache import KVCache
from slimrag.llm.engine.model import Decoder
from slimrag.llm.engine.norm import rms_norm

#: Row counts a step is padded to (see the module header), smallest first.
WIDTHS = (4, 8)


def _rows(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` computed as ``(w @ x.T).T`` (the row-invariant form; contiguous result)."""
    return (w @ x.t()).t().contiguous()


def decode_step(model: Decoder, ids: Sequence[int], positions: Sequence[int], caches: Sequence[KVCache],
                width: int) -> torch.Tensor:
    """Feed token ``ids[i]`` at ``positions[i]`` to sequence ``caches[i]`` (which gains its K/V)
    for every ``i``, computing the row-wise parts over ``width`` rows (the sequences' and zero
    padding). Returns float32 logits ``[len(ids), vocab]``. Run it under ``torch.inference_mode``."""
    b = len(ids)
    if not 0 < b <= width or len(positions) != b or len(caches) != b:
        raise ValueError(f"{b} ids, {len(positions)} positions and {len(caches)} caches for width {width}")
    c = model.config
    kw = {"heads": c.num_heads, "kv_heads": c.num_kv_heads, "head_dim": c.head_dim, "eps": c.rms_eps}
    dev, dt = model.device, model.dtype
    x = torch.zeros(width, model.embed.shape[1], dtype=dt, device=dev)
    x[:b] = F.embedding(torch.tensor(list(ids), dtype=torch.long, device=dev), model.embed)
    cos, sin = model.rope.cos_sin(torch.tensor(list(positions), dtype=torch.long, device=dev), dt)
    attended = torch.zeros(width, c.num_heads * c.head_dim, dtype=dt, device=dev)
    for i, layer in enumerate(model.layers):
        qkv = _rows(rms_norm(x, layer.input_norm, c.rms_eps), layer.attn.qkv)
        if layer.attn.qkv_bias is not None:
            qkv = qkv + layer.attn.qkv_bias
        for r, cache in enumerate(caches):
            attended[r : r + 1] = attend(qkv[r : r + 1], layer.attn, i, cache, model.rope, cos[r : r + 1],
                                         sin[r : r + 1], None, **kw)
        x = x + _rows(attended, layer.attn.o)
        gate, up = _rows(rms_norm(x, layer.post_norm, c.rms_eps), layer.gate_up).chunk(2, dim=-1)
        x = x + _rows(F.silu(gate) * up, layer.down)
    for cache in caches:
        cache.advance(1)
    return _rows(rms_norm(x, model.norm, c.rms_eps), model.lm_head)[:b].float()


def invariant_widths(model: Decoder, widths: Sequence[int] = WIDTHS, *, seed: int = 0) -> tuple[int, ...]:
    """``widths`` (sorted) if a row's product with each of the model's matrices, in the form
    :func:`decode_step` uses, is bitwise the same at every one of them and at any row placement
    and neighbours (see the module header); else the largest width alone."""
    widths = tuple(sorted(set(widths)))
    if not widths or widths[0] < 1:
        raise ValueError(f"decode widths must be positive, got {widths}")
    top = widths[-1]
    layer = model.layers[0]
    mats = [layer.attn.qkv, layer.attn.o, layer.gate_up, layer.down, model.lm_head]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.inference_mode():
        for w in mats:
            x = torch.randn(top, w.shape[1], generator=gen).to(dtype=w.dtype, device=w.device)
            full = _rows(x, w)
            for width in widths:
                pick = torch.randperm(top, generator=gen)[:width].to(w.device)
                if not torch.equal(_rows(x[pick], w), full[pick]):
                    return (top,)
    return widths
