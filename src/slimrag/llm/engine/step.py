"""The one-token decode step of a quantized model as one ONNX Runtime graph: every layer, attention included, in one call.

Why. A decode step of SmolLM2-135M on the quantized weights (:mod:`slimrag.llm.engine.qlinear`)
spent about a third of its time in the products and the rest around them: 121 ORT calls (four
per layer and the head) and ~20 small torch operations per layer (norms, slices, RoPE, the cache
write, ``scaled_dot_product_attention``, SiLU, residuals), each a few microseconds of dispatch on
a tensor of 576 numbers. Here the whole step is one graph, so the per-operation cost is ORT's
(a node of its sequential executor) and the Python cost is one call per token.

The graph, for one token of one sequence (``x`` its embedding row, ``cos``/``sin`` its RoPE row
from the model's own table, ``past`` the number of cached positions, and per layer the cache's
whole K and V buffers ``[1, kv_heads, capacity, head_dim]``, read in place)::

    h = RMSNorm(x);  q, k, v = split(h @ Wqkv.T (+ bias));  (Qwen3: RMSNorm per head of q and k)
    q, k = rope(q), rope(k)
    s = [q . K[j] / sqrt(d)  for j < capacity, -inf where j >= past ;  q . k / sqrt(d)]
    p = softmax(s);  a = p[:capacity] @ V + p[capacity] * v       (grouped: a kv head per group)
    x = x + a @ Wo.T;  h = RMSNorm(x);  g, u = split(h @ Wgu.T);  x = x + (silu(g) * u) @ Wdown.T
    logits = RMSNorm(x) @ Whead.T

The new token's K/V come out of the graph (``[2 * layers * kv_heads, 1, head_dim]``) and are written
into the cache at ``past`` afterwards: the graph never writes its inputs, and attention takes the
new key's score beside the cached ones instead of concatenating it (no copy of the cache). Scores
run over the whole buffer with a mask rather than a slice of it (a slice would copy); the buffer's
capacity is a function of the length only (:mod:`slimrag.llm.engine.cache`), so a sequence at a
given length computes the same sums whether its prefix was cached or not.

Exactness. This is another computation of the step than :meth:`Decoder.forward`'s torch
operations (ORT's softmax and RMSNorm, products through ``FusedMatMul``), as the quantized
products were: its tokens are compared with float32's in ``bench/quant_agreement.py``. Within
the mode it is the only way a quantized model runs one token, batched or not (a batched step runs
it per row, :mod:`slimrag.llm.engine.batch`), so cached and uncached runs, alone or beside other
streams, give the same tokens.

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
from slimrag.llm.engine.qlinear import QuantLinear


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
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper

        if not supports(model):
            raise ValueError("the fused decode step needs every projection quantized (a float32 CPU model)")
        m = model  # a Decoder (typed loosely: model.py imports this module)
        c = m.config  # type: ignore[attr-defined]
        heads, kvh, hd, hidden = c.num_heads, c.num_kv_heads, c.head_dim, c.hidden_size
        group, inter, n = heads // kvh, c.intermediate_size, c.num_layers
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

        def rope(x: str, out: str) -> None:  # x * cos + rotate_half(x) * sin, cos/sin [1, hd]
            node("MatMul", [x, "rot"], [out + "_r"])  # rotate_half as a signed permutation: exact
            node("Mul", [x, "cos"], [out + "_c"])
            node("Mul", [out + "_r", "sin"], [out + "_s"])
            node("Add", [out + "_c", out + "_s"], [out])

        def weight(t: torch.Tensor) -> np.ndarray:
            return t.detach().to(torch.float32).contiguous().numpy()

        # Mask over the buffer: 0 for j < past, -inf from there (all layers share the capacity).
        node("Shape", ["k0"], ["cap1"], start=1, end=2)
        node("Squeeze", ["cap1"], ["cap"])
        node("Range", [const("zero", np.array(0, np.int64)), "cap", const("one", np.array(1, np.int64))], ["pos"])
        node("Less", ["pos", "past"], ["valid"])
        node("Where", ["valid", const("f0", np.array(0.0, np.float32)), const("ninf", np.array(-np.inf, np.float32))], ["mask"])
        scale = 1.0 / math.sqrt(hd)
        shapes = {"q": np.array([kvh, group, hd], np.int64), "kv": np.array([kvh, 1, hd], np.int64),
                  "row": np.array([1, heads * hd], np.int64), "qk": np.array([heads + kvh, hd], np.int64)}
        for name, value in shapes.items():
            const("shape_" + name, value)
        const("split_qkv", np.array([(heads + kvh) * hd, kvh * hd], np.int64))
        const("split_qk", np.array([heads, kvh], np.int64))
        const("split_gu", np.array([inter, inter], np.int64))
        const("axis_last", np.array([-1], np.int64))
        const("start0", np.array([0], np.int64))
        const("end_all", np.array([2**62], np.int64))
        rot = np.zeros((hd, hd), np.float32)  # x @ rot = rotate_half(x) = (-x2, x1)
        rot[np.arange(hd // 2) + hd // 2, np.arange(hd // 2)] = -1.0
        rot[np.arange(hd // 2), np.arange(hd // 2) + hd // 2] = 1.0
        const("rot", rot)
        x, kv_out = "x", []
        for i, layer in enumerate(m.layers):  # type: ignore[attr-defined]
            p = f"l{i}_"
            a = layer.attn
            norm(x, weight(layer.input_norm), p + "h")
            more, data = a.qkv.onnx_nodes(p + "h", p + "qkv0", p + "qkv", one_row=True)
            nodes += more
            inits += data
            qkv = p + "qkv0"
            if a.qkv_bias is not None:
                node("Add", [qkv, const(p + "qkv_b", weight(a.qkv_bias))], [p + "qkv1"])
                qkv = p + "qkv1"
            # q and k rotate together: [heads + kv_heads, hd] rows of one tensor.
            node("Split", [qkv, "split_qkv"], [p + "qk0", p + "v0"], axis=-1)
            node("Reshape", [p + "qk0", "shape_qk"], [p + "qk1"])
            qk = p + "qk1"
            if a.q_norm is not None and a.k_norm is not None:  # Qwen3: per-head norms, q's and k's weights
                gamma = np.concatenate([np.tile(weight(a.q_norm), (heads, 1)), np.tile(weight(a.k_norm), (kvh, 1))])
                node("SimplifiedLayerNormalization", [qk, const(p + "ones", np.ones(hd, np.float32))], [p + "qkn0"], axis=-1, epsilon=c.rms_eps)
                node("Mul", [p + "qkn0", const(p + "qk_w", gamma)], [p + "qkn"])
                qk = p + "qkn"
            rope(qk, p + "qkr")
            node("Split", [p + "qkr", "split_qk"], [p + "q", p + "k"], axis=0)
            node("Reshape", [p + "q", "shape_q"], [p + "qg"])
            node("Reshape", [p + "k", "shape_kv"], [p + "kg"])
            node("Reshape", [p + "v0", "shape_kv"], [p + "vg"])
            kv_out += [p + "kg", p + "vg"]
            node("FusedMatMul", [p + "qg", f"k{i}"], [p + "s0"], domain="com.microsoft", alpha=scale, transB=1)
            node("Add", [p + "s0", "mask"], [p + "s1"])
            node("FusedMatMul", [p + "qg", p + "kg"], [p + "sn"], domain="com.microsoft", alpha=scale, transB=1)
            node("Concat", [p + "s1", p + "sn"], [p + "s"], axis=-1)
            node("Softmax", [p + "s"], [p + "pr"], axis=-1)
            node("Slice", [p + "pr", "start0", "cap1", "axis_last"], [p + "pp"])  # the cached keys' weights
            node("Slice", [p + "pr", "cap1", "end_all", "axis_last"], [p + "pn"])  # the new key's
            node("MatMul", [p + "pp", f"v{i}"], [p + "ap"])
            node("Mul", [p + "pn", p + "vg"], [p + "an"])
            node("Add", [p + "ap", p + "an"], [p + "a0"])
            node("Reshape", [p + "a0", "shape_row"], [p + "a"])
            more, data = a.o.onnx_nodes(p + "a", p + "o", p + "o", one_row=True)
            nodes += more
            inits += data
            node("Add", [x, p + "o"], [p + "x1"])
            norm(p + "x1", weight(layer.post_norm), p + "h2")
            more, data = layer.gate_up.onnx_nodes(p + "h2", p + "gu", p + "gu", one_row=True)
            nodes += more
            inits += data
            node("Split", [p + "gu", "split_gu"], [p + "g", p + "u"], axis=-1)
            node("Sigmoid", [p + "g"], [p + "sg"])
            node("Mul", [p + "g", p + "sg"], [p + "silu"])
            node("Mul", [p + "silu", p + "u"], [p + "m"])
            more, data = layer.down.onnx_nodes(p + "m", p + "d", p + "d", one_row=True)
            nodes += more
            inits += data
            node("Add", [p + "x1", p + "d"], [p + "x2"])
            x = p + "x2"
        norm(x, weight(m.norm), "hf")  # type: ignore[attr-defined]
        more, data = m.lm_head.onnx_nodes("hf", "logits", "head", one_row=True)  # type: ignore[attr-defined]
        nodes += more
        inits += data
        node("Concat", kv_out, ["kv"], axis=0)
        f32, buf = TensorProto.FLOAT, [kvh, "capacity", hd]
        ins = [helper.make_tensor_value_info("x", f32, [1, hidden]),
               helper.make_tensor_value_info("cos", f32, [1, hd]), helper.make_tensor_value_info("sin", f32, [1, hd]),
               helper.make_tensor_value_info("past", TensorProto.INT64, [])]
        ins += [helper.make_tensor_value_info(f"{t}{i}", f32, buf) for i in range(n) for t in "kv"]
        outs = [helper.make_tensor_value_info("logits", f32, [1, c.vocab_size]),
                helper.make_tensor_value_info("kv", f32, [2 * n * kvh, 1, hd])]
        graph = helper.make_graph(nodes, "decode_step", ins, outs, inits)
        proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads or torch.get_num_threads()
        opts.inter_op_num_threads = 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # built fused by hand
        opts.enable_mem_pattern = False  # the capacity changes every 256 tokens
        self._session = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        self._embed, self._rope = m.embed, m.rope  # type: ignore[attr-defined]

    def __call__(self, token: int, position: int, cache: KVCache) -> torch.Tensor:
        """Feed ``token`` at ``position`` to ``cache`` (which gains its K/V); float32 logits ``[vocab]``."""
        past = cache.length
        cache.reserve(past + 1)
        cos, sin = self._rope.cos_sin(torch.tensor([position]), torch.float32)
        feed: dict[str, np.ndarray] = {"x": self._embed[token : token + 1].numpy(), "cos": cos.numpy(),
                                       "sin": sin.numpy(), "past": np.array(past, np.int64)}
        for i, (k, v) in enumerate(cache.buffers()):
            feed[f"k{i}"], feed[f"v{i}"] = k[0].numpy(), v[0].numpy()
        logits, kv = self._session.run(None, feed)
        cache.put(torch.from_numpy(kv).view(self.num_layers, 2, self.kv_heads, self.head_dim), past)
        return torch.from_numpy(logits)[0]
