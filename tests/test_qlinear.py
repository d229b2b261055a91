"""Products on GGUF blocks (``slimrag.llm.model.qlinear``) against the float32 product of the same weights.

Blocks are made by ``gguf.quants.quantize`` (llama.cpp's reference quantizers in Python) from
seeded random weights. The float32 reference is ``x @ dequantize(blocks).T`` with gguf's own
dequantizer. The kernel rounds the activations to int8 per 32-block (see the module header), so
the product is compared within a relative error bound measured on these shapes (Q4: ~1.5%, Q8_0:
~0.4%; bounds 3% and 1%), and the layout is checked exactly through ``dequantize``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from slimrag.llm import weights
from slimrag.llm.model.qlinear import (
    Q4_0,
    Q4_1,
    Q4_K,
    Q6_K,
    Q8_0,
    QuantLinear,
    QuantPart,
    dequantize,
    linear,
)

BOUND = {Q4_0: 0.03, Q4_1: 0.03, Q8_0: 0.01, Q4_K: 0.03, Q6_K: 0.01}


def _part(kind: int, rows: int, cols: int, seed: int) -> QuantPart:
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((rows, cols)) * 0.05 + rng.standard_normal((rows, 1)) * 0.02).astype(np.float32)
    return QuantPart(quantize(w, GGMLQuantizationType(kind)), kind, cols)


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


@pytest.mark.parametrize("kind", [Q4_0, Q4_1, Q8_0])
def test_the_product_on_the_blocks_is_within_the_bound_of_gguf_dequantized_weights(kind: int) -> None:
    """``dequantize`` is gguf's own dequantizer; the kernel's layouts of the blocks (nibble order,
    zero points, Q4_1's residual) must compute those weights within the int8 rounding bound."""
    part = _part(kind, 96, 256, seed=kind)
    dense = dequantize(part)
    w = QuantLinear([part], threads=1)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(kind))
    want = x @ torch.from_numpy(dense).T
    assert _rel(w(x), want) < BOUND[kind]
    assert torch.equal(w.dense(), torch.from_numpy(dense))


@pytest.mark.parametrize("threads", [1, 2])
def test_a_row_does_not_depend_on_the_other_rows(threads: int) -> None:
    """Bitwise: each of 8 rows alone, in any subset and order, and in the ``w @ x.T`` form."""
    w = QuantLinear([_part(Q4_1, 320, 576, 1), _part(Q8_0, 64, 576, 2)], threads=threads)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 576, generator=gen)
    full = w(x)
    assert torch.equal((w @ x.t()).t(), full)
    for width in (1, 2, 3, 4, 5, 8):
        pick = torch.randperm(8, generator=gen)[:width]
        assert torch.equal(w(x[pick]), full[pick]), width


def test_parts_of_different_types_stack_by_rows() -> None:
    parts = [_part(Q4_1, 64, 128, 3), _part(Q8_0, 32, 128, 4), _part(Q4_1, 32, 128, 5), _part(Q4_0, 32, 128, 6)]
    w = QuantLinear(parts, threads=1)
    assert w.shape == (160, 128)
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(1))
    got = w(x)
    at = 0
    for p in parts:
        want = x @ torch.from_numpy(dequantize(p)).T
        assert _rel(got[:, at : at + p.rows], want) < BOUND[p.ggml_type]
        at += p.rows


def test_linear_switches_to_float32_from_dense_rows_on() -> None:
    w = QuantLinear([_part(Q4_1, 64, 128, 7)], threads=1)
    x = torch.randn(4, 128, generator=torch.Generator().manual_seed(2))
    assert torch.equal(linear(x, w, dense_rows=4), x @ w.dense().T)
    assert torch.equal(linear(x, w, dense_rows=5), w(x))
    assert torch.equal(linear(x, w), w(x))


def test_a_block_type_the_kernel_does_not_take_is_refused() -> None:
    with pytest.raises(ValueError, match="not a block type"):
        QuantPart(np.zeros((2, 176), np.uint8), 13, 256)  # Q5_K
    with pytest.raises(ValueError, match="do not hold"):
        QuantPart(np.zeros((2, 19), np.uint8), Q4_1, 32)


def test_the_embedded_model_keeps_its_blocks_and_agrees_with_float32(smollm: weights.LoadedModel) -> None:
    """Default load: every projection quantized (the file's Q4_1 layers and Q8_0 head); the
    float32 load's greedy tokens on one prompt are the quantized model's (agreement over 100
    prompts is in ``bench/quant_agreement.py``)."""
    model = smollm.model
    mats = [m for layer in model.layers for m in (layer.attn.qkv, layer.attn.o, layer.gate_up, layer.down)]
    assert all(isinstance(m, QuantLinear) for m in [*mats, model.lm_head])
    assert sum(m.nbytes for m in [*mats, model.lm_head]) < 100e6
    ids = smollm.tokenizer.encode("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    float_model = weights.load_model(smollm.path, device="cpu", quantized=False).model
    with torch.inference_mode():
        got = model.forward(torch.tensor(ids), torch.arange(len(ids)), model.new_cache(), logits="all")
        want = float_model.forward(torch.tensor(ids), torch.arange(len(ids)), float_model.new_cache(), logits="all")
    assert got is not None and want is not None
    assert torch.equal(got.argmax(-1)[-1], want.argmax(-1)[-1])
    assert _rel(got, want) < 0.1


def test_f_linear_on_a_quantlinear_computes_on_the_blocks() -> None:
    w = QuantLinear([_part(Q4_1, 64, 128, 8)], threads=1)
    x = torch.randn(2, 3, 128, generator=torch.Generator().manual_seed(3))
    bias = torch.randn(64, generator=torch.Generator().manual_seed(4))
    assert torch.equal(torch.nn.functional.linear(x, w), w(x.reshape(6, 128)).reshape(2, 3, 64))
    assert torch.equal(torch.nn.functional.linear(x[0], w, bias), w(x[0]) + bias)


def k_quant_part(kind: int, rows: int, cols: int, seed: int) -> QuantPart:
    """Random K-quant super-blocks (``gguf.quants`` has no K-quant quantizer): random bytes with
    sane float16 ``d`` (and ``dmin``) in place."""
    rng = np.random.default_rng(seed)
    size = {Q4_K: 144, Q6_K: 210}[kind]
    blocks = rng.integers(0, 256, size=(rows, cols // 256, size), dtype=np.uint8)

    def f16(scale: float) -> np.ndarray:
        return (rng.random((rows, cols // 256, 1)) * scale + scale / 2).astype(np.float16).view(np.uint8)

    if kind == Q4_K:
        blocks[:, :, 0:2], blocks[:, :, 2:4] = f16(0.002), f16(0.004)
    else:
        blocks[:, :, 208:210] = f16(0.0005)
    return QuantPart(blocks.reshape(rows, -1), kind, cols)


@pytest.mark.parametrize("kind", [Q4_K, Q6_K])
def test_k_quant_blocks_compute_the_weights_gguf_dequantizes(kind: int) -> None:
    """Q4_K through the Q4_1 form per 32-weight sub-block, Q6_K through 8-bit 16-weight blocks:
    the product is within the bound of ``x @ gguf_dequantize(blocks).T`` (a wrong nibble or
    scale order gives ~100%; with the kernel's float32 accuracy level the layout measured ~5e-7)."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize as reference

    part = k_quant_part(kind, 64, 512, 9)
    want_w = reference(part.raw, GGMLQuantizationType(kind)).reshape(64, 512)
    assert np.array_equal(dequantize(part), want_w)
    w = QuantLinear([part], threads=1)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(5))
    assert _rel(w(x), x @ torch.from_numpy(want_w).T) < BOUND[kind]
