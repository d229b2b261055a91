"""Every tunable of slimrag, as frozen dataclasses validated on construction.

CLI defaults are read from these classes so the two never drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field


STORAGES = ("flat", "slim", "auto")
SEARCH_MODES = ("vector", "keyword", "hybrid")
DTYPES = ("float32", "float16")
#: Tier names of the knowledge tree, top first.
DEVICE, HOST, DISK = "device", "host", "disk"


@dataclass(frozen=True, slots=True)
class IndexConfig:
    """How an index is built.

    chunk_tokens / chunk_overlap: chunk length and overlap in embedder tokens. 200 tokens keeps a
    passage inside MiniLM's 256-token window with room for the heading prefix; overlap 40 keeps a
    sentence cut at a boundary findable from either side.
    max_file_bytes: larger files are skipped with a warning (they are almost never prose).
    embed_batch: texts per embedder call; larger batches are faster until memory runs out.
    dtype: storage type of the flat matrix; float16 halves the bytes, changes scores by ~1e-3.
    ignore: extra gitignore-style patterns applied on top of any ``.gitignore``/``.slimragignore``.
    auto_slim_chunks: with ``storage="auto"``, a compaction writes a slim generation once the index
        holds at least this many live chunks, else a flat one. Flat search is always faster here
        (one matrix product, ~5 ms at 40k rows, against ~0.3-0.7 s for slim's recomputation), so
        slim pays off only in bytes: at 20,000 chunks flat float32 takes 31 MB, slim ~2 MB.
    """

    storage: str = "flat"
    chunk_tokens: int = 200
    chunk_overlap: int = 40
    max_file_bytes: int = 20 * 1024 * 1024
    embed_batch: int = 64
    dtype: str = "float32"
    ignore: tuple[str, ...] = ()
    auto_slim_chunks: int = 20_000

    def __post_init__(self) -> None:
        if self.storage not in STORAGES:
            raise ValueError(f"storage must be one of {STORAGES}, got {self.storage!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.chunk_tokens < 16:
            raise ValueError(f"chunk_tokens must be >= 16, got {self.chunk_tokens}")
        if not 0 <= self.chunk_overlap < self.chunk_tokens:
            raise ValueError("chunk_overlap must be >= 0 and smaller than chunk_tokens")
        if self.max_file_bytes <= 0 or self.embed_batch <= 0:
            raise ValueError("max_file_bytes and embed_batch must be positive")


@dataclass(frozen=True, slots=True)
class SearchConfig:
    """How a query is answered.

    mode: "vector" (embedding similarity), "keyword" (SQLite FTS5 BM25) or "hybrid" (both, fused
    by reciprocal rank fusion). rrf_k: the RRF constant; 60 is the value of the original paper and
    damps the influence of any single list's top ranks. candidates: how many hits each list
    contributes to fusion.
    """

    k: int = 5
    mode: str = "vector"
    rrf_k: int = 60
    candidates: int = 50

    def __post_init__(self) -> None:
        if self.k <= 0:
            raise ValueError(f"k must be positive, got {self.k}")
        if self.mode not in SEARCH_MODES:
            raise ValueError(f"mode must be one of {SEARCH_MODES}, got {self.mode!r}")
        if self.rrf_k <= 0 or self.candidates <= 0:
            raise ValueError("rrf_k and candidates must be positive")


@dataclass(frozen=True, slots=True)
class GenerationConfig:
    """Sampling settings. temperature 0 means greedy decoding, which is what makes outputs exact
    and comparable (cached versus uncached). stop: extra strings that end generation."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be positive, got {self.max_new_tokens}")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError("temperature must be >= 0 and top_p in (0, 1]")
