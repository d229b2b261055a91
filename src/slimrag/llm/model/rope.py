"""Rotary position embedding (RoPE) and the scaling variants Llama 3, Qwen and Mistral use.

Each head's vector is cut in two halves ``(x1, x2)``; position ``p`` rotates the pair
``(x1[i], x2[i])`` by the angle ``p * inv_freq[i]``: ``x * cos + rotate_half(x) * sin`` with
``rotate_half(x) = (-x2, x1)`` (the "half" layout of HF checkpoints; GGUF files of the llama
architecture store q/k rows interleaved instead, and the loader undoes that permutation, so one
form serves every file). ``inv_freq[i] = theta ** (-2i / head_dim)``, then scaled:

- ``default``: as is.
- ``linear``: every frequency divided by ``factor`` (positions stretched).
- ``llama3``: wavelengths longer than ``original_max_positions / low_freq_factor`` divided by
  ``factor``, shorter than ``... / high_freq_factor`` kept, a smooth blend between.
- ``yarn``: per-frequency blend of interpolation and extrapolation over a ramp between the
  correction dimensions of ``beta_fast`` (32) and ``beta_slow`` (1); cos and sin are also scaled
  by ``attention_factor`` (default ``0.1 ln(factor) + 1``).
- GGUF files of Llama 3 carry the llama3 factors as a tensor (``rope_freqs.weight``): the
  frequencies are divided by it (``freq_factors``), which gives the same result.

Why not ``dynamic``/``longrope``: their angle is not linear in the position, so cached keys could
not be re-rotated by an offset (blend reuse), and no family the engine targets needs them.

cos and sin are computed once per position into a table (float32) that grows by doubling; a
forward gathers its rows, so the angles of a position are the same numbers in every forward
(a cached key and a recomputed one rotate identically).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn"})


@dataclass(frozen=True, slots=True)
class RopeConfig:
    """RoPE's base and scaling (see the module header for each type and knob)."""

    theta: float = 10000.0
    type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 8192
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    freq_factors: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.type not in ROPE_TYPES:
            raise ValueError(f"RoPE type {self.type!r} is not supported; the engine runs {sorted(ROPE_TYPES)}")
        if self.theta <= 0 or self.factor <= 0:
            raise ValueError(f"RoPE theta and factor must be positive, got {self.theta}, {self.factor}")

    @classmethod
    def from_hf(cls, raw: Mapping[str, Any], head_dim: int) -> RopeConfig:
        """From ``config.json``: ``rope_parameters`` (transformers 5) or ``rope_theta`` + ``rope_scaling``."""
        params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
        theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
        kind = str(params.get("rope_type", params.get("type", "default")))
        if kind == "default" or not params:
            return cls(theta=theta)
        original = params.get("original_max_position_embeddings") or raw.get("max_position_embeddings", 8192)
        factor = params.get("factor")
        if factor is None:  # yarn with only the original context: the ratio (as transformers does)
            factor = float(raw.get("max_position_embeddings", original)) / float(original)
        return cls(
            theta=theta, type=kind, factor=float(factor),
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)), original_max_positions=int(original),
            beta_fast=float(params.get("beta_fast") or 32.0), beta_slow=float(params.get("beta_slow") or 1.0),
            attention_factor=params.get("attention_factor"), mscale=params.get("mscale"),
            mscale_all_dim=params.get("mscale_all_dim"), truncate=bool(params.get("truncate", True)))

    @classmethod
    def from_gguf(cls, meta: Mapping[str, Any], arch: str, head_dim: int) -> RopeConfig:
        """From GGUF metadata (``{arch}.rope.*``); ``freq_factors`` is set by the loader."""
        theta = float(meta.get(f"{arch}.rope.freq_base", 10000.0))
        kind = str(meta.get(f"{arch}.rope.scaling.type", "none"))
        factor = float(meta.get(f"{arch}.rope.scaling.factor", 1.0) or 1.0)
        if kind in ("none", "") or factor == 1.0:
            return cls(theta=theta)
        original = int(meta.get(f"{arch}.rope.scaling.original_context_length", 8192))
        if kind not in ("linear", "yarn"):
            raise ValueError(f"GGUF RoPE scaling {kind!r} is not supported ({sorted(ROPE_TYPES)})")
        return cls(theta=theta, type=kind, factor=factor, original_max_positions=original,
                   beta_fast=float(meta.get(f"{arch}.rope.scaling.yarn_beta_fast", 32.0)),
                   beta_slow=float(meta.get(f"{arch}.rope.scaling.yarn_beta_slow", 1.0)))


def inverse_frequencies(cfg: RopeConfig, head_dim: int) -> tuple[torch.Tensor, float]:
    """``inv_freq`` (float32, ``head_dim / 2``) and the factor cos and sin are multiplied by."""
    dim = head_dim
    base = 1.0 / (cfg.theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scale = 1.0
    if cfg.type == "linear":
        base = base / cfg.factor
    elif cfg.type == "llama3":
        old = cfg.original_max_positions
        low_wavelen, high_wavelen = old / cfg.low_freq_factor, old / cfg.high_freq_factor
        wavelen = 2 * math.pi / base
        scaled = torch.where(wavelen > low_wavelen, base / cfg.factor, base)
        smooth = (old / wavelen - cfg.low_freq_factor) / (cfg.high_freq_factor - cfg.low_freq_factor)
        blended = (1 - smooth) * scaled / cfg.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        base = torch.where(medium, blended, scaled)
    elif cfg.type == "yarn":
        base, scale = _yarn(cfg, dim)
    if cfg.freq_factors is not None:
        base = base / torch.tensor(cfg.freq_factors, dtype=torch.float32)
    return base, scale


def _yarn(cfg: RopeConfig, dim: int) -> tuple[torch.Tensor, float]:
    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if cfg.attention_factor is not None:
        attention = float(cfg.attention_factor)
    elif cfg.mscale and cfg.mscale_all_dim:
        attention = mscale(cfg.factor, cfg.mscale) / mscale(cfg.factor, cfg.mscale_all_dim)
    else:
        attention = mscale(cfg.factor)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(cfg.original_max_positions / (rotations * 2 * math.pi))) / (2 * math.log(cfg.theta))

    low, high = correction_dim(cfg.beta_fast), correction_dim(cfg.beta_slow)
    if cfg.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    freqs = cfg.theta ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1 - ramp
    inv = (1.0 / (cfg.factor * freqs)) * (1 - extrapolation) + (1.0 / freqs) * extrapolation
    return inv, attention


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``(x1, x2) -> (-x2, x1)`` over the last axis."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Rope:
    """cos/sin tables for one model and the rotation itself (see the module header)."""

    def __init__(self, cfg: RopeConfig, head_dim: int, device: str | torch.device = "cpu") -> None:
        self.cfg, self.head_dim = cfg, head_dim
        inv, self.scale = inverse_frequencies(cfg, head_dim)
        self.inv_freq = inv.to(device)
        self._cos = self._sin = torch.empty(0, head_dim, device=device)

    def _grow(self, n: int) -> None:
        size = max(256, 1 << (n - 1).bit_length())
        freqs = torch.arange(size, device=self.inv_freq.device, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self._cos, self._sin = emb.cos() * self.scale, emb.sin() * self.scale

    def table(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole float32 cos and sin tables (``[rows, head_dim]``), grown first to cover
        positions below ``n``; they are replaced, not changed, when they grow."""
        if n > self._cos.shape[0]:
            self._grow(n)
        return self._cos, self._sin

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (``[n, head_dim]``, in ``dtype``) at ``positions`` (a long tensor of n)."""
        cos, sin = self.table(int(positions.max()) + 1 if positions.numel() else 0)
        return cos[positions].to(dtype), sin[positions].to(dtype)

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` (``[..., n, head_dim]``) by the angles in cos/sin (``[n, head_dim]``)."""
        return x * cos + rotate_half(x) * sin

    def shift(self, k: torch.Tensor, deltas: torch.Tensor) -> torch.Tensor:
        """``k`` (``[1, heads, n, head_dim]``, already rotated) rotated further by ``deltas[i]``
        positions per token (blend reuse), in float32. ``R(p + d) = R(d) R(p)``, so this is exact
        up to rounding; the attention factor is not applied a second time."""
        freqs = deltas.to(torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return self.apply(k.float(), emb.cos(), emb.sin()).to(k.dtype)
