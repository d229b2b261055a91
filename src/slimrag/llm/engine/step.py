"""The one-token decode step of a quantized model as one ONNX Runtime graph: every layer, attention included, in one call.

Why. A decode step of SmolLM2-135M on the quantized weights (:mod:`slimrag.llm.engine.qlinear`)
spent about a third of its time in the products and the rest around them: 121 ORT calls (four
per layer and the head) and ~20 small torch operations per layer (norms, slices, RoPE, the cache
write, ``scaled_dot_product_attention``, SiLU, residuals), each a few microseconds of dispatch on
a tensor of 576 numbers. Here the whole step is one graph, so the per-operation cost is ORT's
(a node of its sequential executor) and the Python cost is one call per token.

The graph, for one token of one sequence (``x`` its embedding row, ``past`` the number of cached
positions, which is also the token's position, the model's own RoPE table, and per layer the
cache's K and V buffers ``[1, kv_heads, capacity, head_dim]``)::

    h = RMSNorm(x);  qkv = h @ Wqkv.T (+ bias)            (Qwen3: RMSNorm per head of q and k)
    a = GroupQueryAttention(qkv, K, V, past)               RoPE at ``past``, the new K/V written
                                                           into the buffers at ``past``, softmax
                                                           over positions 0 .. past
    x = x + a @ Wo.T;  h = RMSNorm(x);  g, u = split(h @ Wgu.T);  x = x + (silu(g) * u) @ Wdown.T
    logits = RMSNorm(x) @ Whead.T

``GroupQueryAttention`` is ONNX Runtime's contrib operator (the one its generative-AI runtime
decodes with). Its K/V outputs are bound to the very buffers it reads (ORT then writes only the
new position: "past and present share a buffer"), so the cache is neither copied nor
concatenated, and nothing past ``past`` is read. One node replaces the ~20 of attention written
out in ONNX operators (measured: ``docs/benchmarks.md``).

Exactness. This is another computation of the step than :meth:`Decoder.forward`'s torch
operations (ORT's softmax, RoPE and RMSNorm), as the quantized products were: its tokens are
compared with float32's in ``bench/quant_agreement.py``. Within the mode it is the only way a
quantized model runs one token at the cache's length, batched or not (a batched step runs it per
row, :mod:`slimrag.llm.engine.batch`), so cached and uncached runs, alone or beside other streams,
give the same tokens.

Memory. The graph holds its own copy of the quantized weights (MLAS packs them per session):
about the file's size again beside the per-projection sessions prefill uses. It is built on the
first one-token forward (about a second for SmolLM2-135M), or ahead with :meth:`Decoder.warm_step`.

Threads: ``threads`` of ORT's intra-op pool (default: torch's thread count when built), no
spinning. One call at a time per sequence; several sequences may run from several threads.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from slimrag.llm.engine.cache import KVCache
from slimrag.llm.engine.qlinear import QuantLinear, cpu_session


def supports(model: object) -> bool:
    """Whether every projection of ``model`` (a Decoder) is a :class:`QuantLinear`, the case this
    graph computes (float32 on the CPU, quantized)."""
    layers = getattr(model, "layers", [])
    mats = [w for layer in layers for w in (layer.attn.qkv, layer.attn.o, layer.gate_up, layer.down)]
    return bool(mats) and all(isinstance(w, QuantLinear) for w in [*mats, getattr(model, "lm_head", None)])


class StepGraph:
    """The fused one-token step of a quantized decoder (see the module header). ``model`` is a
    :class:`~slimrag.llm.engine.model.Decoder` for which :func:`supports` holds."""

    def __init__(self, model: object, *, threads: int | None = None) -> None:
        from onnx import TensorProto, helper, numpy_helper

        if not supports(model):
            raise ValueError("the fused decode step needs every projection quantized (a float32 CPU model)")
        m = model  # a Decoder (typed loosely: model.py imports this module)
        c = m.config  # type: ignore[attr-defined]
        heads, kvh, hd, hidden = c.num_heads, c.num_kv_heads, c.head_dim, c.hidden_size
        inter, n = c.intermediate_size, c.num_layers
        self.num_layers, self.kv_heads, self.head_dim = n, kvh, hd
        nodes: list = []
        inits: list = []

        def const(name: str, value: np.ndarray) -> str:
            inits.append(numpy_helper.from_array(value, name))
            return name

        def node(op: str, ins: list[str], outs: list[str], domain: str = "", **attrs: object) -> None:
            nodes.append(helper.make_node(op, ins, outs, domain=domain or None, **attrs))

        def norm(x: str, w: np.ndarray, out: str) -> None:
            node("SimplifiedLayerNormalization", [x, const(out + "_w", w)], [out], axis=-1, epsilon=c.rms_eps)

        def weight(t: torch.Tensor) -> np.ndarray:
            return t.detach().to(torch.float32).contiguous().numpy()

        def proj(w: QuantLinear, x: str, out: str) -> None:
            more, data = w.onnx_nodes(x, out, out, one_row=True)
            nodes.extend(more)
            inits.extend(data)

        const("split_gu", np.array([inter, inter], np.int64))
        if c.qk_norm:
            const("split_qkv", np.array([heads * hd, kvh * hd, kvh * hd], np.int64))
            const("shape_qh", np.array([1, 1, heads, hd], np.int64))
            const("shape_kh", np.array([1, 1, kvh, hd], np.int64))
            const("shape_q", np.array([1, 1, heads * hd], np.int64))
            const("shape_k", np.array([1, 1, kvh * hd], np.int64))
        x = "x"
        for i, layer in enumerate(m.layers):  # type: ignore[attr-defined]
            p = f"l{i}_"
            a = layer.attn
            norm(x, weight(layer.input_norm), p + "h")
            proj(a.qkv, p + "h", p + "qkv0")
            qkv = p + "qkv0"
            if a.qkv_bias is not None:
                node("Add", [qkv, const(p + "qkv_b", weight(a.qkv_bias))], [p + "qkv1"])
                qkv = p + "qkv1"
            ins = [qkv, "", ""]
            if a.q_norm is not None and a.k_norm is not None:  # Qwen3: q and k normalized per head first
                node("Split", [qkv, "split_qkv"], [p + "q0", p + "k0", p + "v"], axis=-1)
                node("Reshape", [p + "q0", "shape_qh"], [p + "q1"])
                node("Reshape", [p + "k0", "shape_kh"], [p + "k1"])
                norm(p + "q1", weight(a.q_norm), p + "q2")
                norm(p + "k1", weight(a.k_norm), p + "k2")
                node("Reshape", [p + "q2", "shape_q"], [p + "q"])
                node("Reshape", [p + "k2", "shape_k"], [p + "k"])
                ins = [p + "q", p + "k", p + "v"]
            node("GroupQueryAttention", [*ins, f"k{i}", f"v{i}", "seqlens", "total", "cos", "sin"],
                 [p + "a", f"k{i}_out", f"v{i}_out"], domain="com.microsoft", num_heads=heads, kv_num_heads=kvh,
                 do_rotary=1, rotary_interleaved=0, scale=1.0 / math.sqrt(hd))
            proj(a.o, p + "a", p + "o")
            node("Add", [x, p + "o"], [p + "x1"])
            norm(p + "x1", weight(layer.post_norm), p + "h2")
            proj(layer.gate_up, p + "h2", p + "gu")
            node("Split", [p + "gu", "split_gu"], [p + "g", p + "u"], axis=-1)
            node("Sigmoid", [p + "g"], [p + "sg"])
            node("Mul", [p + "g", p + "sg"], [p + "silu"])
            node("Mul", [p + "silu", p + "u"], [p + "m"])
            proj(layer.down, p + "m", p + "d")
            node("Add", [p + "x1", p + "d"], [p + "x2"])
            x = p + "x2"
        norm(x, weight(m.norm), "hf")  # type: ignore[attr-defined]
        more, data = m.lm_head.onnx_nodes("hf", "logits", "head", one_row=True)  # type: ignore[attr-defined]
        nodes += more
        inits += data
        f32, buf = TensorProto.FLOAT, [1, kvh, "capacity", hd]
        ins = [helper.make_tensor_value_info("x", f32, [1, 1, hidden]),
               helper.make_tensor_value_info("cos", f32, ["table", hd // 2]),
               helper.make_tensor_value_info("sin", f32, ["table", hd // 2]),
               helper.make_tensor_value_info("seqlens", TensorProto.INT32, [1]),
               helper.make_tensor_value_info("total", TensorProto.INT32, [])]
        ins += [helper.make_tensor_value_info(f"{t}{i}", f32, buf) for i in range(n) for t in "kv"]
        outs = [helper.make_tensor_value_info("logits", f32, [1, 1, c.vocab_size])]
        outs += [helper.make_tensor_value_info(f"{t}{i}_out", f32, buf) for i in range(n) for t in "kv"]
        graph = helper.make_graph(nodes, "decode_step", ins, outs, inits)
        self._session = cpu_session(graph, threads)  # built fused by hand; the capacity changes every 256 tokens
        self._embed, self._rope = m.embed, m.rope  # type: ignore[attr-defined]
        self._table: tuple[np.ndarray, np.ndarray] | None = None

    def __call__(self, token: int, position: int, cache: KVCache) -> torch.Tensor:
        """Feed ``token`` at ``position`` (the cache's length) to ``cache``, which gains its K/V
        (written in place by the graph); float32 logits ``[vocab]``."""
        import onnxruntime as ort

        past = cache.length
        if position != past:
            raise ValueError(f"the fused step runs at the cache's length {past}, not at {position}")
        cache.reserve(past + 1)
        if self._table is None or self._table[0].shape[0] <= position:
            self._rope.cos_sin(torch.tensor([position]), torch.float32)  # grows the table to cover it
            half = self.head_dim // 2
            self._table = (self._rope._cos[:, :half].contiguous().numpy(), self._rope._sin[:, :half].contiguous().numpy())
        bind = self._session.io_binding()
        bind.bind_cpu_input("x", self._embed[token : token + 1].numpy().reshape(1, 1, -1))
        bind.bind_cpu_input("cos", self._table[0])
        bind.bind_cpu_input("sin", self._table[1])
        bind.bind_cpu_input("seqlens", np.array([past], np.int32))
        bind.bind_cpu_input("total", np.array(past + 1, np.int32))
        for i, (k, v) in enumerate(cache.buffers()):
            for name, buf in ((f"k{i}", k), (f"v{i}", v)):
                value = ort.OrtValue.ortvalue_from_numpy(buf.numpy())
                bind.bind_ortvalue_input(name, value)
                bind.bind_ortvalue_output(name + "_out", value)
        bind.bind_output("logits")
        self._session.run_with_iobinding(bind)
        cache.advance(1)
        return torch.from_numpy(bind.get_outputs()[-1].numpy()).reshape(-1)
