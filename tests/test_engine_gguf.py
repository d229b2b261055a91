"""GGUF files of several architectures, written here from transformers-built models, read by the engine.

A random-weight model (``reference_models``) is written as a GGUF file the way llama.cpp's
converter lays it out: llama.cpp's tensor names, the metadata keys, q/k rows permuted for the
llama architecture (and not for Qwen), float32 tensors so the weights are exact, and SmolLM2's
vocabulary as ``tokenizer.ggml.*``. The engine's load of that file must give transformers'
logits (within 1e-4) and tokenize as the embedded model does. This checks the GGUF path on
architectures the embedded file does not cover (Qwen2 biases, Qwen3 q/k norms and head_dim).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from reference_models import build_reference

from slimrag.llm import weights
from slimrag.llm.model.gguf import GGUFFile, unpermute
from slimrag.llm.model.qlinear import Q4_0, Q4_1, Q8_0, QuantLinear

NAMES = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
         "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
         "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
         "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
         "self_attn.v_proj.bias": "attn_v.bias", "self_attn.q_norm.weight": "attn_q_norm.weight",
         "self_attn.k_norm.weight": "attn_k_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
         "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: per head, rows (2, pair) -> (pair, 2) (what the engine undoes)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model: Any, arch: str, path: Path, vocab: dict[str, Any], quant: int | None = None) -> None:
    """``quant``: a ggml block type id to store every 2-D weight in (quantized by ``gguf.quants``);
    None stores float32."""
    import gguf

    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(vocab["tokenizer.ggml.pre"])
    w.add_token_list(vocab["tokenizer.ggml.tokens"])
    w.add_token_types(vocab["tokenizer.ggml.token_type"])
    w.add_token_merges(vocab["tokenizer.ggml.merges"])
    w.add_eos_token_id(vocab["tokenizer.ggml.eos_token_id"])
    for name, t in model.state_dict().items():
        arr = t.detach().float().numpy().copy()
        if name == "model.embed_tokens.weight":
            out = "token_embd.weight"
        elif name == "model.norm.weight":
            out = "output_norm.weight"
        elif name == "lm_head.weight":
            if cfg.tie_word_embeddings:
                continue
            out = "output.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            out = f"blk.{layer}.{NAMES[rest]}"
            if arch == "llama" and rest == "self_attn.q_proj.weight":
                arr = _permute(arr, cfg.num_attention_heads)
            elif arch == "llama" and rest == "self_attn.k_proj.weight":
                arr = _permute(arr, cfg.num_key_value_heads)
        if quant is not None and arr.ndim == 2:
            qtype = gguf.GGMLQuantizationType(quant)
            w.add_tensor(out, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(out, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_unpermute_inverts_llama_cpp_permutation() -> None:
    w = np.arange(8 * 64 * 3, dtype=np.float32).reshape(8 * 64, 3)
    assert np.array_equal(unpermute(_permute(w, 8), 8), w)
    assert not np.array_equal(_permute(w, 8), w)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_gguf_written_from_a_reference_model_gives_its_logits(family: str, smollm: weights.LoadedModel,
                                                              tmp_path: Path) -> None:
    ref = build_reference(family, tmp_path, smollm.tokenizer)
    meta = GGUFFile(smollm.path).metadata
    path = tmp_path / f"{family}.gguf"
    write_gguf(ref, family, path, {k: v for k, v in meta.items() if k.startswith("tokenizer.ggml.")})
    loaded = weights.load_model(path, device="cpu")
    text = "<|im_start|>user\nWhich word comes after river? river stone 42<|im_end|>\n"
    ids = loaded.tokenizer.encode(text)
    assert ids == smollm.tokenizer.encode(text)
    model = loaded.model
    with torch.inference_mode():
        want = ref(torch.tensor([ids])).logits[0]
        got = model.forward(torch.tensor(ids), torch.arange(len(ids)), model.new_cache(), logits="all")
    assert got is not None and (got - want).abs().max().item() < 1e-4


def test_fast_dequantizers_equal_gguf_quants_bitwise(smollm: weights.LoadedModel) -> None:
    """The torch Q4_1/Q8_0 dequantizers give gguf.quants' float32 values to the bit, on every such
    tensor of the embedded file and on random blocks quantized by gguf itself."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    from slimrag.llm.model.gguf import FAST_DEQUANT

    file = GGUFFile(smollm.path)
    seen = set()
    for info in file.tensors.values():
        fast = FAST_DEQUANT.get(info.ggml_type)
        if fast is not None:
            raw = file.raw(info)
            want = dequantize(raw, GGMLQuantizationType(info.ggml_type))
            assert np.array_equal(fast(raw), want.reshape(raw.shape[0], -1)), info.name
            seen.add(info.ggml_type)
    assert seen == set(FAST_DEQUANT)
    rng = np.random.default_rng(0)
    for kind in FAST_DEQUANT:
        w = (rng.standard_normal((16, 256)) * 3).astype(np.float32)
        raw = quantize(w, GGMLQuantizationType(kind))
        assert np.array_equal(FAST_DEQUANT[kind](raw), dequantize(raw, GGMLQuantizationType(kind)))


@pytest.mark.parametrize("kind", [Q4_0, Q4_1, Q8_0])
def test_a_quantized_gguf_keeps_its_blocks_and_stays_near_its_float32_load(kind: int, smollm: weights.LoadedModel,
                                                                          tmp_path: Path) -> None:
    """A llama-architecture file (q/k rows permuted, so the loader un-permutes stored blocks) in
    each block type: the default load computes on the blocks, ``quantized=False`` on the same
    weights dequantized; all positions' logits within 5% (relative norm). Token by token on the
    quantized model's torch forward gives the one forward's logits within 1e-4 (the products' rows
    do not depend on the batch; attention over 1 or n queries sums in another order), and through
    the fused one-token graph within 2% (relative norm: its norms and attention round differently,
    and the kernel rounds their outputs to int8)."""
    ref = build_reference("llama", tmp_path, smollm.tokenizer)
    meta = GGUFFile(smollm.path).metadata
    path = tmp_path / "q.gguf"
    write_gguf(ref, "llama", path, {k: v for k, v in meta.items() if k.startswith("tokenizer.ggml.")}, quant=kind)
    quant, dense = weights.load_model(path, device="cpu"), weights.load_model(path, device="cpu", quantized=False)
    assert isinstance(quant.model.layers[0].attn.qkv, QuantLinear)
    assert isinstance(dense.model.layers[0].attn.qkv, torch.Tensor)
    quant.model._bf16 = None  # the kernel's own products in every forward (not the bf16 prefill's copy)
    ids = quant.tokenizer.encode("<|im_start|>user\nWhich word comes after river? river stone 42<|im_end|>\n")
    with torch.inference_mode():
        got = quant.model.forward(torch.tensor(ids), torch.arange(len(ids)), quant.model.new_cache(), logits="all")
        want = dense.model.forward(torch.tensor(ids), torch.arange(len(ids)), dense.model.new_cache(), logits="all")
        assert got is not None and want is not None
        assert float((got - want).norm() / want.norm()) < 0.05
        assert quant.model.fused_step
        quant.model.fused_step = False  # the torch forward one token at a time: the same products
        cache, fused = quant.model.new_cache(), quant.model.new_cache()
        for i, token in enumerate(ids):
            step = quant.model.forward(torch.tensor([token]), torch.tensor([i]), cache)
            assert step is not None and torch.allclose(step, got[i], atol=1e-4, rtol=0)
        quant.model.fused_step = True  # the fused step (engine/step.py): the same weights, its own rounding
        for i, token in enumerate(ids):
            step = quant.model.forward(torch.tensor([token]), torch.tensor([i]), fused)
            assert step is not None and float((step - got[i]).norm() / got[i].norm()) < 0.02
