"""Faster graphs of the exported embedder: transformer fusions and int8 matrix products.

Every variant is built from the exported float32 graph (`slimrag.embed.onnx`), offline, once per
model folder, into the same export folder; `BUILDERS` maps a variant name to its builder. Each
builder writes to a temporary name and renames, so a crash never leaves half a graph.

``int8`` (per-tensor dynamic, the first int8 variant; opt-in)
    ``quantize_dynamic`` with one weight scale per matrix and MatMul only. On MiniLM the scale of a
    whole matrix is set by a few outlier weights, and activations are quantized per tensor at run
    time: measured median cosine to fp32 0.91-0.95 on real text, recall@10 vs fp32 ~0.78.

``int8-fused`` (fusions + per-channel dynamic int8)
    1. ONNX Runtime's transformer optimizer (``onnxruntime.transformers.optimizer``,
       ``model_type="bert"``, 12 heads, width 384) fuses each layer's attention into one
       ``Attention`` node, GELU with its bias into ``BiasGelu``, and residual + LayerNorm into
       ``SkipLayerNormalization``. Exact up to float rounding (cosine to fp32 1 - 1e-7), about
       1.1x faster alone.
    2. ``quantize_dynamic`` with ``per_channel=True`` on the ``Attention`` (Q, K, V projections,
       as ``QAttention``) and ``MatMul`` nodes: one int8 scale per output column of each weight,
       activations quantized to uint8 at run time. Layer norms, softmax, GELU, the embeddings and
       the pooling stay float32. Measured (bench/ingest.py) about 2x fp32's chunks/s on 256-token
       chunks, median cosine to fp32 ~0.99.

    Trade-off: dynamic quantization takes one activation scale per input tensor of a call, so a
    vector depends slightly on its batch mates (the batch's largest activation sets the scale);
    measured cosine of a text alone vs in a batch of 16: 0.989-0.995, as large as the int8
    error itself (tests/test_embed_variants.py bounds it). Queries are embedded alone, chunks in
    batches, so this costs recall against fp32: 0.927 at 10 on disfl_qa questions.

``int8-block`` (fusions + blockwise 8-bit MatMulNBits)
    The fused graph, then each layer's attention-output, FFN-in and FFN-out MatMul becomes a
    ``MatMulNBits`` node (bits 8, `BLOCK` = 128 input values per weight scale, symmetric) with
    ``accuracy_level=4``: ONNX Runtime quantizes the activations per block of 128 values of each
    row (token) and multiplies in int8. A scale per row and block instead of per tensor is what
    fixes both faults of ``int8-fused``: an outlier feature only coarsens its own block, and no
    row's scale depends on another row, so batch mates barely move a vector (measured cosine alone
    vs in a batch of 16 >= 0.9999, against 0.989 for ``int8-fused``). Cosine to fp32 ~0.9995. The Q, K, V
    projections inside the fused ``Attention`` node stay float32 (ONNX Runtime has no blockwise
    int8 attention on CPU). Block 32 is as exact and slower (more scales per product).

Knobs (module constants): `NUM_HEADS` and `HIDDEN` describe all-MiniLM-L6-v2 (read from the
model's ``config.json`` when present); `OPT_LEVEL` 1 keeps the fusions portable (level 2 adds
layout-specific ones that ONNX Runtime would redo at session start anyway); `BLOCK` is
``int8-block``'s block (a power of two dividing 384 and 1536; smaller is finer and slower).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("slimrag.embed")

#: MiniLM-L6's attention heads and width, used when the model folder has no config.json.
NUM_HEADS = 12
HIDDEN = 384
#: transformer optimizer level (see the header)
OPT_LEVEL = 1
#: input values per int8 block of ``int8-block`` (weights and activations alike; see the header)
BLOCK = 128

Builder = Callable[[Path, Path, Path], None]


def _shape(model_dir: Path) -> tuple[int, int]:
    """(heads, width) from the model folder's config.json, else MiniLM's."""
    cfg_path = model_dir / "config.json"
    if cfg_path.is_file():
        cfg = json.loads(cfg_path.read_text())
        return int(cfg.get("num_attention_heads", NUM_HEADS)), int(cfg.get("hidden_size", HIDDEN))
    return NUM_HEADS, HIDDEN


def _atomic(dst: Path, write: Callable[[Path], None]) -> None:
    tmp = dst.with_name(f".tmp-{os.getpid()}-{dst.name}")
    try:
        write(tmp)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def int8_per_tensor(fp32: Path, dst: Path, model_dir: Path) -> None:
    """``int8``: dynamic int8 weights, one scale per matrix, MatMul only (see the header)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    _atomic(dst, lambda tmp: quantize_dynamic(str(fp32), str(tmp), weight_type=QuantType.QInt8))


def fused(fp32: Path, dst: Path, model_dir: Path) -> None:
    """The fp32 graph with ONNX Runtime's BERT fusions (step 1 of ``int8-fused``)."""
    from onnxruntime.transformers.optimizer import optimize_model

    heads, width = _shape(model_dir)
    model = optimize_model(str(fp32), model_type="bert", num_heads=heads, hidden_size=width, opt_level=OPT_LEVEL)
    stats = model.get_fused_operator_statistics()
    if not stats.get("Attention"):
        raise RuntimeError(f"the transformer optimizer fused no attention in {fp32} ({stats}); this model's "
                           "graph is not BERT-shaped: use runtime='onnx'")
    _atomic(dst, lambda tmp: model.save_model_to_file(str(tmp)))


def _fused_beside(fp32: Path, dst: Path, model_dir: Path) -> Path:
    """The ``fused`` graph in ``dst``'s folder, which the int8 variants start from (built once)."""
    fused_path = dst.with_name(BUILDERS["fused"][0])
    if not fused_path.is_file():
        fused(fp32, fused_path, model_dir)
    return fused_path


def int8_fused(fp32: Path, dst: Path, model_dir: Path) -> None:
    """``int8-fused``: fusions, then per-channel dynamic int8 Attention and MatMul (see the header)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    fused_path = _fused_beside(fp32, dst, model_dir)
    # DefaultTensorType: the fused ops (com.microsoft domain) defeat ONNX shape inference, so the
    # quantizer is told that the tensors it cannot type are float32, which they all are here.
    _atomic(dst, lambda tmp: quantize_dynamic(
        str(fused_path), str(tmp), weight_type=QuantType.QInt8, per_channel=True,
        op_types_to_quantize=["MatMul", "Attention"],
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT}))


def _matmul_nbits(src: Path, dst: Path, block: int) -> None:
    """Replace every MatMul whose weight is a constant by ``MatMulNBits`` with 8-bit weights, one
    scale per ``block`` input rows of each output column (zero point 128, symmetric), and
    ``accuracy_level=4``: ONNX Runtime then quantizes the activations to int8 per block of the
    same ``block`` values of each row and multiplies in int8 (VNNI/AMX where the CPU has them)."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(src))
    inits = {i.name: i for i in model.graph.initializer}
    nodes, replaced = [], set()
    for node in model.graph.node:
        if node.op_type != "MatMul" or node.input[1] not in inits:
            nodes.append(node)
            continue
        w = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)  # (K, N)
        k, n = w.shape
        if k % block:
            nodes.append(node)
            continue
        blocks = w.T.reshape(n, k // block, block)
        scale = np.abs(blocks).max(-1) / 127.0
        scale[scale == 0] = 1.0
        q = (np.clip(np.round(blocks / scale[..., None]), -127, 127) + 128).astype(np.uint8)
        base = node.input[1]
        inits[base + "_q8"] = numpy_helper.from_array(q, base + "_q8")
        inits[base + "_scale"] = numpy_helper.from_array(scale.astype(np.float32).reshape(-1), base + "_scale")
        nodes.append(helper.make_node("MatMulNBits", [node.input[0], base + "_q8", base + "_scale"], list(node.output),
                                      name=node.name + "_q8", domain="com.microsoft", K=k, N=n, bits=8,
                                      block_size=block, accuracy_level=4))
        replaced.add(base)
    if not replaced:
        raise RuntimeError(f"{src} has no MatMul with a constant weight to quantize")
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    kept = [init for name, init in inits.items() if name not in replaced]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    _atomic(dst, lambda tmp: onnx.save(model, str(tmp)))


def int8_block(fp32: Path, dst: Path, model_dir: Path) -> None:
    """``int8-block``: fusions, then the output, FFN-in and FFN-out MatMuls of each layer as 8-bit
    blockwise ``MatMulNBits`` (`BLOCK`; see the header)."""
    _matmul_nbits(_fused_beside(fp32, dst, model_dir), dst, BLOCK)


#: variant -> (file name in the export folder, builder from the fp32 graph); fp32 is the export itself
BUILDERS: dict[str, tuple[str, Builder]] = {
    "int8": ("model-int8.onnx", int8_per_tensor),
    "fused": ("model-fused.onnx", fused),
    "int8-fused": ("model-int8-fused.onnx", int8_fused),
    "int8-block": (f"model-int8-block{BLOCK}.onnx", int8_block),
}
