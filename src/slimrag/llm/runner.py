"""The embedded engine's prefill runner: a prompt's uncached segments through the model, and the key of its numbers.

:class:`PrefillRunner` decides once, on the loaded model, how a prompt's uncached segments are
prefilled: in one forward with attention per segment (:mod:`slimrag.llm.engine.prefill`) where
the model's products do not depend on the rows around a row, else one forward per segment.
Either way a segment's K/V are bitwise those of any request that computed it after the same
segments, which is what exact reuse (:mod:`slimrag.llm.kv.reuse`) rests on.

It also states what those numbers depend on besides the tokens (:meth:`PrefillRunner.namespace`),
which keys a persistent disk tier (:mod:`slimrag.llm.kv.persist`): a file another process wrote
is used only where it holds what this process would compute.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import torch

from slimrag.llm.engine import Decoder, KVCache, bf16
from slimrag.llm.engine.prefill import ROWS, SEGMENTS, prefill, prefill_mode

#: How a prompt's K/V are computed, by whether the uncached segments go in one forward (part of
#: :meth:`PrefillRunner.namespace`): change them when the prefill's arithmetic changes, so no
#: process reads K/V another schedule computed.
PREFILL_SCHEDULES = {"segments": "prefill=segment-forwards", "rows": "prefill=one-pass-rows-v1",
                     "chunks": "prefill=one-pass-chunks64-v1",
                     "bf16": f"prefill=one-pass-bf16-chunks{bf16.CHUNK}-v1"}

#: The generator's one forward of ``ids`` at ``start_pos`` on ``cache`` under its model lock:
#: the last position's logits.
ForwardFn = Callable[[list[int], KVCache, int], torch.Tensor]


class PrefillRunner:
    """Prefills for one generator: ``model`` returns the loaded decoder, ``lock`` is the model
    lock, ``forward`` the generator's one forward (used one segment at a time where one pass is
    not exact). Thread-safe: the one-pass decision is taken once under ``lock``."""

    def __init__(self, model: Callable[[], Decoder], lock: threading.RLock, forward: ForwardFn) -> None:
        self._model, self._lock, self._forward = model, lock, forward
        self._mode: str | None = None

    @property
    def mode(self) -> str:
        """How a prompt's uncached segments are prefilled: what the loader settled
        (``Decoder.settled_mode``), else checked once on the loaded model
        (:func:`slimrag.llm.engine.prefill.prefill_mode`): ``bf16``, ``rows`` or ``chunks`` (one
        forward) or ``segments`` (one forward per segment)."""
        with self._lock:
            if self._mode is None:
                model = self._model()
                self._mode = model.settled_mode or prefill_mode(model)
            return self._mode

    @property
    def one_pass(self) -> bool:
        """Whether a prompt's uncached segments are prefilled in one forward."""
        return self.mode != SEGMENTS

    def segments(self, seg_ids: list[list[int]], cache: KVCache, first: int) -> torch.Tensor:
        """Run segments ``seg_ids[first:]`` on top of ``cache`` (which must hold exactly the
        segments before ``first``); the logits of the last prompt position. The last segment (the
        question) must be non-empty, so there is always a forward."""
        if not 0 <= first < len(seg_ids) or not seg_ids[-1]:
            raise ValueError(f"cannot prefill from segment {first} of {len(seg_ids)} (last must be non-empty)")
        pos = sum(len(s) for s in seg_ids[:first])
        rest = [s for s in seg_ids[first:] if s]
        if self.one_pass:
            model = self._model()
            ids = torch.tensor([t for s in rest for t in s], dtype=torch.long, device=model.device)
            positions = torch.arange(pos, pos + len(ids), device=model.device)
            with self._lock, torch.inference_mode():
                return prefill(model, ids, positions, cache, [len(s) for s in rest], self.mode)
        logits: torch.Tensor | None = None
        for ids_ in rest:
            logits = self._forward(ids_, cache, pos)
            pos += len(ids_)
        assert logits is not None
        return logits

    def namespace(self, path: Path) -> str:
        """What the engine's K/V numbers depend on besides the tokens: the model file at ``path``
        (its fingerprint), dtype, device, how the products run, whether one-token forwards run the
        fused graph (:mod:`slimrag.llm.engine.step`), the prefill schedule, library versions and, except for the quantized ``rows`` mode, the thread count (the CLI picks
        threads by the machine's load, so a key without them keeps hitting across runs)."""
        from slimrag.llm.kv.persist import file_fingerprint

        model = self._model()
        qkv = model.layers[0].attn.qkv
        parts = [file_fingerprint(path), str(model.dtype), str(model.device),
                 type(qkv).__module__ + "." + type(qkv).__name__, f"dense_rows={getattr(model, 'dense_rows', None)}",
                 PREFILL_SCHEDULES[self.mode], f"torch {torch.__version__}"]
        if self.mode != ROWS:  # MKL may sum a row differently with another thread count; MLAS's
            parts.append(f"threads {torch.get_num_threads()}")  # rows were the same at 1 and 2 (checked)
        if getattr(model, "fused_step", False):  # a one-token segment (segments mode) runs the fused graph
            from slimrag.llm.engine.saved_step import VERSION as STEP_VERSION

            parts.append(f"step=fused-v{STEP_VERSION}")  # the graph's own version: a changed graph misses once
        if not isinstance(qkv, torch.Tensor):
            from importlib.metadata import version

            parts.append(f"onnxruntime {version('onnxruntime')}")
        return "|".join(parts)
