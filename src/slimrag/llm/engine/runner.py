"""The embedded engine's model runner: the loaded model behind one generator, and every call into it.

nano-vllm's ``ModelRunner`` owns the model and runs its forwards; :class:`ModelRunner` is that
part here, and it is what the KV lease calls back through (it implements
:class:`slimrag.llm.kv.reuse.PrefillEngine`). Its jobs:

- **Loading.** The model is loaded on first use (:meth:`ModelRunner.load`, idempotent, under the
  model lock), from a ``.gguf`` file or an HF folder (:func:`slimrag.llm.weights.load_model`), and
  its end-of-sequence ids and prefill mode are settled right after, off the first request's path.
- **Forwards under the model lock.** Every forward (prefill segments, decode one-token forwards,
  blend's masked forwards) runs holding :attr:`ModelRunner.lock`, the lock the decode batcher
  takes around a shared step, so prefills and decode steps interleave one forward at a time.
- **The prefill schedule.** :meth:`ModelRunner.prefill_segments` decides once, on the loaded
  model, how a prompt's uncached segments are prefilled: in one forward with attention per
  segment (:mod:`slimrag.llm.model.prefill`) where the model's products do not depend on the rows
  around a row, else one forward per segment. Either way a segment's K/V are bitwise those of any
  request that computed it after the same segments, which is what exact reuse
  (:mod:`slimrag.llm.kv.reuse`) rests on.
- **The key of its numbers.** :meth:`ModelRunner.namespace` states what those numbers depend on
  besides the tokens, which keys a persistent disk tier (:mod:`slimrag.llm.kv.persist`): a file
  another process wrote is used only where it holds what this process would compute.

The runner holds nothing of the generator that owns it (no way back), so a dropped generator
frees its model by reference counting alone (``tests/test_local_frees.py``).

Thread safety: every method may be called from any thread; loading and forwards run under
:attr:`ModelRunner.lock` (re-entrant).
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from slimrag.errors import RequestError
from slimrag.llm.engine.decoding import eos_ids
from slimrag.llm.kv.reuse import Layers
from slimrag.llm.model import Decoder, KVCache, bf16
from slimrag.llm.model.prefill import ROWS, SEGMENTS, prefill, prefill_mode
from slimrag.llm.weights import LoadedModel, load_model

#: How a prompt's K/V are computed, by whether the uncached segments go in one forward (part of
#: :meth:`ModelRunner.namespace`): change them when the prefill's arithmetic changes, so no
#: process reads K/V another schedule computed.
PREFILL_SCHEDULES = {"segments": "prefill=segment-forwards", "rows": "prefill=one-pass-rows-v1",
                     "chunks": "prefill=one-pass-chunks64-v1",
                     "bf16": f"prefill=one-pass-{bf16.SCHEDULE}"}


class ModelRunner:
    """The model of one generator (see the module header). model_path, device, dtype and
    bf16_prefill are :func:`slimrag.llm.weights.load_model`'s; ``loaded``: an already loaded
    model to use instead (lets several generators, or tests, share one copy)."""

    def __init__(self, model_path: str | Path | None = None, device: str | None = None, *,
                 dtype: torch.dtype | None = None, bf16_prefill: bool | None = None,
                 loaded: LoadedModel | None = None) -> None:
        self.model_path, self.device, self.dtype, self.bf16_prefill = model_path, device, dtype, bf16_prefill
        #: The model lock: loading and every forward (the decode batcher holds it around a step).
        self.lock = threading.RLock()
        self._loaded: LoadedModel | None = loaded
        self._eos: frozenset[int] = eos_ids(loaded) if loaded is not None else frozenset()
        self._mode: str | None = None

    # -- loading -------------------------------------------------------------------------------

    def load(self) -> LoadedModel:
        """Load the model now (idempotent) and return it; also settle the end-of-sequence ids and
        the prefill mode. Once loaded it returns without the lock, so a stream detokenizing a
        token never waits for another request's forward."""
        if self._loaded is not None:
            return self._loaded
        with self.lock:
            if self._loaded is None:
                loaded = load_model(self.model_path, device=self.device, dtype=self.dtype,
                                    bf16_prefill=self.bf16_prefill)
                self._eos = eos_ids(loaded)
                self._loaded = loaded
                _ = self.mode
            return self._loaded

    @property
    def eos(self) -> frozenset[int]:
        """The ids that end generation (:func:`slimrag.llm.engine.decoding.eos_ids`; empty until loaded)."""
        return self._eos

    def room(self, prompt_len: int, max_new: int, name: str) -> int:
        """``max_new`` capped by the model's context length; a `RequestError` naming model ``name``
        when the prompt alone fills it."""
        limit = self.model.config.max_positions
        if prompt_len >= limit:
            raise RequestError(
                f"The prompt has {prompt_len} tokens but {name} holds {limit}. "
                "Ask with fewer passages (smaller k) or build the index with smaller chunks."
            )
        return min(max_new, limit - prompt_len)

    # -- what the KV lease calls (kv.reuse.PrefillEngine) --------------------------------------

    @property
    def model(self) -> Decoder:
        """The loaded decoder (loaded now if it was not)."""
        return self.load().model

    def new_cache(self, past: Layers | None = None) -> KVCache:
        """A cache seeded with per-layer (K, V) (copied), or empty."""
        model = self.model
        return model.new_cache() if past is None else KVCache.seeded(past, dtype=model.dtype, device=model.device)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, cache: KVCache, *,
                mask: torch.Tensor | None = None, stop_after: int | None = None) -> torch.Tensor | None:
        """One :meth:`Decoder.forward` (last position's logits) under the lock and inference mode."""
        model = self.model
        with self.lock, torch.inference_mode():
            return model.forward(ids.to(model.device), positions.to(model.device), cache, mask=mask,
                                 stop_after=stop_after)

    def prefill_segments(self, seg_ids: list[list[int]], cache: KVCache, first: int) -> torch.Tensor:
        """Run segments ``seg_ids[first:]`` on top of ``cache`` (which must hold exactly the
        segments before ``first``), each segment's K/V exact; the logits of the last prompt
        position. The last segment (the question) must be non-empty, so there is always a forward."""
        if not 0 <= first < len(seg_ids) or not seg_ids[-1]:
            raise ValueError(f"cannot prefill from segment {first} of {len(seg_ids)} (last must be non-empty)")
        pos = sum(len(s) for s in seg_ids[:first])
        rest = [s for s in seg_ids[first:] if s]
        if self.one_pass:
            model = self.model
            ids = torch.tensor([t for s in rest for t in s], dtype=torch.long, device=model.device)
            positions = torch.arange(pos, pos + len(ids), device=model.device)
            with self.lock, torch.inference_mode():
                return prefill(model, ids, positions, cache, [len(s) for s in rest], self.mode)
        logits: torch.Tensor | None = None
        for ids_ in rest:
            logits = self.forward_ids(ids_, cache, pos)
            pos += len(ids_)
        assert logits is not None
        return logits

    # -- decode's forward ----------------------------------------------------------------------

    def forward_ids(self, ids: list[int], cache: KVCache, start_pos: int) -> torch.Tensor:
        """The forward of ``ids`` at ``start_pos`` on ``cache`` under the lock: the last
        position's logits (a decode step without batching is this with one token)."""
        device = self.model.device
        logits = self.forward(torch.tensor(ids, dtype=torch.long, device=device),
                              torch.arange(start_pos, start_pos + len(ids), device=device), cache)
        assert logits is not None
        return logits

    # -- the prefill schedule and the key of its numbers ---------------------------------------

    @property
    def mode(self) -> str:
        """How a prompt's uncached segments are prefilled: what the loader settled
        (``Decoder.settled_mode``), else checked once on the loaded model
        (:func:`slimrag.llm.model.prefill.prefill_mode`): ``bf16``, ``rows`` or ``chunks`` (one
        forward) or ``segments`` (one forward per segment)."""
        with self.lock:
            if self._mode is None:
                model = self.model
                self._mode = model.settled_mode or prefill_mode(model)
            return self._mode

    @property
    def one_pass(self) -> bool:
        """Whether a prompt's uncached segments are prefilled in one forward."""
        return self.mode != SEGMENTS

    def namespace(self, path: Path) -> str:
        """What the engine's K/V numbers depend on besides the tokens: the model file at ``path``
        (its fingerprint), dtype, device, how the products run, whether one-token forwards run the
        fused graph (:mod:`slimrag.llm.model.step`), the prefill schedule, library versions and, except for the quantized ``rows`` mode, the thread count (the CLI picks
        threads by the machine's load, so a key without them keeps hitting across runs)."""
        from slimrag.llm.kv.persist import file_fingerprint

        model = self.model
        qkv = model.layers[0].attn.qkv
        parts = [file_fingerprint(path), str(model.dtype), str(model.device),
                 type(qkv).__module__ + "." + type(qkv).__name__, f"dense_rows={getattr(model, 'dense_rows', None)}",
                 PREFILL_SCHEDULES[self.mode], f"torch {torch.__version__}"]
        if self.mode != ROWS:  # MKL may sum a row differently with another thread count; MLAS's
            parts.append(f"threads {torch.get_num_threads()}")  # rows were the same at 1 and 2 (checked)
        if getattr(model, "fused_step", False):  # a one-token segment (segments mode) runs the fused graph
            from slimrag.llm.model.saved_step import VERSION as STEP_VERSION

            parts.append(f"step=fused-v{STEP_VERSION}")  # the graph's own version: a changed graph misses once
        if not isinstance(qkv, torch.Tensor):
            from importlib.metadata import version

            parts.append(f"onnxruntime {version('onnxruntime')}")
        return "|".join(parts)
