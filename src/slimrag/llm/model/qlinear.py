"""Matrix products on a GGUF file's quantized blocks, through ONNX Runtime's ``MatMulNBits`` (MLAS kernels).

Why. Decode is memory-bound: each generated token reads every weight once. The embedded
SmolLM2-135M is 92 MB of Q4_1/Q8_0 blocks in its GGUF file and 540 MB once dequantized to
float32, so a decode step on float32 weights reads six times the bytes the file holds. This
module keeps the blocks as the file stores them (re-laid out once, at their size, into the
layout the kernel reads) and computes ``x @ W.T`` on them.

Why ``MatMulNBits``. ``onnxruntime`` is already a dependency (the embedder runs on it), its CPU
kernels come from MLAS (maintained, AVX2/AVX-512/NEON paths chosen at run time), and it takes
per-block (32 weights) scales, which is what the GGUF block types are. Measured on the
development machine (AVX2, no VNNI) it was the fastest candidate by far; the figures are in
``docs/benchmarks.md``. ``accuracy_level=4`` (activations quantized to int8 per block inside the
kernel, as llama.cpp does for its own dot products) is the fast path; with float zero points MLAS
falls back to a path ~40x slower, so Q4_1's per-block minimum is split into an integer zero point
and a float residual (below). The integer zero point matters for accuracy: the kernel's int8
rounding of ``x`` then errs in proportion to ``|d * (q - z)|``, about ``|w|``, as llama.cpp's Q4_1
dot product does, instead of ``|d * q|`` (about twice that) with a zero point of 0.

Block types (``w`` the weight, ``d`` the block's float16 scale, ``q`` its stored integer):

========  ===========================  =================================================
GGUF      stored as                    computed as
========  ===========================  =================================================
Q4_0      ``w = d * (q - 8)``          4-bit ``MatMulNBits``, default zero point 8: exact
Q4_1      ``w = d * q + m``            4-bit ``MatMulNBits`` with the integer zero point
                                       ``z = round(-m / d)`` (in 0..15) for ``d * (q - z)``, plus
                                       ``(per-block sums of x) @ r.T`` for the residual
                                       ``r = m + d * z`` (``|r| <= d / 2``; a small float product,
                                       ``K / 32`` columns)
Q8_0      ``w = d * q``, ``q`` int8    8-bit ``MatMulNBits``: ``q + 128`` with the default
                                       zero point 128: exact
Q4_K      256-weight super-blocks,     as Q4_1, per 32-weight sub-block: ``s = d * sc``,
          ``w = d*sc*q - dmin*mn``     ``m = -dmin * mn``
Q6_K      256-weight super-blocks,     8-bit ``MatMulNBits`` over 16-weight blocks, the
          ``w = d*sc*(q - 32)``        6-bit ``q`` as bytes, zero point 32: exact
========  ===========================  =================================================

Other types (F32, F16, Q5_K, ...) are not handled here: :func:`quantizable` says which are,
and the loader dequantizes the rest to float32 as before.

Exactness. A row's result does not depend on the other rows of the call nor on their number
(checked at load for the widths the batcher uses, see :mod:`slimrag.llm.model.batch`; measured
for 1-8 rows on every SmolLM2 shape), so a token's numbers are the same batched or alone. The
quantized product is a different computation from the float32 one (activations rounded to int8
per block), so its logits differ from the float32 engine's in the low digits: the agreement is
measured in ``bench/quant_agreement.py``.

Layout and memory. One :class:`QuantLinear` is one ORT session holding one or more stored
tensors stacked by rows (q, k and v of a layer; gate and up), each converted once at load:
nibbles reordered (GGUF stores a block's first 16 weights in the low nibbles, MLAS pairs
neighbours), float16 scales widened to float32. The converted arrays are about the size of the
file's blocks (Q4_1: 24 bytes per 32 weights against 20), and MLAS keeps its own packed copy of
them, so the quantized weights cost about twice the file in memory, against 5.9x for float32.

Threads: ``threads`` of ORT's intra-op pool (default: torch's thread count at build time),
without spinning (the machine is shared with torch's own threads). A session may be run from
several threads at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

#: ggml type ids of the block types computed here (see the module header).
Q4_0, Q4_1, Q8_0, Q4_K, Q6_K = 2, 3, 8, 12, 14
#: (weights, bytes) of one stored block per type.
SIZES = {Q4_0: (32, 18), Q4_1: (32, 20), Q8_0: (32, 34), Q4_K: (256, 144), Q6_K: (256, 210)}
#: Weights per kernel block (per scale).
BLOCK = 32


#: Initializers of at least this many bytes reach ONNX Runtime as OrtValues over the arrays
#: themselves, not inside the protobuf (no copy into it and out of it again, and no 2 GB protobuf
#: limit on a large model's graph); smaller ones (shape constants ORT reads while checking the
#: graph) stay inline.
INLINE_BYTES = 4096


Weights = dict[str, np.ndarray]


def onnx_model(nodes: list, inits: Sequence[tuple[str, np.ndarray]], inputs: list, outputs: list,
               name: str) -> tuple[Any, Weights]:
    """An ONNX ``ModelProto`` (opset 17 and the ``com.microsoft`` contrib ops) of ``nodes`` with the
    initializers ``inits`` (name, array), and the large ones it names but does not hold (see
    :data:`INLINE_BYTES`): pass them to :func:`cpu_options` and keep them alive with the session."""
    from onnx import TensorProto, helper, numpy_helper

    inline, external, placeholders = [], {}, []
    for n, a in inits:
        if a.nbytes < INLINE_BYTES:
            inline.append(numpy_helper.from_array(a, n))
            continue
        external[n] = np.ascontiguousarray(a)
        t = TensorProto(name=n, data_type=helper.np_dtype_to_tensor_dtype(a.dtype), dims=a.shape,
                        data_location=TensorProto.EXTERNAL)
        for key, value in (("location", f"mem:{n}"), ("offset", "0"), ("length", str(a.nbytes))):
            t.external_data.add(key=key, value=value)
        placeholders.append(t)
    graph = helper.make_graph(nodes, name, inputs, outputs, inline + placeholders)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    return model, external


def cpu_options(threads: int | None, weights: Weights | None = None, *, arena: bool = True,
                spin: bool = False) -> Any:
    """ONNX Runtime CPU session options as the engine runs its graphs: ``threads`` intra-op threads
    (default torch's), spinning only with ``spin`` (idle pool threads spin a moment before they
    sleep: a graph of many short parallel nodes then does not pay a wake-up per node, but the
    spinning takes CPU from torch's threads), no graph optimization (the graphs are built minimal or fused by
    hand; optimizing took 4x the build of a small one), no memory pattern (shapes change with the
    cache); ``arena``: ORT's CPU arena; ``weights``: the external initializers of
    :func:`onnx_model` (ORT reads them in place: the caller keeps them alive)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads or torch.get_num_threads()
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.enable_cpu_mem_arena = arena
    opts.enable_mem_pattern = False
    if weights:
        opts.add_external_initializers(list(weights), [ort.OrtValue.ortvalue_from_numpy(a) for a in weights.values()])
    return opts


def cpu_session(model: Any, weights: Weights | None, threads: int | None, *, arena: bool = True,
                spin: bool = False) -> Any:
    """An ONNX Runtime CPU session of ``model`` and its external ``weights`` (:func:`onnx_model`)
    with :func:`cpu_options`. ONNX Runtime reads ``weights`` in place and does not own them, so
    the session keeps a reference to them (``slimrag_weights``): they live as long as it does."""
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), cpu_options(threads, weights, arena=arena, spin=spin),
                                   providers=["CPUExecutionProvider"])
    session.slimrag_weights = weights
    return session


def quantizable(ggml_type: int) -> bool:
    """Whether a stored tensor of this ggml type can stay quantized (see the module header)."""
    return ggml_type in SIZES


@dataclass(frozen=True, slots=True)
class QuantPart:
    """Rows of one stored tensor: ``raw`` is ``uint8 [rows, row_bytes]`` (blocks as the file
    holds them, rows possibly reordered), ``cols`` the weights per row."""

    raw: np.ndarray
    ggml_type: int
    cols: int

    def __post_init__(self) -> None:
        if not quantizable(self.ggml_type):
            raise ValueError(f"ggml type {self.ggml_type} is not a block type MatMulNBits computes")
        weights, size = SIZES[self.ggml_type]
        if self.cols % weights or self.raw.shape[1] != self.cols // weights * size:
            raise ValueError(f"{self.raw.shape} bytes do not hold rows of {self.cols} weights of type {self.ggml_type}")

    @property
    def rows(self) -> int:
        return int(self.raw.shape[0])


def _scales(blocks: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte ``at`` of every block, widened to float32, flattened."""
    return np.ascontiguousarray(blocks[:, :, at : at + 2]).view(np.float16).astype(np.float32).ravel()


def _pack_nibbles(qs: np.ndarray) -> np.ndarray:
    """GGUF 4-bit blocks (``[..., 16]`` bytes: weight ``j`` in the low nibble of byte ``j``, weight
    ``j + 16`` in its high nibble) to MatMulNBits' order (weights ``2i`` and ``2i + 1`` in byte
    ``i``): bytes 0-7 pair the low nibbles of neighbouring bytes, bytes 8-15 their high nibbles."""
    even, odd = qs[..., 0::2], qs[..., 1::2]
    return np.concatenate([(even & 0x0F) | (odd << 4), (even >> 4) | (odd & 0xF0)], axis=-1)


def _q4_k(raw: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K super-blocks (256 weights: f16 ``d`` and ``dmin``, 12 bytes of eight 6-bit scales and
    mins, 128 bytes of nibbles) as 32-weight blocks of the Q4_1 form ``w = s * q + m``: packed
    nibbles ``[n, nb, 16]`` in MatMulNBits' order, scales ``s = d * sc`` and minimums
    ``m = -dmin * mn``, ``[n, nb]`` (llama.cpp's ``get_scale_min_k4`` and ``dequantize_row_q4_K``)."""
    blocks = raw.reshape(n, -1, 144)
    sup = blocks.shape[1]
    d, dmin = _scales(blocks, 0).reshape(n, sup, 1), _scales(blocks, 2).reshape(n, sup, 1)
    from gguf.quants import Q4_K  # the 6-bit scales and mins, unpacked as gguf's own dequantizer does

    sc, mn = (a.reshape(n, sup, 8) for a in Q4_K.get_scale_min(np.ascontiguousarray(blocks[:, :, 4:16]).reshape(-1, 12)))
    qs = blocks[:, :, 16:].reshape(n, sup, 4, 1, 32)
    values = np.concatenate([qs & 0x0F, qs >> 4], axis=3).reshape(n, sup * 8, 32)  # block 2j: low nibbles of chunk j
    packed = values[..., 0::2] | (values[..., 1::2] << 4)
    return packed, (d * sc).reshape(n, -1), (-(dmin * mn)).reshape(n, -1)


def _q6_k(raw: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Q6_K super-blocks (256 weights: 128 bytes of low nibbles, 64 of 2-bit highs, 16 int8
    scales, f16 ``d``) as 16-weight blocks ``w = d * sc * (q - 32)``: values ``q`` (0..63)
    ``[n, nb, 16]`` and scales ``d * sc`` ``[n, nb]`` (llama.cpp's ``dequantize_row_q6_K``)."""
    blocks = raw.reshape(n, -1, 210)
    sup = blocks.shape[1]
    ql, qh = blocks[:, :, :128].reshape(n, sup, 2, 64), blocks[:, :, 128:192].reshape(n, sup, 2, 32)
    lo, hi = ql[..., :32], ql[..., 32:]
    values = np.stack([(lo & 0x0F) | ((qh & 3) << 4), (hi & 0x0F) | (((qh >> 2) & 3) << 4),
                       (lo >> 4) | (((qh >> 4) & 3) << 4), (hi >> 4) | (((qh >> 6) & 3) << 4)], axis=3)
    sc = np.ascontiguousarray(blocks[:, :, 192:208]).view(np.int8).astype(np.float32)
    d = np.ascontiguousarray(blocks[:, :, 208:210]).view(np.float16).astype(np.float32)
    return values.reshape(n, sup * 16, 16), (d * sc).reshape(n, -1)


def _nodes(part: QuantPart, i: int | str, x: str, out: str, *, one_row: bool = False,
           ) -> tuple[list, list[tuple[str, np.ndarray]]]:
    """ONNX nodes and initializers (name, array) computing ``out = x @ W.T`` for one part (``i`` makes their
    names unique within a graph). ``one_row``: ``x`` is ``[1, cols]``, so Q4_1's residual
    product is a vector handed to the kernel as its bias (one node fewer)."""
    from onnx import helper

    n, k, t = part.rows, part.cols, part.ggml_type
    nb = k // BLOCK
    blocks = part.raw.reshape(n, -1, SIZES[t][1])
    inits: list[tuple[str, np.ndarray]] = []
    nodes: list = []
    attrs = {"K": k, "N": n, "block_size": BLOCK, "accuracy_level": 4, "domain": "com.microsoft"}
    if t == Q6_K:
        values, scales = _q6_k(part.raw, n)
        inits += [(f"b{i}", np.ascontiguousarray(values)),
                  (f"s{i}", scales.ravel()),
                  (f"z{i}", np.full(scales.size, 32, np.uint8))]
        nodes.append(helper.make_node("MatMulNBits", [x, f"b{i}", f"s{i}", f"z{i}"], [out], bits=8,
                                      **{**attrs, "block_size": 16}))
        return nodes, inits
    if t == Q8_0:
        packed = blocks[:, :, 2:] ^ np.uint8(0x80)  # int8 q as uint8 q + 128
        inits += [(f"b{i}", packed), (f"s{i}", _scales(blocks, 0))]
        nodes.append(helper.make_node("MatMulNBits", [x, f"b{i}", f"s{i}"], [out], bits=8, **attrs))
        return nodes, inits
    if t == Q4_0:
        inits += [(f"b{i}", _pack_nibbles(blocks[:, :, 2:])),
                  (f"s{i}", _scales(blocks, 0))]
        nodes.append(helper.make_node("MatMulNBits", [x, f"b{i}", f"s{i}"], [out], bits=4, **attrs))
        return nodes, inits
    # Q4_1: d * (q - z) through the kernel, z the integer zero point nearest -m / d, and the
    # residual r = m + d * z (|r| <= d / 2) through the per-block sums of x.
    if t == Q4_K:
        packed, d, m = _q4_k(part.raw, n)
    else:
        packed, d, m = _pack_nibbles(blocks[:, :, 4:]), _scales(blocks, 0).reshape(n, nb), _scales(blocks, 2).reshape(n, nb)
    z = np.zeros((n, nb + nb % 2), np.uint8)
    with np.errstate(divide="ignore", invalid="ignore"):
        z[:, :nb] = np.where(d != 0, np.clip(np.rint(-m / d), 0, 15), 0)
    residual = np.ascontiguousarray((m + d * z[:, :nb]).T)
    shape, axis = ([nb, BLOCK], 1) if one_row else ([-1, nb, BLOCK], 2)  # per-block sums of x's rows
    inits += [(f"b{i}", np.ascontiguousarray(packed)),
              (f"s{i}", np.ascontiguousarray(d).ravel()),
              (f"z{i}", (z[:, 0::2] | (z[:, 1::2] << 4)).ravel()),
              (f"m{i}", residual),
              (f"shape{i}", np.array(shape, np.int64)),
              (f"axis{i}", np.array([axis], np.int64))]
    nodes += [helper.make_node("Reshape", [x, f"shape{i}"], [f"xb{i}"]),
              helper.make_node("ReduceSum", [f"xb{i}", f"axis{i}"], [f"xs{i}"], keepdims=0),
              helper.make_node("MatMul", [f"xs{i}", f"m{i}"], [f"mq{i}"])]
    if one_row:  # the residual is a vector: the kernel adds it as its bias
        nodes.append(helper.make_node("MatMulNBits", [x, f"b{i}", f"s{i}", f"z{i}", "", f"mq{i}"], [out], bits=4, **attrs))
    else:
        nodes += [helper.make_node("MatMulNBits", [x, f"b{i}", f"s{i}", f"z{i}"], [f"dq{i}"], bits=4, **attrs),
                  helper.make_node("Add", [f"dq{i}", f"mq{i}"], [out])]
    return nodes, inits


def _merge(parts: Sequence[QuantPart]) -> list[QuantPart]:
    """Neighbouring parts of one type and width stacked into one (one kernel call instead of several)."""
    merged: list[QuantPart] = []
    for p in parts:
        last = merged[-1] if merged else None
        if last is not None and last.ggml_type == p.ggml_type and last.cols == p.cols:
            merged[-1] = QuantPart(np.concatenate([last.raw, p.raw]), p.ggml_type, p.cols)
        else:
            merged.append(p)
    return merged


class QuantLinear:
    """``x @ W.T`` for ``W`` the row-stack of ``parts`` kept quantized (see the module header).

    Call it with ``x`` ``[m, cols]`` (float32) for ``[m, rows]``. ``w @ x.T`` also works and
    gives ``(x @ W.T).T``: the form :mod:`slimrag.llm.model.batch` multiplies in.
    ``dense()`` is the float32 matrix (dequantized on first use, then held), for products where
    float32 measures faster (long prefills)."""

    dtype = torch.float32
    device = torch.device("cpu")

    def __init__(self, parts: Sequence[QuantPart], *, threads: int | None = None) -> None:
        from onnx import TensorProto, helper

        if not parts or len({p.cols for p in parts}) != 1:
            raise ValueError("a QuantLinear needs one or more parts of the same width")
        self._parts = list(parts)
        self.shape = (sum(p.rows for p in parts), parts[0].cols)
        nodes, inits = self.onnx_nodes("x", "y", "")
        model, self._weights = onnx_model(
            nodes, inits, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", self.shape[1]])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", self.shape[0]])], "qlinear")
        # no arena: one per session would hold megabytes each for a few KB of activations
        self._session = cpu_session(model, self._weights, threads, arena=False)
        self._dense: torch.Tensor | None = None

    def onnx_nodes(self, x: str, out: str, tag: str, *, one_row: bool = False,
                   ) -> tuple[list, list[tuple[str, np.ndarray]]]:
        """ONNX nodes and initializers (name, array) computing ``out = x @ W.T`` in a larger graph (the fused
        decode step, :mod:`slimrag.llm.model.step`); ``tag`` keeps their names unique there.
        ``one_row``: ``x`` is always ``[1, cols]`` (fewer nodes)."""
        from onnx import helper

        nodes, inits, outs = [], [], []
        for i, part in enumerate(_merge(self._parts)):
            more, data = _nodes(part, f"{tag}{i}", x, f"{out}__{i}", one_row=one_row)
            nodes += more
            inits += data
            outs.append(f"{out}__{i}")
        if len(outs) > 1:
            nodes.append(helper.make_node("Concat", outs, [out], axis=-1))
        else:
            nodes[-1].output[0] = out
        return nodes, inits

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T`` on the quantized blocks; ``x`` float32 ``[..., cols]``."""
        a = x.detach().to(torch.float32).reshape(-1, self.shape[1]).contiguous().numpy()
        y = torch.from_numpy(self._session.run(None, {"x": a})[0])
        return y.reshape(*x.shape[:-1], self.shape[0])

    def __matmul__(self, xt: torch.Tensor) -> torch.Tensor:
        return self(xt.t()).t()

    @classmethod
    def __torch_function__(cls, func: object, types: object, args: tuple = (), kwargs: dict | None = None) -> object:
        """``F.linear(x, w, bias)`` with ``w`` a QuantLinear computes on the blocks (so code written
        for float weights runs unchanged); any other torch function is refused."""
        kwargs = kwargs or {}
        if func is F.linear:
            x, w, *rest = args
            return linear(x, w, rest[0] if rest else kwargs.get("bias"))
        return NotImplemented

    def dense(self) -> torch.Tensor:
        """The float32 matrix ``[rows, cols]`` (dequantized once, then held: 4 bytes per weight)."""
        if self._dense is None:
            self._dense = torch.from_numpy(np.concatenate([dequantize(p) for p in self._parts]))
        return self._dense

    @property
    def parts(self) -> list[QuantPart]:
        """The stored parts, stacked by rows in this order."""
        return list(self._parts)

    @property
    def nbytes(self) -> int:
        """Bytes of the stored blocks this product reads per call."""
        return sum(p.raw.nbytes for p in self._parts)


def dequantize(part: QuantPart) -> np.ndarray:
    """A part's weights as float32 ``[rows, cols]``, by ``gguf``'s own dequantizer (llama.cpp's
    formulas, the module header's left column): the reference the kernel layouts are tested against."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize as reference

    return reference(part.raw, GGMLQuantizationType(part.ggml_type)).reshape(part.rows, -1).astype(np.float32)


def linear(x: torch.Tensor, w: torch.Tensor | QuantLinear, bias: torch.Tensor | None = None, *,
           dense_rows: int | None = None) -> torch.Tensor:
    """``x @ w.T (+ bias)`` for a float weight or a :class:`QuantLinear`. ``dense_rows``: from this
    many rows of ``x`` on, a quantized weight is multiplied in float32 (its :meth:`QuantLinear.dense`
    copy); None keeps every product quantized."""
    if isinstance(w, torch.Tensor):
        return F.linear(x, w, bias)
    if dense_rows is not None and x.shape[0] >= dense_rows:
        return F.linear(x, w.dense(), bias)
    y = w(x)
    return y if bias is None else y + bias


def stacked(ws: Sequence[torch.Tensor | QuantPart], *, dtype: torch.dtype, device: str | torch.device,
            quantized: bool = True, threads: int | None = None) -> torch.Tensor | QuantLinear:
    """The row-stack of ``ws``: a :class:`QuantLinear` when every one is a :class:`QuantPart` and
    the model is float32 on the CPU (and ``quantized``), else a float tensor in ``dtype`` on
    ``device`` (parts dequantized)."""
    if not ws:
        raise ValueError("nothing to stack")
    if quantized and dtype == torch.float32 and torch.device(device).type == "cpu" and all(
            isinstance(w, QuantPart) for w in ws):
        return QuantLinear([w for w in ws if isinstance(w, QuantPart)], threads=threads)
    mats = [torch.from_numpy(dequantize(w)) if isinstance(w, QuantPart) else w for w in ws]
    out = mats[0] if len(mats) == 1 else torch.cat(mats)
    return out.to(device=device, dtype=dtype).contiguous()
