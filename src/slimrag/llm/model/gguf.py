"""Read a GGUF file: its metadata and its tensors, dequantized one by one, straight into the engine.

Format (GGUF v2/v3, little-endian): magic ``GGUF``, version, tensor count, metadata count; the
metadata as (key, typed value) pairs (arrays of scalars or strings included); one record per
tensor (name, dims innermost first, ggml type, offset); then the tensor data, aligned to
``general.alignment`` (32). The header is parsed here with ``struct`` over a memory map (the
``gguf`` package's own reader builds a numpy view per array element: 2.0 s to open the embedded
SmolLM2 file with its 49k-token vocabulary, against 0.2 s for this parser, measured on the shared
development machine under load). Tensor bytes are never copied before
use: each is a ``numpy`` view of the map, dequantized by ``gguf.quants.dequantize`` (the
reference dequantizers that llama.cpp's Python tools and transformers use, so the float32 values
are the same numbers) and turned into a torch tensor, one tensor at a time. The two block types
of the embedded model, Q4_1 and Q8_0, are dequantized by :data:`FAST_DEQUANT` instead: the same
float32 arithmetic (``d * q + m``), in numpy over whole tensors, one pass per step and into a
caller's buffer where given (``out``: a product's rows stacked without a copy), bitwise equal to
``gguf.quants`` on every tensor of the embedded file, so peak memory is the model in the target
dtype plus one tensor. Not in torch: its two threads stall behind a core another process keeps
busy, which made the bfloat16 copy's build at ``serve``'s start ~14x slower than numpy under load
(``docs/benchmarks.md``, "The bfloat16 copy's build"); numpy also serves the embedding lookup's few
rows without torch's thread start. Tensors are dequantized on a thread pool (numpy
releases the GIL).

Names. llama.cpp's names map to HF's (``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``).
For the llama architecture (Llama, SmolLM2, Mistral) llama.cpp's converter permuted the rows of
``attn_q``/``attn_k`` so each head's rotary pairs are interleaved (GGML's "normal" RoPE); the
loader permutes them back to the half-split layout of HF's ``rotate_half``, which
:mod:`slimrag.llm.model.rope` uses for every family. Qwen2/Qwen3 files use the half-split
("NEOX") RoPE and are left as they are. ``rope_freqs.weight`` (Llama 3's frequency factors) goes
into the RoPE config.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from slimrag.llm.model.qlinear import Q4_1, Q8_0, SIZES

MAGIC = b"GGUF"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
          7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY = 8, 9
#: Architectures whose GGUF q/k rows were permuted by llama.cpp's converter (see the header).
PERMUTED_ARCHS = frozenset({"llama", "mistral"})

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias", "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight", "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}


def _blocks_out(out: np.ndarray | None, blocks: int) -> np.ndarray:
    """``out`` (C-contiguous float32, checked by :func:`dequantize_rows`) as ``[blocks, 32]``, or a new such array."""
    return np.empty((blocks, 32), np.float32) if out is None else out.reshape(blocks, 32)


def _q4_1(raw: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Q4_1: blocks of 32 weights as (f16 scale d, f16 minimum m, 16 bytes of 4-bit q); w = d*q + m,
    the low nibbles first. One numpy pass per step over the whole tensor, written into ``out``
    when given. ``d * q`` is exact in float32 (11 bits of mantissa times 4), so the one rounding
    is the addition's, as in ``gguf.quants``."""
    b = raw.reshape(-1, 20)
    dm = b[:, :4].copy().view(np.float16).astype(np.float32)  # [blocks, 2]: d, m
    w = _blocks_out(out, b.shape[0])
    np.bitwise_and(b[:, 4:], 0x0F, out=w[:, :16], casting="unsafe")
    np.right_shift(b[:, 4:], 4, out=w[:, 16:], casting="unsafe")
    w *= dm[:, :1]
    w += dm[:, 1:]
    return w.reshape(raw.shape[0], -1)


def _q8_0(raw: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Q8_0: blocks of 32 weights as (f16 scale d, 32 int8 q); w = d*q, written into ``out`` when
    given. In numpy: the embedding lookup dequantizes a prompt's rows with it, a few blocks."""
    b = raw.reshape(-1, 34)
    d = b[:, :2].copy().view(np.float16).astype(np.float32)
    w = _blocks_out(out, b.shape[0])
    np.multiply(d, b[:, 2:].view(np.int8), out=w, casting="unsafe")
    return w.reshape(raw.shape[0], -1)


def _f32(raw: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """F32: the stored floats, copied out of the read-only map (into ``out`` when given)."""
    floats = raw.view(np.float32)
    if out is None:
        return floats.copy()
    np.copyto(out, floats)
    return out


#: ggml type id -> a dequantizer bitwise equal to ``gguf.quants`` (see the module header); F32 (the
#: norms) is here so that the embedded file is read without importing ``gguf``.
FAST_DEQUANT = {0: _f32, Q4_1: _q4_1, Q8_0: _q8_0}
#: ggml type id -> (weights per block, bytes per block), as ``gguf.constants.GGML_QUANT_SIZES``
#: has them, for the types of the embedded model and the usual downloads (F32, F16, Q4_0, Q4_1,
#: Q8_0, Q4_K, Q5_K, Q6_K, BF16): a cold load reads those without importing the ``gguf``
#: package (~0.1 s); other types look theirs up there.
BLOCK_SIZES = {**SIZES, 0: (1, 4), 1: (1, 2), 13: (256, 176), 30: (1, 2)}
_U64 = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor record: numpy shape (outermost first), ggml type id, byte offset in the data."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int


class GGUFFile:
    """A memory-mapped GGUF file: ``metadata`` (key -> value; arrays as lists) and ``tensors``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        with self.path.open("rb") as f:
            try:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError as exc:  # an empty file
                raise ValueError(f"{self.path} is empty, not a GGUF file") from exc
        buf = self._map
        if buf[:4] != MAGIC:
            raise ValueError(f"{self.path} is not a GGUF file (magic {bytes(buf[:4])!r})")
        self._pos = 4
        version = self._scalar(4)
        if version not in (2, 3):
            raise ValueError(f"{self.path}: GGUF version {version} is not supported (2 or 3)")
        n_tensors, n_kv = self._scalar(10), self._scalar(10)
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self._string()
            self.metadata[key] = self._value(self._scalar(4))
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            dims = [self._scalar(10) for _ in range(self._scalar(4))]
            infos.append(TensorInfo(name, tuple(reversed(dims)), self._scalar(4), self._scalar(10)))
        align = int(self.metadata.get("general.alignment", 32))
        self.data_start = -(-self._pos // align) * align
        self.tensors = {t.name: t for t in infos}

    # -- header parsing ------------------------------------------------------------------------

    def _scalar(self, kind: int) -> Any:
        fmt = _SCALARS[kind]
        (value,) = struct.unpack_from(fmt, self._map, self._pos)
        self._pos += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        return self._strings(1)[0]

    def _strings(self, count: int) -> list[str]:
        """``count`` strings in a row (a vocabulary: ~100k of them in a tokenizer's arrays), parsed
        in one local loop: about half the time of one call per string."""
        buf, pos, unpack, out = self._map, self._pos, _U64.unpack_from, []
        append = out.append
        for _ in range(count):
            (n,) = unpack(buf, pos)
            pos += 8
            append(buf[pos : pos + n].decode("utf-8", errors="replace"))
            pos += n
        self._pos = pos
        return out

    def _value(self, kind: int) -> Any:
        if kind == _STRING:
            return self._string()
        if kind == _ARRAY:
            item, count = self._scalar(4), self._scalar(10)
            if item == _STRING:
                return self._strings(count)
            if item in _NUMPY:
                arr = np.frombuffer(self._map, dtype=_NUMPY[item], count=count, offset=self._pos)
                self._pos += arr.nbytes
                return arr.tolist()
            return [self._value(item) for _ in range(count)]
        if kind not in _SCALARS:
            raise ValueError(f"{self.path}: unknown GGUF value type {kind}")
        return self._scalar(kind)

    # -- tensors -------------------------------------------------------------------------------

    def raw(self, info: TensorInfo) -> np.ndarray:
        """The stored bytes of a tensor as a read-only ``uint8`` view ``[rows, row_bytes]``."""
        sizes = BLOCK_SIZES.get(info.ggml_type)
        if sizes is None:
            from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

            sizes = GGML_QUANT_SIZES[GGMLQuantizationType(info.ggml_type)]
        block, size = sizes
        cols = info.shape[-1]
        rows = int(np.prod(info.shape[:-1], dtype=np.int64)) if len(info.shape) > 1 else 1
        row_bytes = cols // block * size
        return np.frombuffer(self._map, dtype=np.uint8, count=rows * row_bytes,
                             offset=self.data_start + info.offset).reshape(rows, row_bytes)

    def dequantize(self, info: TensorInfo) -> np.ndarray:
        """A tensor as float32, in its numpy shape (a new array; the map is not written)."""
        return dequantize_rows(self.raw(info), info.ggml_type).reshape(info.shape)

    def close(self) -> None:
        """Release the memory map (views of it must be gone)."""
        self._map.close()


def dequantize_rows(raw: np.ndarray, ggml_type: int, out: np.ndarray | None = None) -> np.ndarray:
    """Stored rows ``uint8 [n, row_bytes]`` of ``ggml_type`` as float32 ``[n, cols]`` (a new,
    writable array, or ``out``, C-contiguous float32 ``[n, cols]``, written and returned: a
    product's rows stacked without a copy). Block by block, so any subset of a tensor's rows
    dequantizes to exactly those rows of the whole (:class:`slimrag.llm.model.embedding.BlockTable`
    relies on it)."""
    if out is not None and (out.dtype != np.float32 or not out.flags.c_contiguous or not out.flags.writeable
                            or out.ndim != 2 or out.shape[0] != raw.shape[0]):
        raise ValueError(f"out must be writable C-contiguous float32 [{raw.shape[0]}, cols], not "
                         f"{out.dtype} {list(out.shape)}")
    fast = FAST_DEQUANT.get(ggml_type)
    if fast is not None:
        got = fast(raw, out)  # out, when given, written in place
    else:
        from gguf.constants import GGMLQuantizationType
        from gguf.quants import dequantize

        got = dequantize(raw, GGMLQuantizationType(ggml_type))
        if out is not None:
            np.copyto(out, got.reshape(out.shape))
    if out is not None:
        return out
    if got.dtype != np.float32 or not got.flags.writeable:  # F32/F16 come back as views of the map
        got = got.astype(np.float32)
    return got.reshape(raw.shape[0], -1)


def hf_name(name: str) -> str | None:
    """The HF checkpoint name of a llama.cpp tensor name, or None for one the engine does not load."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    return None


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation: per head, rows ``(pair, 2)`` back to ``(2, pair)``."""
    rows = w.shape[0]
    return np.ascontiguousarray(w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def read_tensors(gguf: GGUFFile, arch: str, heads: int, kv_heads: int, workers: int = 2,
                 skip: frozenset[str] = frozenset()) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (HF name, float32 array) for every tensor the engine uses but those in ``skip``
    (file names), dequantized on ``workers`` threads, in file order; q/k rows un-permuted for
    :data:`PERMUTED_ARCHS`."""
    wanted = [(info, hf_name(name)) for name, info in gguf.tensors.items() if name not in skip]
    wanted = [(info, name) for info, name in wanted if name is not None]
    permute = arch in PERMUTED_ARCHS

    def load(item: tuple[TensorInfo, str]) -> tuple[str, np.ndarray]:
        info, name = item
        arr = gguf.dequantize(info)
        if permute and name.endswith("q_proj.weight"):
            arr = unpermute(arr, heads)
        elif permute and name.endswith("k_proj.weight"):
            arr = unpermute(arr, kv_heads)
        return name, arr

    if workers <= 1:
        yield from map(load, wanted)
        return
    with ThreadPoolExecutor(max_workers=workers) as pool:
        yield from pool.map(load, wanted)


def raw_rows(gguf: GGUFFile, info: TensorInfo, arch: str, heads: int, kv_heads: int) -> np.ndarray:
    """A tensor's stored blocks, ``uint8 [rows, row_bytes]``, rows in HF order: a view of the map,
    or for the q/k of :data:`PERMUTED_ARCHS` a row-permuted copy (rows are whole blocks, so the
    permutation of :func:`unpermute` applies to the bytes as it does to the weights)."""
    raw = gguf.raw(info)
    if arch in PERMUTED_ARCHS and info.name.endswith("attn_q.weight"):
        return unpermute(raw, heads)
    if arch in PERMUTED_ARCHS and info.name.endswith("attn_k.weight"):
        return unpermute(raw, kv_heads)
    return raw


def rope_freq_factors(gguf: GGUFFile) -> tuple[float, ...] | None:
    """Llama 3's RoPE frequency factors when the file stores them (``rope_freqs.weight``)."""
    info = gguf.tensors.get("rope_freqs.weight")
    return None if info is None else tuple(float(x) for x in gguf.dequantize(info).ravel())
