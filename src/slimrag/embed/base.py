"""The `Embedder` interface: texts in, L2-normalized float32 vectors out.

One required method, :meth:`Embedder.embed_batch`. :meth:`Embedder.embed` is what every caller
uses for more than one batch (the index writer hands it all texts of one commit, up to 2,048
chunks; slim search hands it the candidates to recompute), and it is where throughput is won:

Length bucketing
    A transformer pads every text of a batch to the batch's longest, so batches cut in file order
    spend much of their time on padding (measured on Python-doc paragraphs: about half). `embed`
    sorts the texts by :meth:`Embedder.lengths` (a cost proxy: characters by default, tokens for the
    local model), embeds consecutive runs of ``batch_size`` texts of similar length, and writes each
    vector back to its input position, so the output order is the input order.

Exactness of bucketing
    A text's vector does not depend on its batch mates in exact arithmetic (padding is masked), but
    batch shape changes the order of float32 sums, so a bucketed vector may differ from the same
    text embedded in another batch by float rounding: measured max abs difference ~1e-7 per
    component (cosine 1 - 1e-6). `BUCKET_TOLERANCE` is the bound the tests check; it is the same
    bound that slim search's recomputation (other batch mates than at build time) must meet.

Vectors are normalized so that inner product is cosine similarity everywhere in slimrag (flat
search, graph search, reranking).

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

#: Max abs difference per component allowed between two embeddings of one text computed in
#: different batches (bucketed vs unbucketed, build vs slim recomputation). Observed: ~2e-7.
BUCKET_TOLERANCE = 1e-5


class Embedder(ABC):
    """Maps texts to vectors. ``model_id`` and ``dim`` are written into an index manifest, so an
    index is never searched with vectors of another model."""

    model_id: str = "unknown"
    dim: int = 0
    #: key of the factory in `slimrag.embed.registry` that rebuilds this embedder from its
    #: `record`; "custom" has none, so an index built with it is opened with the embedder given
    kind: str = "custom"
    #: the most texts per `embed_batch` call that this embedder runs fastest at, whatever
    #: ``batch_size`` a caller asks for (a caller's batch size is tuned for memory, this for speed);
    #: None: no cap
    batch_cap: int | None = None
    #: the most tokens of one text the model reads (its input window; the rest is cut off), or
    #: None when unknown (a remote model): `IndexConfig.window_warning` checks chunk sizes against it
    max_tokens: int | None = None

    @abstractmethod
    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        """Embed one batch: returns float32 array of shape (len(texts), dim), rows of unit norm."""

    def record(self) -> dict[str, Any]:
        """What an index manifest stores about this embedder: ``id`` (`model_id`), ``dim``,
        ``normalized`` and ``kind``, plus whatever the kind's factory needs to rebuild it (an
        implementation extends ``super().record()``). JSON-able."""
        return {"id": self.model_id, "dim": int(self.dim), "normalized": True, "kind": self.kind}

    def load(self) -> None:
        """Load the model now (idempotent), so a caller can overlap the load with other work, as a
        one-shot ``slimrag ask`` does with the LLM's; embedders that load nothing keep this no-op."""
        return None

    def lengths(self, texts: Sequence[str]) -> np.ndarray:
        """A per-text cost proxy that `embed` sorts by, so batch mates pad little. Characters here;
        an embedder that knows its tokenizer returns token counts (cheaper to pad exactly)."""
        return np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))

    def embed(self, texts: Sequence[str], batch_size: int = 64, progress: bool | None = None) -> np.ndarray:
        """Embed any number of texts, bucketed by length (see the module header); row i is text i.

        batch_size: texts per `embed_batch` call, at most `batch_cap`. progress: show a tqdm bar;
        by default only when there are more than 4 batches and stderr is a terminal.
        """
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        batch_size = min(batch_size, self.batch_cap or batch_size)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        order = np.argsort(self.lengths(texts), kind="stable")
        starts = range(0, len(texts), batch_size)
        if progress is None:
            progress = len(starts) > 4 and sys.stderr.isatty()
        if progress:
            from tqdm import tqdm

            starts = tqdm(starts, desc="embedding", unit="batch", leave=False)  # type: ignore[assignment]
        out: np.ndarray | None = None
        for s in starts:
            rows = order[s: s + batch_size]
            vecs = normalize(self.embed_batch([texts[int(i)] for i in rows]))
            if out is None:  # the dimension may only be known after the first batch (remote)
                out = np.empty((len(texts), vecs.shape[1]), dtype=np.float32)
            out[rows] = vecs
        assert out is not None
        return out


def normalize(x: np.ndarray) -> np.ndarray:
    """Return float32 rows of unit L2 norm (zero rows stay zero)."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)
