"""The fused one-token decode step (issue 28, item 1): one ONNX Runtime graph per token for a quantized model.

Ground truth: the same model's torch forward on the same quantized products (another order of the
norms, RoPE and attention, so equal within the int8 rounding of the activations, not to the bit),
and the fused step itself on caches that reached the same length another way (bitwise equal).
The embedded SmolLM2 on one thread.
"""

from __future__ import annotations

import os

import pytest
import torch

from slimrag.llm import weights
from slimrag.llm.model import KVCache
from slimrag.llm.model.step import StepGraph, supports

os.environ["HF_HUB_OFFLINE"] = "1"


def _prefilled(model, ids: list[int]) -> KVCache:  # noqa: ANN001  (a Decoder)
    cache = model.new_cache()
    model.forward(torch.tensor(ids), torch.arange(len(ids)), cache)
    return cache


def _both(model, token: int, pos: int, plain: KVCache, fused: KVCache) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
    """The logits of ``token`` at ``pos`` through the torch forward on ``plain`` and through the
    fused step on ``fused`` (the same model, the fused path switched off for the first)."""
    model.fused_step = False
    try:
        want = model.forward(torch.tensor([token]), torch.tensor([pos]), plain)
    finally:
        model.fused_step = True
    got = model.forward(torch.tensor([token]), torch.tensor([pos]), fused)
    assert want is not None and got is not None
    return want, got


def test_the_fused_step_agrees_with_the_torch_forward_on_the_same_blocks(smollm: weights.LoadedModel) -> None:
    """Over 8 greedy steps on three prompts, the fused step's logits stay within the int8 rounding
    noise of the torch forward's (max difference under 8% of the logits' scale), its K/V within
    0.2% of the layer's magnitude at layer 0 and 5% deeper, and the torch forward's greedy token
    is the fused step's best within 2% of the logits' scale at the first step."""
    model = smollm.model
    assert supports(model) and model.fused_step
    gen = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for _ in range(3):
            ids = torch.randint(100, 20000, (40,), generator=gen).tolist()
            fused, plain = _prefilled(model, ids), _prefilled(model, ids)
            token = 4_000
            for step in range(8):
                pos = len(ids) + step
                want, got = _both(model, token, pos, plain, fused)
                assert fused.length == plain.length == pos + 1
                assert (got - want).abs().max() < 0.08 * want.abs().max(), step
                if step == 0:
                    # Greedy: the torch forward's token is at the top of the fused logits too (within
                    # the noise: random prompts leave near-ties, where either side may win).
                    assert got[int(want.argmax())] >= got.max() - 0.02 * want.abs().max()
                    for i, ((kf, vf), (kp, vp)) in enumerate(zip(fused.layers(), plain.layers(), strict=True)):
                        bound = 0.002 if i == 0 else 0.05  # layer 0 sees the same input; later ones its noise
                        assert (kf - kp).abs().max() <= bound * kp.abs().max(), i
                        assert (vf - vp).abs().max() <= bound * vp.abs().max(), i
                token = int(want.argmax())  # both continue with the same token


def test_stale_positions_past_the_length_do_not_change_a_step(smollm: weights.LoadedModel) -> None:
    """The graph reads the whole K/V buffer with a mask: a cache truncated after longer use (its
    buffer holds other keys past the length) gives bitwise the logits of a fresh one, also across
    the 256-position growth of the buffer."""
    model = smollm.model
    gen = torch.Generator().manual_seed(2)
    with torch.inference_mode():
        for n in (30, 255, 256):
            ids = torch.randint(100, 20000, (n,), generator=gen).tolist()
            fresh = _prefilled(model, ids)
            used = _prefilled(model, ids)
            for i in range(3):
                model.forward(torch.tensor([500 + i]), torch.tensor([n + i]), used)
            used.truncate(n)
            a = model.forward(torch.tensor([77]), torch.tensor([n]), fresh)
            b = model.forward(torch.tensor([77]), torch.tensor([n]), used)
            assert a is not None and b is not None
            assert torch.equal(a, b), n
            assert fresh.length == used.length == n + 1
            for (kf, vf), (ku, vu) in zip(fresh.layers(), used.layers(), strict=True):
                assert torch.equal(kf, ku) and torch.equal(vf, vu)


def test_a_float_model_is_not_fused(smollm: weights.LoadedModel) -> None:
    """The graph computes only quantized projections: a float32 load keeps the torch forward,
    and building the graph for it says why."""
    loaded = weights.load_model(smollm.path, device="cpu", quantized=False)
    assert not supports(loaded.model) and not loaded.model.fused_step
    with pytest.raises(ValueError, match="quantized"):
        StepGraph(loaded.model)


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_qwen_families_run_fused_near_their_torch_forward(family: str, smollm: weights.LoadedModel,
                                                         tmp_path) -> None:  # noqa: ANN001
    """Qwen2's q/k/v biases and Qwen3's per-head q/k norms (and head_dim 32) go through the graph:
    a Q8_0 file of random weights in each shape, 6 steps, logits within 2% (relative norm) of the
    torch forward's on the same blocks."""
    from slimrag.llm.model.gguf import GGUFFile
    from tests.reference_models import build_reference
    from tests.test_engine_gguf import write_gguf

    ref = build_reference(family, tmp_path, smollm.tokenizer)
    meta = GGUFFile(smollm.path).metadata
    path = tmp_path / "q.gguf"
    write_gguf(ref, family, path, {k: v for k, v in meta.items() if k.startswith("tokenizer.ggml.")}, quant=8)
    model = weights.load_model(path, device="cpu").model
    assert model.fused_step
    ids = list(range(300, 330))
    with torch.inference_mode():
        fused, plain = _prefilled(model, ids), _prefilled(model, ids)
        for step in range(6):
            want, got = _both(model, 1000 + 37 * step, len(ids) + step, plain, fused)
            assert float((got - want).norm() / want.norm()) < 0.02, step
