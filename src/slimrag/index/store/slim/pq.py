"""Product quantization (PQ): a few bytes per vector that still rank candidates well.

Algorithm
---------
A ``d``-dimensional vector is cut into ``m`` contiguous sub-vectors of ``d / m`` dimensions. For each
subspace, k-means (seeded, on a sample of at most ``train_size`` vectors) learns ``2**bits``
centroids; a vector is stored as the ``m`` indices of its nearest centroid in each subspace. With
``bits=8`` that is one ``uint8`` per subspace, so ``m`` bytes per vector; ``bits=4`` packs two codes
per byte (``m / 2`` bytes).

Scoring uses *asymmetric distance computation* (ADC): the query stays exact. For a query ``q`` we
build a lookup table ``lut[j, c] = q_j · centroid[j, c]`` once (one small matmul per query), and the
approximate inner product of ``q`` with any stored vector ``x`` is ``sum_j lut[j, code_j(x)]``: ``m``
table reads and adds, no float vectors touched. Vectors are unit-norm, so inner product is cosine.

Normalized ADC. k-means reconstructions are shrunk towards the centroids (``||x̂|| < 1``, more so
in sparse regions), so raw ``q·x̂`` underrates isolated vectors and ranks by norm as much as by
direction. ``x`` is unit-norm, so its best direction estimate is ``x̂ / ||x̂||``; scoring
``q·x̂ / ||x̂||`` costs one multiply per row (the norms come from the codes, see ``inverse_norms``;
nothing extra is stored). On 6,000 real MiniLM passage vectors (300 short queries, brute-force PQ
scan, exact rerank of the top 24, recall@10): m=48 0.929 -> 0.952, m=64 0.965 -> 0.979; the
0.999-quantile of the estimate's error on near neighbours drops from 0.12 to 0.07 (m=64).

Error bound. With ``r = x - x̂/||x̂||``, ``q·x`` differs from the estimate by ``q·r``, and
``|q·r| <= ||r||`` for a unit query (Cauchy-Schwarz): sound but ~5x too loose, since ``q·r`` acts
like a projection of ``r`` on a random direction. The searcher therefore uses an *empirical*
bound calibrated at build time (``search.calibrate_pq_error``); see ``search.py``.

Knobs (``PQConfig``)
--------------------
- ``m`` (default 0 = automatic, see below): subspaces; a code takes ``m`` bytes at 8 bits, ``m / 2``
  at 4; must divide the dimension. More subspaces rank better, so fewer exact recomputations reach
  the same recall. 6,000 real MiniLM vectors, 8 bits, recall@10 after reranking 16 / 24 / 32:
  m=32 0.81 / 0.89 / 0.94, m=48 0.89 / 0.95 / 0.97, m=64 0.94 / 0.98 / 0.99.
- ``bits`` (default 0 = automatic): 8 (uint8 codes) or 4 (two codes per byte). At equal code
  bytes 8 bits ranks better (6k set: m=64/8 bits 0.98 vs m=128/4 bits 0.96 at rerank 24; 43k
  pydocs: m=48/8 bits 0.966 vs m=96/4 bits 0.959, error bound 0.14 vs 0.18), but its codebooks are
  16x larger: 197 KB against 12 KB for d=384, i.e. 163 against 10 bytes per vector at 1,204 rows.
- **Automatic m and bits** (``PQConfig.resolve(n, d)``, called by ``train_pq``): 4 bits while the
  8-bit codebooks would cost more than ``AUTO_8BIT_CODEBOOK_BYTES`` = 6 bytes per vector
  (``512 d / n > 6``: below 32,768 rows for d=384), 8 bits from there on; m gives
  ``AUTO_CODE_BYTES`` = 48 bytes of code at either width (m=96 at 4 bits, m=48 at 8 for d=384;
  the largest divisor of d not above that, even at 4 bits). Explicit values win: ``bits`` alone
  gets the 48-byte m, ``m`` alone gets 8 bits (its meaning before the rule). Why these numbers,
  measured, and what the whole index then weighs: ``search.py``, knob ``pq``.
- ``rotate`` (default None = automatic) and ``rotate_rounds`` (default 8): learn an orthogonal
  rotation before quantizing (non-parametric OPQ, `train_rotation`). Sentence embeddings put most
  of their variance in a few dozen correlated directions spread over every subspace; the rotation
  lines them up with the subspaces, so the same bytes of code rank far better. The codes are the
  same size; the rotation is a fixed ``2 d^2`` bytes (float16, 295 KB for d=384) and each query
  pays one ``d x d`` product. Automatic: on once that costs at most ``AUTO_ROTATION_BYTES`` = 1
  byte per vector (n >= 294,912 for d=384): from 65,536 rows a generation's files take ~96-98 of
  the 100 bytes per vector the index allows, and below ~300k rows the fixed rerank floor already
  gives the default recall target with plain codes (100k synthetic: 0.958 at 20 rows, 0.993 with
  the rotation); at 1M the rotation is what keeps the rows under 48. Training
  costs ``rotate_rounds`` k-means-and-encode passes over the training sample (~15 s each at 16,384
  rows on a loaded 2-core machine); 4 rounds reach most of 8's gain. Measured figures:
  ``docs/benchmarks.md`` ("Slim recall target").
- ``train_size`` (default 16384): k-means sample, 64 points per centroid at 8 bits; more barely
  changes recall, and training time grows linearly (~5-10 s at the default on two cores).
- ``iters`` (default 12): Lloyd iterations per subspace; the codes barely move after ~10.
- ``seed`` (default 0): sampling and initialisation; same data and seed give the same codes.

Memory rule of thumb: codebooks are ``d * 2**bits`` float16 values (197 KB for d=384 at 8 bits,
12 KB at 4) whatever ``m`` is: a fixed cost; at 8 bits ~98 bytes per vector at 2,000 vectors, ~5 at
43,000, which is why the automatic rule waits for n before using 8 bits. Codes are
``n * m * bits / 8`` bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slimrag.index.store.slim._threads import single_thread_blas
from slimrag.index.store.slim.kmeans import subspace_kmeans
from slimrag.index.store.slim.rows import RowReader

CODEBOOKS_FILE = "pq_codebooks.npy"
CODES_FILE = "pq_codes.npy"
#: the learned rotation (``d x d`` float16), present only when the quantizer rotates
ROTATION_FILE = "pq_rotation.npy"
_ENCODE_BATCH = 8192


#: code bytes per vector the automatic rule aims at, at either width (m=96 at 4 bits, m=48 at 8)
AUTO_CODE_BYTES = 48
#: the automatic rule switches to 8 bits once the 8-bit codebooks (``2 * 256 * d`` bytes of fp16)
#: cost at most this many bytes per vector: from n = 32,768 for d=384
AUTO_8BIT_CODEBOOK_BYTES = 6
#: the automatic rule learns a rotation (OPQ) once its ``2 d^2`` bytes of float16 cost at most
#: this many bytes per vector: from n = 294,912 for d=384 (a generation uses ~96-98 of its 100 B
#: budget from 65,536 rows on, where edges take 4 bytes)
AUTO_ROTATION_BYTES = 1


@dataclass(frozen=True, slots=True)
class PQConfig:
    """Product quantizer settings; see the module header for each knob's trade-off. ``m=0`` and
    ``bits=0`` mean automatic: :meth:`resolve` fixes them from the number of vectors."""

    m: int = 0
    bits: int = 0
    train_size: int = 16384
    iters: int = 12
    seed: int = 0
    rotate: bool | None = None
    rotate_rounds: int = 8

    def __post_init__(self) -> None:
        if self.m < 0:
            raise ValueError(f"PQ m (subspaces) must be positive, or 0 for automatic, got {self.m}")
        if self.bits not in (0, 4, 8):
            raise ValueError(f"PQ bits must be 4 or 8, or 0 for automatic, got {self.bits}")
        if self.bits == 4 and self.m % 2:
            raise ValueError(f"PQ with bits=4 packs two codes per byte, so m must be even, got {self.m}")
        if self.train_size < 1 or self.iters < 1 or self.rotate_rounds < 1:
            raise ValueError("PQ train_size, iters and rotate_rounds must be >= 1")

    def resolve(self, n: int, dim: int) -> PQConfig:
        """The concrete settings for ``n`` vectors of dimension ``dim``; explicit values are kept.

        bits=0 and m=0: 4 bits while the 8-bit codebooks would cost more than
        ``AUTO_8BIT_CODEBOOK_BYTES`` per vector (``512 * dim / n``), 8 bits from there on; then m
        for ``AUTO_CODE_BYTES`` bytes of code. bits only: m for ``AUTO_CODE_BYTES``. m only:
        8 bits (what ``PQConfig(m=...)`` meant before the automatic rule). An automatic m is the
        largest divisor of ``dim`` (even at 4 bits) not above the target; automatic bits are 8 for
        an odd ``dim``, which no even m divides.
        """
        if self.m and self.bits:
            return self
        bits = self.bits or (8 if self.m or dim % 2 or 512 * dim <= AUTO_8BIT_CODEBOOK_BYTES * n else 4)
        m = self.m or _auto_m(dim, AUTO_CODE_BYTES * 8 // bits, even=bits == 4)
        return PQConfig(m=m, bits=bits, train_size=self.train_size, iters=self.iters, seed=self.seed,
                        rotate=self.rotate, rotate_rounds=self.rotate_rounds)

    def rotates(self, n: int, dim: int) -> bool:
        """Whether `train_pq` learns a rotation for ``n`` vectors of dimension ``dim``: ``rotate``
        when set, else once the rotation's ``2 dim^2`` bytes cost at most ``AUTO_ROTATION_BYTES``
        per vector."""
        if self.rotate is not None:
            return self.rotate
        return 2 * dim * dim <= AUTO_ROTATION_BYTES * n


def _auto_m(dim: int, target: int, even: bool) -> int:
    """Largest divisor of ``dim`` not above ``target`` (and even when asked); at least 1 (2)."""
    for m in range(min(target, dim), 0, -1):
        if dim % m == 0 and (m % 2 == 0 or not even):
            return m
    raise ValueError(f"no even PQ m divides dimension {dim}; set PQConfig(bits=8) for odd dimensions")


@dataclass(frozen=True, slots=True)
class ProductQuantizer:
    """Trained codebooks: ``codebooks[j, c]`` is centroid ``c`` of subspace ``j``, shape
    ``(m, 2**bits, d/m)`` float32. ``rotation`` (optional, (d, d) float32, orthogonal to float16
    rounding): vectors are quantized as ``x @ rotation.T`` and queries rotated the same way, so
    inner products are unchanged; every method takes and returns unrotated vectors. Stateless
    after training, so safe to share between threads."""

    codebooks: np.ndarray
    bits: int
    rotation: np.ndarray | None = None

    @property
    def m(self) -> int:
        """Number of subspaces."""
        return int(self.codebooks.shape[0])

    @property
    def dim(self) -> int:
        """Dimension of the vectors this quantizer encodes."""
        return int(self.codebooks.shape[0] * self.codebooks.shape[2])

    @property
    def code_bytes(self) -> int:
        """Bytes one encoded vector takes."""
        return self.m * self.bits // 8

    def encode(self, vectors: np.ndarray) -> np.ndarray:
        """Codes of ``vectors`` (n, d) as uint8, shape (n, code_bytes), computed in batches so
        the (batch, centroids) distance matrix stays small."""
        vectors = self._rotate(_as_matrix(vectors, self.dim))
        out = np.empty((vectors.shape[0], self.m), dtype=np.uint8)
        sq_norms = np.einsum("jcs,jcs->jc", self.codebooks, self.codebooks)
        with single_thread_blas():
            self._encode_into(vectors, sq_norms, out)
        return self._pack(out)

    def _encode_into(self, vectors: np.ndarray, sq_norms: np.ndarray, out: np.ndarray) -> None:
        sub = self.codebooks.shape[2]
        for start in range(0, len(vectors), _ENCODE_BATCH):
            block = vectors[start : start + _ENCODE_BATCH]
            for j in range(self.m):
                x = np.ascontiguousarray(block[:, j * sub : (j + 1) * sub])  # strided matmul skips BLAS
                # argmin ||x - c||^2 = argmin (||c||^2 - 2 x·c); ||x||^2 is constant per row.
                out[start : start + len(block), j] = np.argmin(
                    sq_norms[j][None, :] - 2.0 * (x @ self.codebooks[j].T), axis=1
                )

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """Reconstructions (n, d) float32 of stored codes; used for calibration and tests."""
        unpacked = self._unpack(codes)
        parts = [self.codebooks[j][unpacked[:, j]] for j in range(self.m)]
        rec = np.concatenate(parts, axis=1)
        return rec if self.rotation is None else rec @ self.rotation

    def directions(self, codes: np.ndarray) -> np.ndarray:
        """Unit-norm reconstructions ``x̂ / ||x̂||`` (n, d) float32 of stored codes: the vectors whose
        inner products normalized ADC estimates. Stand-ins for rows whose exact vector is unknown."""
        rec = self.decode(codes)
        rec /= np.maximum(np.linalg.norm(rec, axis=1, keepdims=True), 1e-12)
        return rec

    def direction_error(self, vectors: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """Per row, ``||x - x̂/||x̂|| ||^2 = 2 - 2 x·x̂/||x̂||`` for unit-norm ``x``: how far the
        direction the index scores with is from the true one. Its mean is the drift statistic of
        `slimrag.index.store.slim.update` (new rows against the build's rows)."""
        vectors = _as_matrix(vectors, self.dim)
        out = np.empty(len(vectors), dtype=np.float32)
        for start in range(0, len(vectors), _ENCODE_BATCH):
            sl = slice(start, start + _ENCODE_BATCH)
            out[sl] = 2.0 - 2.0 * np.einsum("ij,ij->i", vectors[sl], self.directions(codes[sl]))
        return out

    def lookup_tables(self, queries: np.ndarray) -> np.ndarray:
        """ADC tables for a batch of queries: (nq, m, 2**bits) float32, ``lut[i, j, c] =
        q_i[sub j] · codebooks[j, c]``, for the whole batch at once."""
        queries = self._rotate(_as_matrix(queries, self.dim))
        sub = self.codebooks.shape[2]
        out = np.empty((len(queries), self.m, self.codebooks.shape[1]), dtype=np.float32)
        # One 2-D product per subspace: numpy's batched einsum/matmul path does not use BLAS.
        for j in range(self.m):
            out[:, j, :] = queries[:, j * sub : (j + 1) * sub] @ self.codebooks[j].T
        return out

    def scorer(self, lut: np.ndarray, codes: np.ndarray, scale: np.ndarray | None = None) -> ADCScorer:
        """A scorer for one query's table (m, 2**bits) over a stored code matrix. Packed 4-bit
        codes are unpacked here, which copies them: callers scoring many queries pass
        :meth:`unpack`'s result instead. ``scale``: optional per-row factor, normally
        :meth:`inverse_norms`, which turns the estimate into the cosine with the reconstruction."""
        if codes.shape[1] != self.m:
            codes = self.unpack(codes)
        return ADCScorer(lut, codes, scale)

    def inverse_norms(self, codes: np.ndarray) -> np.ndarray:
        """``1 / ||x̂||`` for every row (float32), from the codes alone (a table of centroid norms
        gathered like an ADC score). Computed once per searcher; 4 bytes per row of memory.
        Accepts packed or already unpacked codes, like :meth:`scorer`."""
        sq = np.einsum("jcs,jcs->jc", self.codebooks, self.codebooks)
        unpacked = codes if codes.shape[1] == self.m else self.unpack(codes)
        out = np.empty(len(unpacked), dtype=np.float32)
        for start in range(0, len(unpacked), _ENCODE_BATCH):
            block = unpacked[start : start + _ENCODE_BATCH].astype(np.intp)
            norms2 = sq[np.arange(self.m)[None, :], block].sum(axis=1)
            out[start : start + len(block)] = 1.0 / np.sqrt(np.maximum(norms2, 1e-12))
        return out

    def unpack(self, codes: np.ndarray) -> np.ndarray:
        """One uint8 per subspace (a no-op for 8-bit codes)."""
        return self._unpack(codes)

    def _rotate(self, vectors: np.ndarray) -> np.ndarray:
        if self.rotation is None:
            return vectors
        return np.ascontiguousarray(vectors @ self.rotation.T, dtype=np.float32)

    def _pack(self, codes: np.ndarray) -> np.ndarray:
        if self.bits == 8:
            return codes
        return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)

    def _unpack(self, codes: np.ndarray) -> np.ndarray:
        if self.bits == 8:
            return np.asarray(codes)
        codes = np.asarray(codes)
        out = np.empty((codes.shape[0], self.m), dtype=np.uint8)
        out[:, 0::2] = codes & 0x0F
        out[:, 1::2] = codes >> 4
        return out


class ADCScorer:
    """Approximate inner products of one query with any stored rows, by table lookup.

    The table is flattened and each subspace's codes offset by ``j * 2**bits``, so scoring ``b``
    rows is one fancy-index gather of ``b * m`` floats and one row sum: no Python loop over
    subspaces. ``codes`` must be unpacked (one uint8 per subspace).
    """

    __slots__ = ("_flat", "_codes", "_offsets", "_scale")

    def __init__(self, lut: np.ndarray, codes: np.ndarray, scale: np.ndarray | None = None) -> None:
        m, k = lut.shape
        self._flat = np.ascontiguousarray(lut, dtype=np.float32).reshape(-1)
        self._codes = codes
        self._offsets = (np.arange(m, dtype=np.intp) * k)[None, :]
        self._scale = scale

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        """Approximate scores (len(rows),) float32 of the given row ids."""
        idx = self._codes[rows].astype(np.intp) + self._offsets
        out = self._flat[idx].sum(axis=1, dtype=np.float32)
        if self._scale is not None:
            out *= self._scale[rows]
        return out


def train_pq(vectors: np.ndarray, config: PQConfig | None = None) -> ProductQuantizer:
    """Learn codebooks with seeded k-means on a sample of ``vectors`` (n, d); automatic ``m`` /
    ``bits`` are resolved from (n, d) first (:meth:`PQConfig.resolve`), and a rotation is learned
    first when :meth:`PQConfig.rotates` says so (`train_rotation`).

    With fewer training vectors than ``2**bits`` centroids, k is reduced to the sample size and
    the remaining centroids are copies (codes still fit the declared bits). Raises ValueError when
    ``m`` does not divide ``d``.
    """
    vectors = _as_matrix(vectors, None)  # a float32 memmap stays one: np.asarray copies nothing
    n, d = vectors.shape
    if n == 0:
        raise ValueError("cannot train a product quantizer on zero vectors")
    config = (config or PQConfig()).resolve(n, d)
    if d % config.m:
        raise ValueError(f"PQ m={config.m} must divide the vector dimension {d}; try a divisor such as 32 or 48")
    rng = np.random.default_rng(config.seed)
    reader = RowReader(vectors)  # a plain gather of 16,384 rows spread over a large file maps all of it
    sample = reader.take(np.arange(n) if n <= config.train_size else _sample_rows(rng, n, config.train_size))
    reader.done()
    sample = np.ascontiguousarray(sample, dtype=np.float32)
    rotation = None
    if config.rotates(n, d):
        # Stored as float16: round now so codes and queries use exactly the loaded rotation.
        rotation = train_rotation(sample, config, rng).astype(np.float16).astype(np.float32)
        sample = np.ascontiguousarray(sample @ rotation.T)
    books = subspace_kmeans(sample, config.m, 2**config.bits, config.iters, rng)
    # Codebooks are stored as float16 (half the fixed bytes); round now so the codes are chosen
    # against exactly the centroids a loaded index will score with.
    return ProductQuantizer(books.astype(np.float16).astype(np.float32), config.bits, rotation)


def train_rotation(sample: np.ndarray, config: PQConfig, rng: np.random.Generator) -> np.ndarray:
    """An orthogonal (d, d) rotation ``R`` that lowers the quantization error of ``x @ R.T``:
    non-parametric OPQ (Ge et al., "Optimized Product Quantization", 2013), alternating
    ``rotate_rounds`` times between codebooks for the rotated sample (k-means, warm-started from
    the previous round's, 4 Lloyd steps after the first round's ``iters``) and the rotation that
    best maps the sample onto its reconstructions (orthogonal Procrustes: with
    ``U S V^T = svd(X^T Y)``, ``R = V U^T``). ``config`` must be resolved (m, bits set)."""
    d = sample.shape[1]
    k = 2**config.bits
    rotation = np.eye(d, dtype=np.float32)
    books = None
    for r in range(config.rotate_rounds):
        rotated = np.ascontiguousarray(sample @ rotation.T)
        books = subspace_kmeans(rotated, config.m, k, config.iters if r == 0 else 4, rng, books)
        pq = ProductQuantizer(books, 8)  # unpacked codes: one byte per subspace whatever the bits
        recon = pq.decode(pq.encode(rotated))
        u, _s, vt = np.linalg.svd(sample.T.astype(np.float64) @ recon.astype(np.float64))
        rotation = (vt.T @ u.T).astype(np.float32)
    return rotation


def _sample_rows(rng: np.random.Generator, n: int, size: int) -> np.ndarray:
    return np.sort(rng.choice(n, size, replace=False))


def training_rows(n: int, config: PQConfig) -> np.ndarray | None:
    """The rows `train_pq` trains on for ``n`` vectors and a resolved ``config`` (same seed, same
    draw), or None when it trains on all of them."""
    if n <= config.train_size:
        return None
    return _sample_rows(np.random.default_rng(config.seed), n, config.train_size)


def save_pq(folder: str | Path, pq: ProductQuantizer, codes: np.ndarray) -> None:
    """Write codebooks and codes as two .npy files into ``folder`` (which must exist), and the
    rotation as a third when the quantizer has one."""
    folder = Path(folder)
    np.save(folder / CODEBOOKS_FILE, pq.codebooks.astype(np.float16))
    np.save(folder / CODES_FILE, np.ascontiguousarray(codes, dtype=np.uint8))
    if pq.rotation is not None:
        np.save(folder / ROTATION_FILE, pq.rotation.astype(np.float16))


def load_pq(folder: str | Path, bits: int, mmap: bool = True) -> tuple[ProductQuantizer, np.ndarray]:
    """Read what :func:`save_pq` wrote. Codes are memory-mapped by default (read-only)."""
    folder = Path(folder)
    books = np.load(folder / CODEBOOKS_FILE)
    codes = np.load(folder / CODES_FILE, mmap_mode="r" if mmap else None)
    rotation = np.load(folder / ROTATION_FILE).astype(np.float32) if (folder / ROTATION_FILE).exists() else None
    return ProductQuantizer(books.astype(np.float32, copy=False), bits, rotation), codes


def _as_matrix(vectors: np.ndarray, dim: int | None) -> np.ndarray:
    arr = np.asarray(vectors, dtype=np.float32)
    if arr.ndim != 2 or (dim is not None and arr.shape[1] != dim):
        raise ValueError(f"expected a (n, {dim or 'd'}) matrix, got shape {arr.shape}")
    return arr
