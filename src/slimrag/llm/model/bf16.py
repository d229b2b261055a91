"""Prefill products in bfloat16 on the CPU's AMX tiles: the weights' bfloat16 copy, the chunked product, and when it pays.

Why. A long prefill is compute-bound: ~2 x 106 M multiply-adds per token on SmolLM2-135M. On a
CPU with AMX (``amx_bf16``: Intel Sapphire Rapids and later) oneDNN multiplies bfloat16 matrices
on the tile unit, measured here at ~450 GFLOP/s on one core for the MLP's 3072 x 576 product
against ~100 for float32 (MKL) and less for the quantized kernel, whose activations are rounded
to int8 per block. Attention then runs in bfloat16 too (PyTorch's flash kernel: ~2.3x float32 on
a 1,300-token prompt); the residual stream, the norms and the K/V the cache stores stay float32.

Exactness. The KV tree's contract (same passages in the same order: tokens with the cache equal
tokens without it) needs a row's product to be independent of the rows sharing its call. oneDNN's
bfloat16 GEMM is so at a fixed call shape, not across shapes in general: at 2 threads here a
256-row call of the ``down`` product and a 512-row call of ``qkv`` sum some rows otherwise than
128-row calls do, while 64-, 256- and 512-row calls of the other products give every row bitwise
the 128-row result (at 1 thread every size from 64 to 512 does; below 64 another kernel runs).
So each product call takes one of a few fixed sizes, padded with zeros: a pass's rows run in
:data:`WIDE`-row calls where the product's check allowed that size, the rest in :data:`CHUNK`-row
calls, and a last remainder of at most :data:`SHORT` rows in one :data:`SHORT`-row call where
allowed. The load checks every size against :data:`CHUNK` on layer 0's own weights at the
process's thread count (:func:`sizes`, :mod:`slimrag.llm.model.prefill`), every layer takes
layer 0's answer (the kernel is chosen by shape, checked on all layers in
``tests/test_bf16_calls.py``), and a product called at another thread count than its check's
falls back to :data:`CHUNK`-row calls. A row's K/V are then the same whichever pass computed it.

Prepacked. Each copy is held in oneDNN's blocked layout for the tile kernel
(``torch.ops.mkldnn._reorder_linear_weight``), multiplied by ``_linear_pointwise``: a plain
matrix is reordered into that layout inside every call, which at 128 rows cost ~25% of the
product (``docs/benchmarks.md``). The packed product of a row equals ``torch.mm``'s at the
same call size (checked), so packing changes no number.

Knobs (defaults):

- :data:`CHUNK` = 128 rows: the reference call size (64 ran the products ~1.4x slower here).
- :data:`WIDE` = (512, 256): larger calls for long passes, tried widest first: fewer, larger calls
  run the products faster, and a short pass never pays for them (``docs/benchmarks.md``, "The
  2-thread target").
- :data:`SHORT` = 64: a warm question (~20 tokens) pads to 64 rows, not 128.
- :data:`SHARE` = 0.25 of the machine's memory for the copy (2 bytes per weight of the layers'
  four products: 212 MB for SmolLM2-135M, ~2.4 GB for a 1.2B model, 13 GB for a 7B one, which
  then keeps the quantized ``rows`` prefill).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from slimrag.cpu import bf16_units
from slimrag.llm.model.gguf import dequantize_rows
from slimrag.llm.model.qlinear import QuantLinear, QuantPart

#: Rows per bfloat16 product call, the reference size every other size is checked against (module header).
CHUNK = 128
#: Larger call sizes for a long pass, widest first, each used only where its check allowed it (module header).
WIDE = (512, 256)
#: The call size for a pass's last remainder of at most this many rows, where allowed (module header).
SHORT = 64
#: The schedule's name in the KV namespace (``ModelRunner.namespace``): a new one whenever the
#: products' call sizes or kernels change, so no process reads K/V another schedule computed.
SCHEDULE = f"bf16-packed-chunks{CHUNK}-wide-short{SHORT}-v2"
#: The share of the machine's memory the bfloat16 copy may take (module header).
SHARE = 0.25


#: Where a container's memory limit is written (cgroup v2, then v1): a copy budgeted on the host's
#: RAM alone could exceed it and have the process killed at load.
CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def memory_bytes(limits: tuple[Path, ...] = CGROUP_LIMITS) -> int:
    """The memory this process may use, bytes: the machine's physical memory, or the container's
    limit where one is set and smaller (0 where the OS says neither: no copy is budgeted)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0
    for limit in limits:
        try:
            text = limit.read_text().strip()
        except OSError:
            continue  # no such cgroup file here: the next, or none
        if text.isdigit():
            total = min(total, int(text))  # "max" (v2) means no limit
    return total


def fits(copy_bytes: int, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a model of ``dtype`` on ``device`` whose copy takes ``copy_bytes`` may prefill in
    bfloat16: a float32 CPU model, a CPU with AMX bfloat16 tiles, the copy within :data:`SHARE`."""
    return (device.type == "cpu" and dtype == torch.float32 and bf16_units()
            and copy_bytes <= SHARE * memory_bytes())


@dataclass(frozen=True, slots=True)
class Copy:
    """One product's bfloat16 weights, prepacked for oneDNN (module header), and the call sizes
    its rows may run in besides :data:`CHUNK`: ``wide`` (0: none) and ``short`` (whether
    :data:`SHORT`-row calls are allowed), both checked at ``threads`` torch threads."""

    packed: torch.Tensor
    wide: int = 0
    short: bool = False
    threads: int = 0

    @property
    def shape(self) -> torch.Size:
        """``[out_features, in_features]``, as the weight's."""
        return self.packed.shape

    def dense(self) -> torch.Tensor:
        """The bfloat16 matrix itself (plain layout): for tests and checks."""
        return self.packed.to_dense()

    def allowing(self, wide: int, short: bool) -> Copy:
        """The same weights, allowed ``wide``- and (``short``) :data:`SHORT`-row calls at this
        process's thread count."""
        return Copy(self.packed, wide, short, torch.get_num_threads())


def copy(w: torch.Tensor | QuantLinear, like: Copy | None = None) -> Copy:
    """``w`` as a prepacked bfloat16 :class:`Copy` (a quantized one dequantized into one float32
    matrix of this product's rows, never the whole model in float32), allowed :data:`CHUNK`-row
    calls only, or the call sizes of ``like`` (the same product of layer 0, already checked: :func:`sizes`)."""
    plain = (w if isinstance(w, torch.Tensor) else _matrix(w)).to(torch.bfloat16).contiguous()
    packed = torch.ops.mkldnn._reorder_linear_weight(plain, CHUNK)
    return Copy(packed) if like is None else replace(like, packed=packed)


def _matrix(w: QuantLinear) -> torch.Tensor:
    """``w``'s float32 weights: its stored parts dequantized in numpy straight into their rows of
    one matrix, with no per-part tensors to join and no torch call per part (torch's threads
    stall behind a busy core: ``docs/benchmarks.md``, "The bfloat16 copy's build")."""
    out = np.empty(tuple(w.shape), np.float32)
    start = 0
    for part in w.parts:
        _dequantized(part, out[start : start + part.rows])
        start += part.rows
    return torch.from_numpy(out)


def _dequantized(part: QuantPart, out: np.ndarray | None = None) -> torch.Tensor:
    """``part``'s float32 weights (:func:`slimrag.llm.model.gguf.dequantize_rows`: Q4_1 and Q8_0,
    the embedded model's types, by the fast dequantizers, bitwise ``gguf``'s values; other types by
    ``gguf.quants``), written into ``out`` (its rows of a product's matrix) when given."""
    return torch.from_numpy(dequantize_rows(part.raw, part.ggml_type, out))


def calls(n: int, w: Copy) -> list[int]:
    """The call sizes, in order, that ``n`` rows run in through ``w`` (module header): ``w.wide``
    while that many rows remain, then :data:`CHUNK`, the last remainder of at most
    :data:`SHORT` rows in one :data:`SHORT`-row call where allowed; the last call padded. At
    another thread count than ``w``'s check, :data:`CHUNK` only."""
    checked = w.threads == torch.get_num_threads()
    wide = w.wide if checked else 0
    out = [wide] * (n // wide) if wide else []
    rest = n - sum(out)
    while rest > 0:
        size = SHORT if checked and w.short and rest <= SHORT else CHUNK
        out.append(size)
        rest -= size
    return out


def product(x: torch.Tensor, w: Copy) -> torch.Tensor:
    """``x`` (bfloat16, rows exactly one allowed call size) times ``w``: one oneDNN call."""
    return torch.ops.mkldnn._linear_pointwise(x, w.packed, None, "none", [], "")


def linear(x: torch.Tensor, w16: Copy, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ w16.T``: ``x`` rounded to bfloat16, in the calls :func:`calls` gives (the last
    padded with zeros); bfloat16 out, or float32 with ``bias`` added."""
    n, k = x.shape
    sizes = calls(n, w16)
    m = sum(sizes)
    xb = torch.empty(m, k, dtype=torch.bfloat16, device=x.device)
    xb[:n] = x
    xb[n:] = 0
    if len(sizes) == 1:
        y = product(xb, w16)
    else:
        starts = [0, *itertools.accumulate(sizes)][:-1]
        y = torch.cat([product(xb[s : s + size], w16) for s, size in zip(starts, sizes, strict=True)])
    return y[:n] if bias is None else y[:n].float() + bias


def sizes(w: Copy, seed: int = 0) -> Copy:
    """``w`` allowed the widest of :data:`WIDE` and :data:`SHORT` whose calls give random rows
    bitwise the result of :data:`CHUNK`-row calls, at this process's thread count (neither where
    none does)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    rows = max(WIDE)
    x = torch.randn(rows, w.shape[1], generator=gen).to(torch.bfloat16)

    def through(size: int) -> torch.Tensor:
        return torch.cat([product(x[i : i + size], w) for i in range(0, rows, size)])

    ref = through(CHUNK)
    wide = next((s for s in WIDE if rows % s == 0 and torch.equal(through(s), ref)), 0)
    return w.allowing(wide, torch.equal(through(SHORT), ref))
