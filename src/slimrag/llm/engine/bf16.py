"""Prefill products in bfloat16 on the CPU's AMX tiles: the weights' bfloat16 copy, the chunked product, and when it pays.

Why. A long prefill is compute-bound: ~2 x 106 M multiply-adds per token on SmolLM2-135M. On a
CPU with AMX (``amx_bf16``: Intel Sapphire Rapids and later) oneDNN multiplies bfloat16 matrices
on the tile unit, measured here at ~450 GFLOP/s on one core for the MLP's 3072 x 576 product
against ~100 for float32 (MKL) and less for the quantized kernel, whose activations are rounded
to int8 per block. Attention then runs in bfloat16 too (PyTorch's flash kernel: ~2.3x float32 on
a 1,300-token prompt); the residual stream, the norms and the K/V the cache stores stay float32.

Exactness. The KV tree's contract (same passages in the same order: tokens with the cache equal
tokens without it) needs a row's product to be independent of the rows sharing its call. oneDNN's
bfloat16 GEMM is checked to be so at one call shape (:mod:`slimrag.llm.engine.prefill`), so every
product call takes exactly :data:`CHUNK` rows (the last padded with zeros), as float32's
``chunks`` mode does.

Knobs (defaults):

- :data:`CHUNK` = 128 rows per call: 64 ran the products ~1.4x slower here, 256 ~1.15x faster
  but pads a lone question (~20 tokens) to 256 rows.
- :data:`SHARE` = 0.25 of the machine's memory for the copy (2 bytes per weight of the layers'
  four products: 212 MB for SmolLM2-135M, ~2.4 GB for a 1.2B model, 13 GB for a 7B one, which
  then keeps the quantized ``rows`` prefill).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from slimrag.cpu import bf16_units
from slimrag.llm.engine.gguf import dequantize_rows
from slimrag.llm.engine.qlinear import QuantLinear, QuantPart

#: Rows per bfloat16 product call (module header).
CHUNK = 128
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


def copy(w: torch.Tensor | QuantLinear) -> torch.Tensor:
    """``w`` as a contiguous bfloat16 matrix (a quantized one dequantized one stored part at a time,
    never held in float32)."""
    if isinstance(w, torch.Tensor):
        return w.to(torch.bfloat16).contiguous()
    return torch.cat([_dequantized(p).to(torch.bfloat16) for p in w.parts])


def _dequantized(part: QuantPart) -> torch.Tensor:
    """``part``'s float32 weights (:func:`slimrag.llm.engine.gguf.dequantize_rows`: Q4_1 and Q8_0,
    the embedded model's types, by the fast dequantizers, bitwise ``gguf``'s values; other types by
    ``gguf.quants``)."""
    return torch.from_numpy(dequantize_rows(part.raw, part.ggml_type))


def linear(x: torch.Tensor, w16: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ w16.T``: ``x`` rounded to bfloat16, in calls of exactly :data:`CHUNK` rows (the last
    padded with zeros); bfloat16 out, or float32 with ``bias`` added."""
    n, k = x.shape
    m = n + (-n % CHUNK)
    xb = torch.empty(m, k, dtype=torch.bfloat16, device=x.device)
    xb[:n] = x
    xb[n:] = 0
    y = torch.empty(m, w16.shape[0], dtype=torch.bfloat16, device=x.device)
    wt = w16.t()
    for i in range(0, m, CHUNK):
        torch.mm(xb[i : i + CHUNK], wt, out=y[i : i + CHUNK])
    return y[:n] if bias is None else y[:n].float() + bias
