"""The bfloat16 copy's build at load (``serve``'s start): the numpy dequantizers and the copy they
feed give, bit for bit, the numbers of the torch code they replaced, on every tensor of the shipped
SmolLM2 GGUF, and ``gguf``'s reference values.

The torch formulas below are the previous implementation, kept here as the reference: Q4_1 as
``d * q + m`` over torch tensors, and the copy as each part dequantized alone, rounded to bfloat16
and joined with ``torch.cat``. Floats are compared through their bit patterns (a -0.0 against a
0.0, or a NaN, would pass ``array_equal`` on values or fail it wrongly)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from slimrag.llm import weights
from slimrag.llm.model import bf16
from slimrag.llm.model.gguf import FAST_DEQUANT, GGUFFile, dequantize_rows
from slimrag.llm.model.qlinear import Q4_1, Q8_0, QuantLinear


def _torch_q4_1(raw: np.ndarray) -> np.ndarray:
    """The previous Q4_1 dequantizer, in torch (``gguf.py`` before the numpy one)."""
    with warnings.catch_warnings():  # a read-only view of the map; it is only read
        warnings.simplefilter("ignore", UserWarning)
        b = torch.from_numpy(raw).reshape(-1, 20)
    d = b[:, 0:2].contiguous().view(torch.float16).float()
    m = b[:, 2:4].contiguous().view(torch.float16).float()
    q = torch.cat([b[:, 4:] & 0x0F, b[:, 4:] >> 4], dim=1).float()
    return (d * q + m).reshape(raw.shape[0], -1).numpy()


def _torch_plain(w: QuantLinear) -> torch.Tensor:
    """The previous build of a product's bfloat16 matrix: each part alone, rounded, then joined."""
    return torch.cat([torch.from_numpy(_torch_q4_1(p.raw)).to(torch.bfloat16) for p in w.parts])


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.int32)


def test_q4_1_equals_the_torch_formula_and_gguf_bitwise_on_every_tensor(smollm: weights.LoadedModel) -> None:
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    file = GGUFFile(smollm.path)
    q4 = [info for info in file.tensors.values() if info.ggml_type == Q4_1]
    assert len(q4) >= 200  # 30 layers x 7 projections of SmolLM2-135M
    for info in q4:
        raw = file.raw(info)
        got = FAST_DEQUANT[Q4_1](raw)
        assert got.dtype == np.float32 and got.shape == (raw.shape[0], info.shape[-1])
        assert np.array_equal(_bits(got), _bits(_torch_q4_1(raw))), info.name
        want = dequantize(raw, GGMLQuantizationType.Q4_1).reshape(raw.shape[0], -1)
        assert np.array_equal(_bits(got), _bits(want)), info.name


def test_rows_written_into_a_slice_equal_rows_dequantized_alone(smollm: weights.LoadedModel) -> None:
    file = GGUFFile(smollm.path)
    for name in ("blk.0.attn_k.weight", "token_embd.weight", "blk.0.attn_norm.weight"):
        info = file.tensors[name]
        raw = file.raw(info)[:40]  # a norm has one row
        n = raw.shape[0]
        alone = dequantize_rows(raw, info.ggml_type)
        big = np.full((n + 10, alone.shape[1]), np.nan, np.float32)
        got = dequantize_rows(raw, info.ggml_type, out=big[5 : 5 + n])
        assert np.shares_memory(got, big)
        assert np.array_equal(_bits(big[5 : 5 + n]), _bits(alone)), name
        assert np.isnan(big[:5]).all() and np.isnan(big[5 + n :]).all(), name  # nothing written outside
    assert {file.tensors[n].ggml_type for n in ("blk.0.attn_k.weight", "token_embd.weight")} == {Q4_1, Q8_0}
    raw = file.raw(file.tensors["blk.0.attn_k.weight"])
    with pytest.raises(ValueError, match="C-contiguous float32"):
        dequantize_rows(raw, Q4_1, out=np.empty((raw.shape[0], 2 * 576), np.float32)[:, ::2])
    with pytest.raises(ValueError, match="C-contiguous float32"):
        dequantize_rows(raw, Q4_1, out=np.empty((raw.shape[0], 576), np.float64))


def test_the_bf16_copy_equals_the_per_part_torch_build_on_every_product(smollm: weights.LoadedModel) -> None:
    """Every layer's four products: the plain bfloat16 matrix the copy packs is bitwise the one
    the previous build joined from per-part torch tensors."""
    checked = 0
    for layer in smollm.model.layers:
        for w in (layer.attn.qkv, layer.attn.o, layer.gate_up, layer.down):
            assert isinstance(w, QuantLinear)
            new = bf16._matrix(w).to(torch.bfloat16)
            assert torch.equal(new.view(torch.int16), _torch_plain(w).view(torch.int16))
            checked += 1
    assert checked == 4 * smollm.model.config.num_layers
    gate_up = smollm.model.layers[0].gate_up  # and the packed copy the prefill multiplies by
    assert isinstance(gate_up, QuantLinear)
    assert torch.equal(bf16.copy(gate_up).dense().view(torch.int16), _torch_plain(gate_up).view(torch.int16))
