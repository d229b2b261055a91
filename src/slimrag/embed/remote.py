"""`RemoteEmbedder`: embeddings from any OpenAI-compatible ``/v1/embeddings`` endpoint.

Works with vLLM (``--task embed``), SGLang (``--is-embedding``), llama.cpp's ``llama-server
--embeddings``, Ollama and text-embeddings-inference's OpenAI route. The base URL follows the
same rule as `RemoteGenerator` (``/v1`` appended when missing; see :mod:`slimrag.openai_http`).

Protocol details handled
    Request ``{"model": ..., "input": [texts]}``. The answer's ``data`` items carry an ``index``;
    the protocol does not promise they come back in input order, so they are sorted by it, and
    a count or index that does not match the input raises. ``embedding`` is normally a list of
    floats; a base64 string (``encoding_format: "base64"``, little-endian float32) is decoded
    too, for proxies that force it. Rows are L2-normalized here whatever the server did, because
    slimrag compares vectors by inner product. Non-finite values raise.

Dimension
    ``dim`` may be given (then every answer is checked against it: an index built with one model
    must never be searched with vectors of another) or discovered from the first answer;
    :meth:`RemoteEmbedder.ensure_dim` forces discovery with a one-word probe when it is needed
    before any text is embedded (for example to write an index manifest).

``model_id`` is ``"remote:" + model``: the same model served locally by sentence-transformers
has a different id on purpose, since servers may pool or truncate differently.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import numpy as np

from slimrag.embed.base import Embedder, normalize
from slimrag.errors import BackendError
from slimrag.openai_http import OpenAIClient


class RemoteEmbedder(Embedder):
    """An `Embedder` backed by an OpenAI-compatible embeddings server.

    base_url: the API root. model: the served embedding model id (required: servers that host
    several models need it, and it becomes part of ``model_id``). api_key: sent as a bearer
    token. dim: expected dimension, or None to learn it from the first answer. timeout: seconds
    per request. Close with :meth:`close` or use as a context manager.
    """

    kind = "remote"

    def __init__(self, base_url: str, model: str, api_key: str | None = None, dim: int | None = None,
                 timeout: float = 60.0) -> None:
        if not model:
            raise ValueError("model must name the served embedding model, e.g. 'all-MiniLM-L6-v2'")
        if dim is not None and dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        self._client = OpenAIClient(base_url, api_key=api_key, timeout=timeout)
        self._lock = threading.Lock()
        self.model = model
        self.model_id = f"remote:{model}"
        self.dim = dim or 0

    @property
    def base_url(self) -> str:
        """The normalized API root requests go to."""
        return self._client.root

    def record(self) -> dict[str, Any]:
        """The base record, plus ``base_url`` and ``model`` to reach the server again (the API key
        is never written: give it by opening the index with the embedder)."""
        return {**super().record(), "base_url": self.base_url, "model": self.model}

    def ensure_dim(self) -> int:
        """Return ``dim``, asking the server for one probe embedding if it is not known yet."""
        if not self.dim:
            self.embed_batch(["dimension probe"])
        return self.dim

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        """Embed one batch in one request: float32 array (len(texts), dim) with unit-norm rows."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        url = self._client.url("embeddings")
        body = self._client.post_json("embeddings", {"model": self.model, "input": list(texts)})
        rows = _rows_in_input_order(body, len(texts), url)
        vectors = [_vector(r, url) for r in rows]
        if len({v.size for v in vectors}) != 1:
            raise BackendError(f"{url} returned embeddings of different lengths in one batch; "
                               "the server is misbehaving: check its log and version")
        matrix = np.stack(vectors)
        if not np.all(np.isfinite(matrix)):
            raise BackendError(f"{url} returned NaN or infinite values for model {self.model!r}; "
                               "check the model and its precision settings on the server")
        with self._lock:
            if not self.dim:
                self.dim = int(matrix.shape[1])
        if matrix.shape[1] != self.dim:
            raise BackendError(f"{url} returned {matrix.shape[1]}-dimensional vectors, expected {self.dim}; "
                               f"the server is not serving the model this index was built with ({self.model!r})")
        return normalize(matrix)

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()

    def __enter__(self) -> RemoteEmbedder:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _rows_in_input_order(body: Any, n: int, url: str) -> list[Any]:
    """The ``embedding`` fields of ``body["data"]`` sorted by ``index``, checked to cover 0..n-1."""
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list) or not all(isinstance(d, dict) and "embedding" in d for d in data):
        raise BackendError(f"{url} answered without a 'data' list of embeddings; is this an "
                           "OpenAI-compatible embeddings endpoint (vLLM needs --task embed)?")
    # Servers that omit 'index' answer in input order (the protocol's intent); keep that order.
    indexed = [(d.get("index", i), d["embedding"]) for i, d in enumerate(data)]
    if sorted(i for i, _ in indexed if isinstance(i, int)) != list(range(n)):
        raise BackendError(f"{url} returned {len(data)} embeddings for {n} inputs (or indexes that do not "
                           "match them); the server may truncate batches: use a smaller batch size")
    indexed.sort(key=lambda pair: pair[0])
    return [e for _, e in indexed]


def _vector(raw: Any, url: str) -> np.ndarray:
    """One embedding as float32, from a list of numbers or a base64 string of float32 bytes."""
    try:
        if isinstance(raw, str):
            return np.frombuffer(base64.b64decode(raw, validate=True), dtype="<f4").astype(np.float32)
        vec = np.asarray(raw, dtype=np.float32)
    except (ValueError, TypeError) as exc:
        raise BackendError(f"{url} returned an embedding that is not a list of numbers: "
                           f"{str(raw)[:100]!r}") from exc
    if vec.ndim != 1 or vec.size == 0:
        raise BackendError(f"{url} returned an embedding of shape {vec.shape}; expected a flat vector")
    return vec
