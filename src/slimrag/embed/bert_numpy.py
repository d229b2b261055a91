"""The BERT sentence encoder of `slimrag.embed.bert` in float32 numpy: the ``numpy`` runtime.

Why: a one-shot ``slimrag ask`` on an index recorded ``torch-bf16`` embeds a handful of texts (the
question, then the retrieved passages' ~30 sentences for the evidence lead), and importing torch for
them is ~1.2 s of a ~2 s first byte here (docs/benchmarks.md, "Cold ask"). The same weights in
float32 are what ``onnx`` computes (its export agrees with `slimrag.embed.bert`'s float32 mode to
~2e-7), and the bfloat16 vectors differ from float32 by rounding only (cosine ~0.9999), so a query
embedded here retrieves what the bfloat16 query retrieves: `slimrag.embed.local.QUERY_COMPATIBLE`
records that fact with its measurement. This module needs numpy, ``safetensors`` and
``tokenizers`` (both already the embedder's), and no ONNX export (which needs torch once).

The forward: embeddings (word + position + token type, LayerNorm), six layers of fused-QKV
attention with the padding masked and an exact-GELU FFN, each followed by a residual LayerNorm,
then the folder's pooling (mean over real tokens, or CLS), as `slimrag.embed.bert` does.
GELU's ``erf`` is Abramowitz and Stegun's 7.1.26 (absolute error <= 1.5e-7, <= 5e-7 evaluated in
float32: the size of float32's own rounding of the activations), because numpy has no ``erf``
and scipy is not a dependency.

Speed: float32 GEMMs on numpy's BLAS, the cores it finds; fine for the few short texts of a query
and its evidence, not meant for building an index (``torch-bf16`` or ``onnx`` are several times
faster there). Not re-entrant on its own: `LocalEmbedder` serializes calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from slimrag.embed.bert import check_folder

#: Abramowitz and Stegun 7.1.26: erf(x) ~ 1 - (a1 t + ... + a5 t^5) exp(-x^2), t = 1 / (1 + p x).
_P = 0.3275911
_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def erf(x: np.ndarray) -> np.ndarray:
    """``erf`` elementwise, float32, absolute error <= 5e-7 (module header)."""
    a = np.abs(x)
    t = 1.0 / (1.0 + _P * a)
    poly = t * (_A[0] + t * (_A[1] + t * (_A[2] + t * (_A[3] + t * _A[4]))))
    return (np.sign(x) * (1.0 - poly * np.exp(-a * a))).astype(np.float32)


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """LayerNorm over the last axis."""
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


class NumpyBertEncoder:
    """The folder's BERT and pooling as float32 numpy arrays (module header)."""

    def __init__(self, model_dir: Path) -> None:
        from safetensors.numpy import load_file

        from slimrag.embed.onnx import load_tokenizer, pooling_mode

        cfg = check_folder(model_dir)
        self.pooling = pooling_mode(model_dir)
        self.tokenizer = load_tokenizer(model_dir)
        self.width, self.heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        self.eps = float(cfg.get("layer_norm_eps", 1e-12))
        w = {k.removeprefix("bert."): v.astype(np.float32) for k, v in
             load_file(str(model_dir / "model.safetensors")).items()}
        self.embed_tables = [w[f"embeddings.{n}_embeddings.weight"] for n in ("word", "position", "token_type")]
        self.embed_norm = (w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        self.layers = []
        for i in range(int(cfg["num_hidden_layers"])):
            p = f"encoder.layer.{i}."
            qkv = [p + f"attention.self.{n}" for n in ("query", "key", "value")]
            self.layers.append({  # weights transposed once, so each product is x @ w
                "qkv_w": np.ascontiguousarray(np.concatenate([w[n + ".weight"] for n in qkv]).T),
                "qkv_b": np.concatenate([w[n + ".bias"] for n in qkv]),
                "o_w": np.ascontiguousarray(w[p + "attention.output.dense.weight"].T),
                "o_b": w[p + "attention.output.dense.bias"],
                "n1": (w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"]),
                "i_w": np.ascontiguousarray(w[p + "intermediate.dense.weight"].T), "i_b": w[p + "intermediate.dense.bias"],
                "f_w": np.ascontiguousarray(w[p + "output.dense.weight"].T), "f_b": w[p + "output.dense.bias"],
                "n2": (w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])})

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Pooled, unnormalized float32 embeddings of one batch, padded to its longest text."""
        enc = self.tokenizer.encode_batch(list(texts))
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.float32)
        types = np.array([e.type_ids for e in enc], dtype=np.int64)
        h = self._forward(ids, mask, types)
        if self.pooling == "cls":
            return np.ascontiguousarray(h[:, 0])
        m = mask[:, :, None]
        return (h * m).sum(1) / np.maximum(m.sum(1), 1e-9)

    def _forward(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> np.ndarray:
        b, t = ids.shape
        d, heads = self.width, self.heads
        hd = d // heads
        word, pos, typ = self.embed_tables
        x = layer_norm(word[ids] + pos[:t] + typ[types], *self.embed_norm, self.eps)
        # padded keys get -inf before the softmax (a row always has its [CLS] unmasked)
        bias = np.where(mask[:, None, None, :] > 0, 0.0, -np.inf).astype(np.float32)
        scale = np.float32(1.0 / np.sqrt(hd))
        for lw in self.layers:
            qkv = (x @ lw["qkv_w"] + lw["qkv_b"]).reshape(b, t, 3, heads, hd).transpose(2, 0, 3, 1, 4)
            s = (qkv[0] @ qkv[1].transpose(0, 1, 3, 2)) * scale + bias
            s = np.exp(s - s.max(-1, keepdims=True))
            a = (s / s.sum(-1, keepdims=True)) @ qkv[2]
            a = a.transpose(0, 2, 1, 3).reshape(b, t, d) @ lw["o_w"] + lw["o_b"]
            x = layer_norm(a + x, *lw["n1"], self.eps)
            f = x @ lw["i_w"] + lw["i_b"]
            f = 0.5 * f * (1.0 + erf(f * np.float32(1 / np.sqrt(2))))
            x = layer_norm(f @ lw["f_w"] + lw["f_b"] + x, *lw["n2"], self.eps)
        return x
