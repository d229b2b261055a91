"""Every tunable of slimrag, as frozen dataclasses validated on construction.

CLI defaults are read from these classes so the two never drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

STORAGES = ("flat", "slim", "auto")
SEARCH_MODES = ("vector", "keyword", "hybrid")
DTYPES = ("float32", "float16")
#: `IndexConfig.chunk_tokens`' default: MiniLM's 256-token window less room for a heading
DEFAULT_CHUNK_TOKENS = 200


@dataclass(frozen=True, slots=True)
class IndexConfig:
    """How an index is built.

    chunk_tokens / chunk_overlap: chunk length and overlap in embedder tokens. 200 tokens keeps a
    passage inside MiniLM's 256-token window with room for the heading prefix; overlap 40 keeps a
    sentence cut at a boundary findable from either side. A longer chunk is allowed (it is stored
    whole and keyword search reads all of it) but its vector sees only the embedder's window, so
    creating an index warns when ``chunk_tokens`` is over it (`window_warning`); there is no
    upper bound, because a remote embedder's window may be far larger and is not known here.
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
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
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

    def window_warning(self, model_id: str, max_tokens: int | None) -> str | None:
        """The one-line warning for chunks longer than the embedder reads of a text
        (``max_tokens``, its input window; None when unknown, as for a remote embedder: no
        warning), else None."""
        if max_tokens is None or self.chunk_tokens <= max_tokens:
            return None
        return (f"chunk_tokens {self.chunk_tokens} is over the {max_tokens}-token input window of the embedder "
                f"{model_id}: only the first {max_tokens} tokens of each chunk (its heading included) reach vector "
                f"search, the rest is found by keyword search alone; use --chunk-tokens {max_tokens} or less "
                f"(the default {DEFAULT_CHUNK_TOKENS} leaves room for headings)")


@dataclass(frozen=True, slots=True)
class RayIngestConfig:
    """How `slimrag.index.distributed.ray_ingest` spreads parsing and embedding over Ray.

    num_embed_actors: size of the embedding actor pool; each actor reserves ``embed_cpus`` CPUs
        (and ``embed_gpus`` GPUs) and holds one copy of the embedder (~90 MB of weights for
        MiniLM). Parsing runs as plain Ray tasks on the CPUs the actors leave free, so the pool
        must leave at least one (else Ray would wait forever; `ray_ingest` refuses). None: half the
        cluster's CPUs (at least 1), or one actor per ``embed_gpus`` of its GPUs when that is set.
        More actors embed faster and parse slower; PDF-heavy folders want more CPUs left to parsing.
    batch_size: chunks per embedder call inside an actor; None takes the index's
        ``IndexConfig.embed_batch`` (64). Larger batches amortize per-call overhead until memory runs out.
    embed_cpus / embed_gpus: Ray resources each actor reserves; ``embed_gpus=1`` puts an actor on a
        GPU and the embedder runs there.
    num_cpus: CPUs of the local Ray started when no address is given (None: all of this machine's).
    """

    num_embed_actors: int | None = None
    batch_size: int | None = None
    embed_cpus: float = 1.0
    embed_gpus: float = 0.0
    num_cpus: int | None = None

    def __post_init__(self) -> None:
        if self.num_embed_actors is not None and self.num_embed_actors < 1:
            raise ValueError(f"num_embed_actors must be >= 1, got {self.num_embed_actors}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.embed_cpus <= 0 or self.embed_gpus < 0:
            raise ValueError("embed_cpus must be > 0 and embed_gpus >= 0")
        if self.num_cpus is not None and self.num_cpus < 2:
            raise ValueError(f"num_cpus must be >= 2 (one to embed, one to parse), got {self.num_cpus}")

    def actors(self, cluster_cpus: float, cluster_gpus: float = 0.0) -> int:
        """The pool size on a cluster with these resources; ValueError when it leaves no CPU to parse."""
        n = self.num_embed_actors
        if n is None:
            n = int(cluster_gpus // self.embed_gpus) if self.embed_gpus else int(cluster_cpus / 2 // self.embed_cpus)
            n = max(1, n)
        if cluster_cpus < 1 + self.embed_cpus:
            raise ValueError(f"the Ray cluster has {cluster_cpus:g} CPUs; distributed ingest needs at least "
                             f"{1 + self.embed_cpus:g} (one to parse, {self.embed_cpus:g} per embedding actor)")
        if n * self.embed_cpus > cluster_cpus - 1:
            raise ValueError(
                f"{n} embedding actors of {self.embed_cpus:g} CPU leave no CPU of the cluster's {cluster_cpus:g} "
                f"for parsing, so the pipeline would never start; use num_embed_actors <= "
                f"{max(1, int((cluster_cpus - 1) // self.embed_cpus))} or a bigger cluster")
        if n * self.embed_gpus > cluster_gpus:
            raise ValueError(f"{n} embedding actors of {self.embed_gpus:g} GPU need {n * self.embed_gpus:g} GPUs; "
                             f"the Ray cluster has {cluster_gpus:g}, so they would wait forever")
        return n


#: How an answer is made (`slimrag.rag.grounded`): ``"free"``, the model writes it over the passages;
#: ``"grounded"``, the passages' best sentences first and the model's one short sentence after them.
#: Each generator names its default (`Generator.default_answer_mode`); ``--answer`` overrides it.
ANSWER_MODES = ("free", "grounded")


@dataclass(frozen=True, slots=True)
class SearchConfig:
    """How a query is answered; every field may change from one query to the next.

    mode ("hybrid"): "vector" (embedding similarity), "keyword" (BM25, FTS5's scores) or "hybrid"
    (both, fused by `slimrag.index.fusion.fuse`: convex fusion of the normalised scores with the
    keyword margin rule). Hybrid is the default because it found the gold passage in the top 5
    most often on real questions (`bench.retrieval` and `bench.fusion`, docs/benchmarks.md), and
    keyword alone misses paraphrases.
    This one field is the default of `Index.search`, `RAG`, ``slimrag search`` and the HTTP
    ``/v1/search``. Its cost: a hybrid query runs both searches (the vector one dominates).
    rrf_k: the constant of reciprocal rank fusion, read only by the RRF strategies that
    `bench.fusion` compares (`slimrag.index.fusion.FUSIONS`); the default fusion ignores it.
    candidates: how many hits each list contributes to fusion.

    The slim index's walk and rerank (ignored by flat storage, which is exact; trade-offs measured
    in the header of `slimrag.index.store.slim`):
    ef (128): beam width of the graph walk, the pool rerank draws from; must be >= rerank.
    rerank (20): positions eligible for exact rerank (recomputed embeddings): the latency knob;
    20 is the smallest with recall@10 >= 0.95 on the 3,000-passage pydocs set (frontier measured
    in the header of `slimrag.index.store.slim`).
    wave (4): positions recomputed per extra rerank wave.
    early_stop (True): stop reranking once the next row's PQ bound cannot reach the top-k; False
    reranks exactly ``max(rerank, k)`` rows.
    recall (0.96): the slim index's recall@10 target (0.96 so that 0.95 holds on held-out queries
    with room: measured 0.960 at 100k, 0.969 at 1M, 0.961-0.963 on real MiniLM corpora,
    docs/benchmarks.md "Slim recall target"). Generations built with the stop calibration
    (`slimrag.index.store.slim.build.calibrate_stop`) rerank as deep into the ``ef`` pool as the
    calibrated PQ-score margin for this target says, so the rows recomputed adapt to the index's
    size and to each query's score gaps instead of the fixed ``rerank``; 0 (or
    ``early_stop=False``, or an older generation) keeps the fixed depth. Frontier measured in
    docs/benchmarks.md ("Slim recall target"); the rule in the header of
    `slimrag.index.store.slim.searcher`.
    """

    k: int = 5
    mode: str = "hybrid"
    rrf_k: int = 60
    candidates: int = 50
    ef: int = 128
    rerank: int = 20
    wave: int = 4
    early_stop: bool = True
    recall: float = 0.96

    def __post_init__(self) -> None:
        if not 0.0 <= self.recall < 1.0:
            raise ValueError(f"recall must be in [0, 1) (0 = fixed rerank depth), got {self.recall}")
        if self.k <= 0:
            raise ValueError(f"k must be positive, got {self.k}")
        if self.mode not in SEARCH_MODES:
            raise ValueError(f"mode must be one of {SEARCH_MODES}, got {self.mode!r}")
        if self.rrf_k <= 0 or self.candidates <= 0:
            raise ValueError("rrf_k and candidates must be positive")
        if self.rerank < 1 or self.wave < 1:
            raise ValueError(f"rerank and wave must be >= 1, got rerank={self.rerank}, wave={self.wave}")
        if self.ef < self.rerank:
            raise ValueError(f"ef ({self.ef}) must be >= rerank ({self.rerank}): rerank draws from the beam")


@dataclass(frozen=True, slots=True)
class GenerationConfig:
    """Sampling settings. temperature 0 means greedy decoding, which is what makes outputs exact
    and comparable (cached versus uncached). stop: extra strings that end generation.
    repetition_penalty: > 1 lowers the scores of tokens this answer has already generated (CTRL's
    rule: positive logits divided by it, negative ones multiplied), which stops small models
    looping; prompt tokens are not penalized, so quoting a passage stays cheap. 1.0 turns it off.
    It is deterministic, so cached and uncached runs still agree token for token.
    copy_from: texts the answer must copy its words from, besides connecting words
    (`slimrag.llm.engine.copying`; the grounded mode passes its evidence sentences and the
    question); honoured by a generator whose ``copies`` is True, ignored by others; empty: free.
    copy_spans (1): how many spans of those texts it may copy, connecting words between them free;
    0: any number (measured: any number lets a small model join spans into claims no text makes;
    one keeps its sentence a passage's words, docs/benchmarks.md "Copy-constrained decoding")."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = field(default_factory=tuple)
    repetition_penalty: float = 1.0
    copy_from: tuple[str, ...] = field(default_factory=tuple)
    copy_spans: int = 1

    def __post_init__(self) -> None:
        if self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be positive, got {self.max_new_tokens}")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError("temperature must be >= 0 and top_p in (0, 1]")
        if self.repetition_penalty < 1.0:
            raise ValueError(f"repetition_penalty must be >= 1 (1 = off), got {self.repetition_penalty}")
        if not isinstance(self.copy_from, tuple) or not all(isinstance(t, str) for t in self.copy_from):
            raise ValueError("copy_from must be a tuple of strings")
        if self.copy_spans < 0:
            raise ValueError(f"copy_spans must be >= 0 (0 = any number), got {self.copy_spans}")
