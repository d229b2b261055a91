"""The one-token decode step of a quantized model as one ONNX Runtime graph: every layer, attention included, in one call.

Why. A decode step of SmolLM2-135M on the quantized weights (:mod:`slimrag.llm.model.qlinear`)
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
    x, h = x + a @ Wo.T, RMSNorm(x + a @ Wo.T)             one SkipSimplifiedLayerNormalization
    g, u = split(h @ Wgu.T);  d = (QuickGelu(g) * u) @ Wdown.T     (QuickGelu at alpha 1 is SiLU)
    x, h = x + d, RMSNorm(x + d)                           the next layer's input norm (or the last)
    logits = h @ Whead.T

``GroupQueryAttention`` is ONNX Runtime's contrib operator (the one its generative-AI runtime
decodes with). Its K/V outputs are bound to the very buffers it reads (ORT then writes only the
new position: "past and present share a buffer"), so the cache is neither copied nor
concatenated, and nothing past ``past`` is read. One node replaces the ~20 of attention written
out in ONNX operators (measured: ``docs/benchmarks.md``).

Exactness. This is another computation of the step than :meth:`Decoder.forward`'s torch
operations (ORT's softmax, RoPE and RMSNorm), as the quantized products were: its tokens are
compared with float32's in ``bench/quant_agreement.py``. Within the mode it is the only way a
quantized model runs one token at the cache's length, batched or not (a batched step runs it per
row, :mod:`slimrag.llm.model.batch`), so cached and uncached runs, alone or beside other streams,
give the same tokens.

Build, save and memory. Building the graph takes 1-2 s for SmolLM2-135M (converting the blocks,
a ~100 MB protobuf, then ONNX Runtime packing every weight for MLAS). So it is built once per
model and machine and saved with its weights already packed (:mod:`slimrag.llm.model.saved_step`,
under ``$SLIMRAG_HOME/steps``); a later process maps the saved file (0.4-0.5 s, the packing stage
ORT still walks). Mapped, the packed weights are file pages shared with the page cache rather
than this process's own memory: +11 MiB anonymous memory for SmolLM2 (a built graph holds its
own packed copy: +300-500 MiB RSS). A prefill starts loading it in a background thread where a
core is free of torch's threads (:meth:`Decoder.warm_step`), else it loads at the first decoded
token. Each cache keeps its own IOBinding (inputs bound once, updated in place; the K/V rebound
when the cache grows), so a step costs one ``run_with_iobinding`` and a copy of the logits.

Threads: ``threads`` of ORT's intra-op pool (default: torch's thread count when built), spinning
when there are two or more (a step is ~150 short parallel sections, the products and attention; a
pool that sleeps between them pays a wake-up for each: at 2 threads 24.8 ms a step without
spinning, 16.9 with it, ``docs/benchmarks.md``). One call at a time per sequence; several sequences may run from several threads.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from slimrag.llm.model.cache import KVCache
from slimrag.llm.model.qlinear import QuantLinear, Weights, cpu_options, cpu_session, onnx_model
from slimrag.llm.model.saved_step import SavedSteps, step_key


def supports(model: object) -> bool:
    """Whether every projection of ``model`` (a Decoder) is a :class:`QuantLinear`, the case this
    graph computes (float32 on the CPU, quantized)."""
    layers = getattr(model, "layers", [])
    mats = [w for layer in layers for w in (layer.attn.qkv, layer.attn.o, layer.gate_up, layer.down)]
    return bool(mats) and all(isinstance(w, QuantLinear) for w in [*mats, getattr(model, "lm_head", None)])


def _f32(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).contiguous().numpy()


def _weights(model: Any) -> list[tuple[str, np.ndarray]]:
    """What the graph is made of, for its key: every norm (float32) and every projection's stored
    blocks (views of the model file)."""
    out: list[tuple[str, np.ndarray]] = [("norm", _f32(model.norm))]
    for i, layer in enumerate(model.layers):
        a = layer.attn
        named = {"in": layer.input_norm, "post": layer.post_norm, "bias": a.qkv_bias, "qn": a.q_norm, "kn": a.k_norm}
        out += [(f"{i}.{k}", _f32(v)) for k, v in named.items() if v is not None]
        for k, w in (("qkv", a.qkv), ("o", a.o), ("gu", layer.gate_up), ("down", layer.down)):
            out += [(f"{i}.{k}.{j}.{p.ggml_type}", p.raw) for j, p in enumerate(w.parts)]
    out += [(f"head.{j}.{p.ggml_type}", p.raw) for j, p in enumerate(model.lm_head.parts)]
    return out


def build_graph(model: Any) -> tuple[Any, Weights]:
    """The step's ONNX model (``ModelProto``) for a Decoder for which :func:`supports` holds (see the
    module header), and the weights it reads (:func:`slimrag.llm.model.qlinear.onnx_model`)."""
    from onnx import TensorProto, helper

    c = model.config
    heads, kvh, hd, hidden = c.num_heads, c.num_kv_heads, c.head_dim, c.hidden_size
    inter, n = c.intermediate_size, c.num_layers
    nodes: list = []
    inits: list[tuple[str, np.ndarray]] = []

    def const(name: str, value: np.ndarray) -> str:
        inits.append((name, value))
        return name

    def node(op: str, ins: list[str], outs: list[str], domain: str = "", **attrs: object) -> None:
        nodes.append(helper.make_node(op, ins, outs, domain=domain or None, **attrs))

    def norm(x: str, w: torch.Tensor, out: str) -> None:
        node("SimplifiedLayerNormalization", [x, const(out + "_w", _f32(w))], [out], axis=-1, epsilon=c.rms_eps)

    def skip_norm(x: str, add: str, w: torch.Tensor, out: str, total: str) -> None:
        """``total = x + add`` and ``out = RMSNorm(total)`` in one node."""
        node("SkipSimplifiedLayerNormalization", [add, x, const(out + "_w", _f32(w))], [out, "", "", total],
             domain="com.microsoft", epsilon=c.rms_eps)

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
    x, h = "x", "l0_h"
    norm(x, model.layers[0].input_norm, h)
    for i, layer in enumerate(model.layers):
        p = f"l{i}_"
        a = layer.attn
        proj(a.qkv, h, p + "qkv0")
        qkv = p + "qkv0"
        if a.qkv_bias is not None:
            node("Add", [qkv, const(p + "qkv_b", _f32(a.qkv_bias))], [p + "qkv1"])
            qkv = p + "qkv1"
        ins = [qkv, "", ""]
        if a.q_norm is not None and a.k_norm is not None:  # Qwen3: q and k normalized per head first
            node("Split", [qkv, "split_qkv"], [p + "q0", p + "k0", p + "v"], axis=-1)
            node("Reshape", [p + "q0", "shape_qh"], [p + "q1"])
            node("Reshape", [p + "k0", "shape_kh"], [p + "k1"])
            norm(p + "q1", a.q_norm, p + "q2")
            norm(p + "k1", a.k_norm, p + "k2")
            node("Reshape", [p + "q2", "shape_q"], [p + "q"])
            node("Reshape", [p + "k2", "shape_k"], [p + "k"])
            ins = [p + "q", p + "k", p + "v"]
        node("GroupQueryAttention", [*ins, f"k{i}", f"v{i}", "seqlens", "total", "cos", "sin"],
             [p + "a", f"k{i}_out", f"v{i}_out"], domain="com.microsoft", num_heads=heads, kv_num_heads=kvh,
             do_rotary=1, rotary_interleaved=0, scale=1.0 / math.sqrt(hd))
        proj(a.o, p + "a", p + "o")
        skip_norm(x, p + "o", layer.post_norm, p + "h2", p + "x1")
        proj(layer.gate_up, p + "h2", p + "gu")
        node("Split", [p + "gu", "split_gu"], [p + "g", p + "u"], axis=-1)
        node("QuickGelu", [p + "g"], [p + "silu"], domain="com.microsoft", alpha=1.0)
        node("Mul", [p + "silu", p + "u"], [p + "m"])
        proj(layer.down, p + "m", p + "d")
        last = i == n - 1
        h = "hf" if last else f"l{i + 1}_h"
        skip_norm(p + "x1", p + "d", model.norm if last else model.layers[i + 1].input_norm, h, p + "x2")
        x = p + "x2"
    more, data = model.lm_head.onnx_nodes("hf", "logits", "head", one_row=True)
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
    return onnx_model(nodes, inits, ins, outs, "decode_step")


@dataclass(slots=True)
class _Binding:
    """One cache's IOBinding and the arrays it reads: bound once, then updated in place; the K/V
    rebound when the cache's buffers are replaced (every 256 positions), the RoPE table when it
    grows."""

    bind: Any
    x: np.ndarray
    seqlens: np.ndarray
    total: np.ndarray
    logits: np.ndarray
    buffers: list[torch.Tensor] = field(default_factory=list)  # held: a bound buffer is never freed
    table: tuple[np.ndarray, np.ndarray] | None = None


class StepGraph:
    """The fused one-token step of a quantized decoder (see the module header). ``model`` is a
    :class:`~slimrag.llm.model.model.Decoder` for which :func:`supports` holds. ``saved``: where
    the built graph is saved and looked for (:mod:`slimrag.llm.model.saved_step`; None builds it
    every time)."""

    def __init__(self, model: Any, *, threads: int | None = None, saved: SavedSteps | None = None) -> None:
        if not supports(model):
            raise ValueError("the fused decode step needs every projection quantized (a float32 CPU model)")
        c = model.config
        self.head_dim, self.vocab = c.head_dim, c.vocab_size
        threads = threads or torch.get_num_threads()
        spin = threads > 1  # 2 threads: 16.9 against 24.8 ms a step (docs/benchmarks.md)
        if saved is None:
            self._session = cpu_session(*build_graph(model), threads, spin=spin)
            self.loaded = False
        else:
            self._session, self.loaded = saved.session(step_key(c, _weights(model)), lambda: build_graph(model),
                                                       lambda weights: cpu_options(threads, weights, spin=spin))
        self._embed = model.embed
        self._rope = model.rope
        self._table: tuple[np.ndarray, np.ndarray] | None = None
        self._bindings: weakref.WeakKeyDictionary[KVCache, _Binding] = weakref.WeakKeyDictionary()

    def _binding(self, cache: KVCache) -> _Binding:
        import onnxruntime as ort

        b = self._bindings.get(cache)
        if b is None:
            b = _Binding(self._session.io_binding(), np.zeros((1, 1, self._embed.width), np.float32),
                         np.zeros(1, np.int32), np.zeros((), np.int32), np.zeros((1, 1, self.vocab), np.float32))
            for name, arr in (("x", b.x), ("seqlens", b.seqlens), ("total", b.total)):
                b.bind.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(arr))
            b.bind.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(b.logits))
            self._bindings[cache] = b
        pairs = cache.buffers()
        if not b.buffers or b.buffers[0] is not pairs[0][0]:
            b.buffers = [t for pair in pairs for t in pair]
            for i, (k, v) in enumerate(pairs):
                for name, buf in ((f"k{i}", k), (f"v{i}", v)):
                    value = ort.OrtValue.ortvalue_from_numpy(buf.numpy())
                    b.bind.bind_ortvalue_input(name, value)
                    b.bind.bind_ortvalue_output(name + "_out", value)
        if b.table is not self._table:
            assert self._table is not None
            b.table = self._table
            b.bind.bind_ortvalue_input("cos", ort.OrtValue.ortvalue_from_numpy(self._table[0]))
            b.bind.bind_ortvalue_input("sin", ort.OrtValue.ortvalue_from_numpy(self._table[1]))
        return b

    def __call__(self, token: int, cache: KVCache) -> torch.Tensor:
        """Feed ``token`` at the cache's length to ``cache``, which gains its K/V (written in place
        by the graph); float32 logits ``[vocab]`` (a new tensor)."""
        past = cache.length
        cache.reserve(past + 1)
        if self._table is None or self._table[0].shape[0] <= past:
            cos, sin = self._rope.table(past + 1)
            half = self.head_dim // 2
            self._table = (cos[:, :half].contiguous().numpy(), sin[:, :half].contiguous().numpy())
        b = self._binding(cache)
        b.x[0, 0] = self._embed.row(token)
        b.seqlens[0] = past
        b.total[()] = past + 1
        self._session.run_with_iobinding(b.bind)
        cache.advance(1)
        return torch.from_numpy(b.logits.reshape(-1).copy())
