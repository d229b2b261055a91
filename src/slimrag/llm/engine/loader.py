"""Load a model for the engine: a GGUF file, or an HF folder (``config.json`` + ``*.safetensors`` + ``tokenizer.json``).

GGUF: :mod:`slimrag.llm.engine.gguf` parses the header, the config comes from the metadata
(:meth:`ModelConfig.from_gguf`), the tokenizer too (:meth:`Tokenizer.from_gguf`), and the tensors
are dequantized one by one into the target dtype. Nothing is written to disk: there is no
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

from slimrag.llm.engine.config import ModelConfig
from slimrag.llm.engine.gguf import GGUFFile, read_tensors, rope_freq_factors
from slimrag.llm.engine.model import Decoder
from slimrag.llm.engine.tokenizer import Tokenizer


def load_checkpoint(path: str | os.PathLike[str], *, device: str = "cpu", dtype: torch.dtype = torch.float32,
                    ) -> tuple[Decoder, Tokenizer]:
    """The decoder and tokenizer at ``path`` (a ``.gguf`` file or an HF folder); ValueError or
    FileNotFoundError with the reason when it is neither or is incomplete."""
    src = Path(path)
    if src.is_dir():
        return load_folder(src, device=device, dtype=dtype)
    return load_gguf(src, device=device, dtype=dtype)


def load_gguf(path: Path, *, device: str = "cpu", dtype: torch.dtype = torch.float32,
              workers: int | None = None) -> tuple[Decoder, Tokenizer]:
    """A GGUF file (see the module header). ``workers``: dequantizing threads (default: up to 4
    of this machine's cores)."""
    import dataclasses

    gguf = GGUFFile(path)
    meta = gguf.metadata
    config = ModelConfig.from_gguf(meta, tied="output.weight" not in gguf.tensors)
    factors = rope_freq_factors(gguf)
    if factors is not None:
        config = dataclasses.replace(config, rope=dataclasses.replace(config.rope, freq_factors=factors))
    workers = workers or min(4, os.cpu_count() or 1)
    tensors = {name: torch.from_numpy(arr).to(device=device, dtype=dtype)
               for name, arr in read_tensors(gguf, config.arch, config.num_heads, config.num_kv_heads, workers)}
    model = Decoder.from_state_dict(config, tensors, dtype=dtype, device=device)
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
