"""The `Embedder` interface: texts in, L2-normalized float32 vectors out.

One required method, :meth:`Embedder.embed_batch`. :meth:`Embedder.embed` splits long inputs into
batches and shows a progress bar on long runs. Vectors are normalized so that inner product is
cosine similarity everywhere in slimrag (flat search, graph search, reranking).

:meth:`Embedder.record` is what an index manifest keeps about the embedder; its ``kind`` names
the factory in `slimrag.embed.registry` that rebuilds the embedder when the index is opened, so
callers never inspect an embedder's class or attributes to decide how to store or reload it.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np


class Embedder(ABC):
    """Maps texts to vectors. ``model_id`` and ``dim`` are written into an index manifest, so an
    index is never searched with vectors of another model."""

    model_id: str = "unknown"
    dim: int = 0
    #: key of the factory in `slimrag.embed.registry` that rebuilds this embedder from its
    #: `record`; "custom" has none, so an index built with it is opened with the embedder given
    kind: str = "custom"

    @abstractmethod
    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        """Embed one batch: returns float32 array of shape (len(texts), dim), rows of unit norm."""

    def record(self) -> dict[str, Any]:
        """What an index manifest stores about this embedder: ``id`` (`model_id`), ``dim``,
        ``normalized`` and ``kind``, plus whatever the kind's factory needs to rebuild it (an
        implementation extends ``super().record()``). JSON-able."""
        return {"id": self.model_id, "dim": int(self.dim), "normalized": True, "kind": self.kind}

    def embed(self, texts: Sequence[str], batch_size: int = 64, progress: bool | None = None) -> np.ndarray:
        """Embed any number of texts in batches of ``batch_size``.

        progress: show a tqdm bar; by default only when there are more than 4 batches and stderr
        is a terminal.
        """
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        starts = range(0, len(texts), batch_size)
        if progress is None:
            progress = len(starts) > 4 and sys.stderr.isatty()
        if progress:
            from tqdm import tqdm

            starts = tqdm(starts, desc="embedding", unit="batch", leave=False)  # type: ignore[assignment]
        out = [normalize(self.embed_batch(texts[s : s + batch_size])) for s in starts]
        return np.concatenate(out, axis=0)


def normalize(x: np.ndarray) -> np.ndarray:
    """Return float32 rows of unit L2 norm (zero rows stay zero)."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)
