"""`SyntheticEmbedder`: a deterministic, model-free stand-in embedder with clustered vectors.

Why: at a million chunks a real embedder (MiniLM here: ~70 chunks/s on 2 cores) spends hours on
what the index never sees, so scale benchmarks (`bench.scale`) and tests of the write path would
measure the model, not the index. This embedder costs microseconds per text and still gives the
index what it needs to be exercised honestly:

- **Deterministic per text.** A text's vector depends on the text and the embedder's knobs only,
  never on its batch mates or on the call, so a slim index that recomputes rows at search time
  gets the vectors the build stored, in any process: bit for bit, but for the chance that a
  float64 product's batch-dependent rounding (~1e-16) crosses a float32 rounding boundary
  (about one component in 10^8, then by one ulp, far inside `BUCKET_TOLERANCE`).
- **Clustered, like sentence embeddings.** Real embeddings share a mean direction, form topics
  with sub-topics and put most variance in a few dozen directions; an index tuned on isotropic
  noise learns nothing about them. The law is that of ``bench.vectors.text_like`` (the synthetic
  matrices of the index tests), drawn per text instead of per matrix::

      x = 0.35 mean + 0.9 topic[t] + 0.5 sub[t, s] + 0.45 low-rank noise + 0.04 full-rank noise

  normalised to unit length. The mean, the topic and sub-topic centres and a ``rank``-dimensional
  basis (1/sqrt(i + 1) spectrum) are drawn once from ``seed``.
- **Topics follow the text.** The topic ``t`` is a hash of the text's first word (``topic_from=
  "first_word"``, the default) or of the whole text (``"text"``); the sub-topic ``s`` (one of 8) and
  the noise come from a hash of the whole text. Passages that start with their topic's name (the
  generator of ``bench.passages`` writes them so) cluster by topic, and a query that starts with
  that name lands among them, so vector search returns related passages rather than random ones.
- **Cheap.** One BLAKE2b hash of the text and one CRC-32 of its first word in Python, then numpy
  only. The low-rank noise is a counter-based stream (SplitMix64 of (text hash, coordinate)),
  uniform with unit variance, close to Gaussian after the projection on the basis; the full-rank
  noise is the sum of two rows of a fixed Gaussian table (`NOISE_ROWS`) picked by the text hash,
  so texts share full-rank noise rows (at weight 0.04 that moves cosines by ~1e-3, far below the
  low-rank noise that sets the neighbourhoods). 110,000–180,000 texts of 60 words per CPU-second
  (``python -m bench.scale`` reports it with each run, see ``docs/benchmarks.md``).

Knobs (all recorded in the index manifest, so `slimrag.embed.registry` rebuilds the same embedder
when the index is opened, kind ``"synthetic"``):

- ``dim`` (384, MiniLM's): vector length; bytes per flat row = 4 · dim.
- ``topics`` (1024): topic count. With N texts, about N / topics per topic (8 sub-topics each);
  few topics make dense neighbourhoods (hard for PQ ranking), many make easy, separated ones.
- ``rank`` (min(96, dim)): dimension of the subspace holding the centres and the main noise;
  the full-rank noise keeps vectors from being exactly low-rank.
- ``seed`` (0): draws the centres and the basis; two embedders with other seeds are other "models"
  (another ``model_id``), so an index never mixes them.
- ``topic_from`` ("first_word"): what picks the topic (see above).

The vectors mean nothing beyond this law: use it to measure an index, never to judge answers.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from slimrag.embed.base import Embedder

#: what picks a text's topic: its first word, or the whole text
TOPIC_FROM = ("first_word", "text")
#: sub-topics per topic
SUBTOPICS = 8
#: rows of the full-rank noise table; a text's full-rank noise is the sum of two rows (each of
#: standard deviation 0.04/sqrt 2) picked by its hash (4096² pairs), far cheaper than drawing
#: ``dim`` values per text
NOISE_ROWS = 4096
#: texts per numpy block in `SyntheticEmbedder.embed`: bounds the temporaries (~2 KB a text)
BLOCK = 8192

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_SQRT3 = np.float32(np.sqrt(3.0))


def _hash64(texts: Sequence[str], salt: bytes) -> np.ndarray:
    """A 64-bit BLAKE2b (salted with the seed) of each text, as uint64: stable across processes and
    machines, unlike Python's ``hash``."""
    blake, enc = hashlib.blake2b, "utf-8"
    digests = b"".join(blake(t.encode(enc, "surrogatepass"), digest_size=8, salt=salt).digest() for t in texts)
    return np.frombuffer(digests, dtype="<u8").astype(np.uint64)


def _uniform(keys: np.ndarray, count: int) -> np.ndarray:
    """``(len(keys), count)`` float32 values, uniform on [-sqrt 3, sqrt 3] (unit variance): the
    SplitMix64 finaliser of ``key + (j + 1) · golden`` gives coordinates 2j and 2j + 1 (24 bits
    from each 32-bit half). Counter-based, so a row depends on its key alone."""
    half = (count + 1) // 2
    z = keys[:, None] + (np.arange(1, half + 1, dtype=np.uint64) * _GOLDEN)[None, :]
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    z ^= z >> np.uint64(31)
    bits = np.empty((len(keys), 2 * half), dtype=np.float32)
    bits[:, 0::2] = z >> np.uint64(40)
    bits[:, 1::2] = (z >> np.uint64(8)) & np.uint64(0xFFFFFF)
    u = bits[:, :count] * np.float32(2.0 ** -23) - np.float32(1.0)
    return u * _SQRT3


class SyntheticEmbedder(Embedder):
    """Deterministic clustered unit vectors from text hashes (see the module header). Thread-safe:
    it holds only read-only arrays."""

    kind = "synthetic"

    def __init__(self, dim: int = 384, topics: int = 1024, *, rank: int | None = None, seed: int = 0,
                 topic_from: str = "first_word") -> None:
        if dim < 2:
            raise ValueError(f"dim must be >= 2, got {dim}")
        if topics < 1:
            raise ValueError(f"topics must be >= 1, got {topics}")
        rank = min(96, dim) if rank is None else rank
        if not 1 <= rank <= dim:
            raise ValueError(f"rank must be in [1, dim={dim}], got {rank}")
        if topic_from not in TOPIC_FROM:
            raise ValueError(f"topic_from must be one of {TOPIC_FROM}, got {topic_from!r}")
        if not 0 <= seed < 2 ** 32:
            raise ValueError(f"seed must be in [0, 2**32), got {seed}")
        self.dim, self.topics, self.rank, self.seed, self.topic_from = dim, topics, rank, seed, topic_from
        self.model_id = f"synthetic-d{dim}-t{topics}-r{rank}-s{seed}" + ("" if topic_from == "first_word" else "-text")
        self._salt = seed.to_bytes(4, "little")
        rng = np.random.default_rng(seed)
        mean = rng.normal(size=dim)
        self._mean = (0.35 * mean / np.linalg.norm(mean)).astype(np.float32)
        spectrum = 1.0 / np.sqrt(1.0 + np.arange(rank))
        self._basis = np.linalg.qr(rng.normal(size=(dim, rank)))[0].T  # (rank, dim), float64
        # centres kept in basis coordinates: one (rows, rank) @ (rank, dim) product per block
        self._topic = (0.9 * rng.normal(size=(topics, rank)) * spectrum).astype(np.float32)
        self._sub = (0.5 * rng.normal(size=(topics * SUBTOPICS, rank)) * spectrum).astype(np.float32)
        self._spectrum = (0.45 * spectrum).astype(np.float32)
        self._noise = (0.04 / np.sqrt(2.0) * rng.normal(size=(NOISE_ROWS, dim))).astype(np.float32)

    def record(self) -> dict[str, Any]:
        """The base record plus every knob, so `slimrag.embed.registry` rebuilds this embedder."""
        return {**super().record(), "topics": self.topics, "rank": self.rank, "seed": self.seed,
                "topic_from": self.topic_from}

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> SyntheticEmbedder:
        """The embedder a manifest's record describes (the inverse of `record`)."""
        return cls(int(rec["dim"]), int(rec["topics"]), rank=int(rec["rank"]), seed=int(rec["seed"]),
                   topic_from=rec.get("topic_from", "first_word"))

    def _keys(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        n = len(texts)
        text_keys = _hash64(texts, self._salt)
        if self.topic_from == "text":
            return text_keys, text_keys
        # CRC-32 of the seed and the first word: a topic needs 32 bits, not a cryptographic hash
        topic_keys = np.fromiter((zlib.crc32((w[0].lower() if (w := t.split(None, 1)) else "").encode(
            "utf-8", "surrogatepass"), self.seed) for t in texts), dtype=np.uint64, count=n)
        return text_keys, topic_keys

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        """Unit vectors of ``texts``, shape (len(texts), dim), float32; row i depends on text i only."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        keys, topic_keys = self._keys(texts)
        topic = (topic_keys % np.uint64(self.topics)).astype(np.int64)
        sub = topic * SUBTOPICS + (keys >> np.uint64(61)).astype(np.int64)  # top 3 bits: 8 sub-topics
        coords = self._topic[topic] + self._sub[sub] + _uniform(keys, self.rank) * self._spectrum
        # float64 product: BLAS sums in an order that depends on the batch's shape; in float64 that
        # moves a row by ~1e-16, below float32's resolution, so the rounded row does not move
        x = (coords.astype(np.float64) @ self._basis).astype(np.float32)
        x += self._mean
        rows = (keys & np.uint64(0xFFFFFFFF)).astype(np.int64)
        x += self._noise[rows % NOISE_ROWS]
        x += self._noise[(rows >> 12) % NOISE_ROWS]
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        return x

    def embed(self, texts: Sequence[str], batch_size: int = 64, progress: bool | None = None) -> np.ndarray:
        """`embed_batch` over blocks of `BLOCK` texts, whatever ``batch_size`` (a row depends on its
        text alone, so length bucketing buys nothing here, and large blocks amortise numpy's per-call
        cost). ``progress`` is accepted for the interface and ignored: a block takes milliseconds."""
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if len(texts) <= BLOCK:
            return self.embed_batch(texts)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for s in range(0, len(texts), BLOCK):
            out[s: s + BLOCK] = self.embed_batch(texts[s: s + BLOCK])
        return out
