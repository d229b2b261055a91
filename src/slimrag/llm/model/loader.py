"""Load a model for the engine: a GGUF file, or an HF folder (``config.json`` + ``*.safetensors`` + ``tokenizer.json``).

GGUF: :mod:`slimrag.llm.model.gguf` parses the header, the config comes from the metadata
(:meth:`ModelConfig.from_gguf`), the tokenizer too (:meth:`Tokenizer.from_gguf`). On a float32
CPU model the projections stored as Q4_0/Q4_1/Q8_0/Q4_K/Q6_K stay in their blocks
(:class:`~slimrag.llm.model.qlinear.QuantLinear`, one ONNX Runtime session each; the output head
of a tied model reads the embedding table's blocks), and so does the embedding table, whose lookup
dequantizes only the rows it reads (:mod:`slimrag.llm.model.embedding`); every other tensor (norms,
other block types) is dequantized one by one into the target dtype. On a CPU with AMX
the layers' bfloat16 copy for the prefill is built here too (:mod:`slimrag.llm.model.bf16`: 212 MB
and ~0.5-1.7 s for SmolLM2-135M, by load). Nothing is written to disk: there is no
conversion cache, because the direct read already beats the cache it replaced (in one run of
``bench.engine``: 5.1 s against 37.6 s for the transformers engine's load from its 540 MB cache,
on a saturated machine; ``docs/benchmarks.md``), and no second copy of the model sits on disk.

HF folder: ``config.json`` (:meth:`ModelConfig.from_hf`), every ``*.safetensors`` file read
through ``safetensors``' memory map, and ``tokenizer.json``. This is how random-weight reference
models built with transformers in the tests reach the engine, and how Mistral with its
SentencePiece vocabulary loads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from slimrag.llm.model.config import ModelConfig
from slimrag.llm.model.embedding import BlockTable
from slimrag.llm.model.gguf import (
    GGUFFile,
    hf_name,
    raw_rows,
    read_tensors,
    rope_freq_factors,
)
from slimrag.llm.model.model import Decoder
from slimrag.llm.model.prefill import bf16_fits, prefill_mode
from slimrag.llm.model.qlinear import QuantPart, quantizable
from slimrag.llm.model.tokenizer import Tokenizer


def load_checkpoint(path: str | os.PathLike[str], *, device: str = "cpu", dtype: torch.dtype = torch.float32,
                    quantized: bool = True, dense_rows: int | None = None,
                    bf16: bool | None = None) -> tuple[Decoder, Tokenizer]:
    """The decoder and tokenizer at ``path`` (a ``.gguf`` file or an HF folder); ValueError or
    FileNotFoundError with the reason when it is neither or is incomplete. ``quantized``,
    ``dense_rows`` and ``bf16``: see :func:`load_gguf` (an HF folder is always float)."""
    src = Path(path)
    if src.is_dir():
        return load_folder(src, device=device, dtype=dtype)
    return load_gguf(src, device=device, dtype=dtype, quantized=quantized, dense_rows=dense_rows, bf16=bf16)


#: HF names of the projections that may stay quantized (every matrix but the embedding table).
_PROJECTIONS = ("_proj.weight", "lm_head.weight")


def load_gguf(path: Path, *, device: str = "cpu", dtype: torch.dtype = torch.float32,
              workers: int | None = None, quantized: bool = True, dense_rows: int | None = None,
              bf16: bool | None = None) -> tuple[Decoder, Tokenizer]:
    """A GGUF file (see the module header). ``workers``: dequantizing threads (default: up to 4
    of this machine's cores). ``quantized``: keep the projections stored as Q4_0/Q4_1/Q8_0/Q4_K/Q6_K in
    their blocks and compute on them (:mod:`slimrag.llm.model.qlinear`; float32 CPU models
    only); False dequantizes every tensor to ``dtype``. ``dense_rows``: :class:`Decoder`'s
    threshold for float32 products in long forwards (None: always quantized). ``bf16``: prefill
    in bfloat16 (:mod:`slimrag.llm.model.bf16`): None where the copy fits, False never (the
    quantized kernel's rows: a one-shot process, whose copy and first bf16 passes cost more than
    they save)."""
    import dataclasses

    gguf = GGUFFile(path)
    meta = gguf.metadata
    config = ModelConfig.from_gguf(meta, tied="output.weight" not in gguf.tensors)
    factors = rope_freq_factors(gguf)
    if factors is not None:
        config = dataclasses.replace(config, rope=dataclasses.replace(config.rope, freq_factors=factors))
    workers = workers or min(4, os.cpu_count() or 1)
    keep = quantized and dtype == torch.float32 and torch.device(device).type == "cpu"
    parts: dict[str, torch.Tensor | QuantPart] = {}
    for name, info in gguf.tensors.items():
        hf = hf_name(name)
        if keep and hf is not None and hf.endswith(_PROJECTIONS) and quantizable(info.ggml_type):
            rows = raw_rows(gguf, info, config.arch, config.num_heads, config.num_kv_heads)
            parts[hf] = QuantPart(rows, info.ggml_type, info.shape[-1])
    embed = gguf.tensors.get("token_embd.weight")
    lookup: dict[str, BlockTable] = {}
    if keep and embed is not None and quantizable(embed.ggml_type):
        # The lookup dequantizes the rows it reads; a tied model's head multiplies on the same blocks.
        raw, kind = gguf.raw(embed), embed.ggml_type
        lookup["model.embed_tokens.weight"] = BlockTable(raw, kind, embed.shape[-1])
        if config.tie_embeddings:
            parts["lm_head.weight"] = QuantPart(raw, kind, embed.shape[-1])
    skip = frozenset(n for n, info in gguf.tensors.items() if hf_name(n) in parts or hf_name(n) in lookup)
    tensors: dict[str, torch.Tensor | QuantPart | BlockTable] = {
        name: torch.from_numpy(arr).to(device=device, dtype=dtype)
        for name, arr in read_tensors(gguf, config.arch, config.num_heads, config.num_kv_heads, workers, skip)}
    tensors.update(parts)
    tensors.update(lookup)
    model = Decoder.from_state_dict(config, tensors, dtype=dtype, device=device, dense_rows=dense_rows)
    if bf16 is False or bf16_fits(model):  # settled now: every forward of the model computes one way
        model.settled_mode = prefill_mode(model, bf16=bf16 is not False)  # the copy held where its rows check out
    tokenizer = Tokenizer.from_gguf(meta)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in config.eos_ids:
        config = dataclasses.replace(config, eos_ids=(*config.eos_ids, tokenizer.eos_token_id))
        model.config = config
    return model, tokenizer


def load_folder(folder: Path, *, device: str = "cpu", dtype: torch.dtype = torch.float32,
                ) -> tuple[Decoder, Tokenizer]:
    """An HF folder (see the module header)."""
    from safetensors import safe_open

    conf = folder / "config.json"
    if not conf.is_file():
        raise FileNotFoundError(f"{folder} has no config.json; pass a .gguf file or an HF model folder")
    config = ModelConfig.from_hf(json.loads(conf.read_text()))
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} has no *.safetensors weights")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt", device="cpu") as st:
            for name in st.keys():  # noqa: SIM118  (safe_open is not a mapping)
                tensors[name] = st.get_tensor(name)
    model = Decoder.from_state_dict(config, tensors, dtype=dtype, device=device)
    return model, Tokenizer.from_folder(folder)
