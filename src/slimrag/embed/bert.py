"""A BERT sentence encoder in plain torch, for the ``torch-bf16`` runtime: bfloat16 matrix products.

Why its own forward
    On a CPU with AMX (Intel Sapphire Rapids and later: ``amx_bf16`` in ``/proc/cpuinfo``) torch's
    oneDNN multiplies bfloat16 matrices on the tile unit, measured ~2,400 GFLOP/s here on the
    MiniLM FFN's GEMM against ~130 for float32 (`bench/embed_variants.py`). MiniLM in bfloat16 is
    then ~3x the float32 ONNX graph's chunks/s, and its vectors stay at cosine ~0.9999 to float32
    (every product accumulates in float32; only the stored activations round to 8 bits of
    mantissa). No activation scale is shared between rows, so unlike dynamic int8
    (`slimrag.embed.quantize`) a text's vector barely moves with its batch mates.
    The forward is written here (embeddings, six layers of fused-QKV attention and GELU FFN, the
    folder's pooling) rather than taken from transformers, so that a query embedded by a one-shot
    command imports torch only: transformers' model classes add seconds to a cold start.

What it accepts
    A sentence-transformers folder whose ``config.json`` is a BERT (``model_type`` "bert", absolute
    positions, exact GELU) with ``model.safetensors`` and ``tokenizer.json``, and mean or CLS
    pooling (`slimrag.embed.onnx.pooling_mode`). Anything else raises `SlimragError`, so "auto"
    keeps the ONNX runtime.

On a CPU without bfloat16 units
    The same arithmetic runs (torch converts and multiplies in float32 and rounds the same way up
    to accumulation order), so an index built with ``torch-bf16`` keeps embedding its queries the
    way it was built; only slower, often slower than float32 ONNX. A new index takes this runtime
    only where `slimrag.cpu.bf16_units` says the CPU has AMX (`slimrag.embed.local`).

Knobs: ``dtype`` (default bfloat16; float32 gives the reference forward the tests compare with the
ONNX export), ``threads`` (torch intra-op threads; default torch's own, the physical cores).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from slimrag.errors import SlimragError


def check_folder(model_dir: Path) -> dict[str, Any]:
    """The folder's BERT config, or `SlimragError` saying why this forward cannot run it."""
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file() or not (model_dir / "model.safetensors").is_file():
        raise SlimragError(f"{model_dir} has no config.json or model.safetensors for the torch-bf16 runtime")
    cfg = json.loads(cfg_path.read_text())
    if (cfg.get("model_type") != "bert" or cfg.get("hidden_act", "gelu") != "gelu"
            or cfg.get("position_embedding_type", "absolute") != "absolute"):
        raise SlimragError(f"{model_dir} is not a BERT with absolute positions and exact GELU; "
                           "the torch-bf16 runtime runs only those (use runtime='onnx')")
    return cfg


class BertEncoder:
    """The folder's BERT and pooling as plain torch tensors (see the module header).

    Not re-entrant on its own: `LocalEmbedder` serializes calls."""

    def __init__(self, model_dir: Path, dtype: Any = None, threads: int | None = None) -> None:
        import torch
        from safetensors.torch import load_file

        from slimrag.embed.onnx import load_tokenizer, pooling_mode

        cfg = check_folder(model_dir)
        self.pooling = pooling_mode(model_dir)
        self.tokenizer = load_tokenizer(model_dir)
        self.dtype = torch.bfloat16 if dtype is None else dtype
        if threads:
            torch.set_num_threads(threads)
        self.width, self.heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        self.eps = float(cfg.get("layer_norm_eps", 1e-12))
        w = {k.removeprefix("bert."): v for k, v in load_file(str(model_dir / "model.safetensors")).items()}

        def get(name: str) -> Any:
            return w[name].to(self.dtype).contiguous()

        self.embed_tables = [get(f"embeddings.{n}_embeddings.weight") for n in ("word", "position", "token_type")]
        self.embed_norm = (get("embeddings.LayerNorm.weight"), get("embeddings.LayerNorm.bias"))
        self.layers = []
        for i in range(int(cfg["num_hidden_layers"])):
            p = f"encoder.layer.{i}."
            qkv = [p + f"attention.self.{n}" for n in ("query", "key", "value")]
            self.layers.append({
                "qkv_w": torch.cat([w[n + ".weight"] for n in qkv]).to(self.dtype).contiguous(),
                "qkv_b": torch.cat([w[n + ".bias"] for n in qkv]).to(self.dtype),
                "o_w": get(p + "attention.output.dense.weight"), "o_b": get(p + "attention.output.dense.bias"),
                "n1_w": get(p + "attention.output.LayerNorm.weight"), "n1_b": get(p + "attention.output.LayerNorm.bias"),
                "i_w": get(p + "intermediate.dense.weight"), "i_b": get(p + "intermediate.dense.bias"),
                "f_w": get(p + "output.dense.weight"), "f_b": get(p + "output.dense.bias"),
                "n2_w": get(p + "output.LayerNorm.weight"), "n2_b": get(p + "output.LayerNorm.bias")})

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Pooled, unnormalized float32 embeddings of one batch, padded to its longest text."""
        import torch

        enc = self.tokenizer.encode_batch(list(texts))
        ids = torch.tensor([e.ids for e in enc])
        mask = torch.tensor([e.attention_mask for e in enc])
        types = torch.tensor([e.type_ids for e in enc])
        with torch.inference_mode():
            h = self._forward(ids, mask, types)
            if self.pooling == "cls":
                return h[:, 0].float().numpy()
            m = mask.unsqueeze(-1).to(torch.float32)
            return ((h.float() * m).sum(1) / m.sum(1).clamp(min=1e-9)).numpy()

    def _forward(self, ids: Any, mask: Any, types: Any) -> Any:
        import torch
        import torch.nn.functional as F

        b, t = ids.shape
        d, heads = self.width, self.heads
        word, pos, typ = self.embed_tables
        x = F.layer_norm(word[ids] + pos[:t] + typ[types], (d,), *self.embed_norm, self.eps)
        # padding only where the batch has some: an unmasked attention takes the faster kernel
        keep = None if bool(mask.all()) else mask[:, None, None, :].to(torch.bool)
        for lw in self.layers:
            qkv = F.linear(x, lw["qkv_w"], lw["qkv_b"]).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=keep)
            a = F.linear(a.transpose(1, 2).reshape(b, t, d), lw["o_w"], lw["o_b"])
            x = F.layer_norm(a + x, (d,), lw["n1_w"], lw["n1_b"], self.eps)
            f = F.linear(F.gelu(F.linear(x, lw["i_w"], lw["i_b"])), lw["f_w"], lw["f_b"])
            x = F.layer_norm(f + x, (d,), lw["n2_w"], lw["n2_b"], self.eps)
        return x
