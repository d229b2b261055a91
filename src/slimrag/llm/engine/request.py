"""One generation request of the embedded engine, as one object from admission to its last token.

nano-vllm passes a ``Sequence`` between its scheduler, runner and block manager; :class:`Request`
is that object here. The generator builds it from a tokenized prompt (its segments' ids, the
tree path its cacheable segments are filed under, the sampling rule and the token budget); the
lifecycle (:mod:`slimrag.llm.engine.lifecycle`) fills in what the prefill produced (the model cache
holding the whole prompt, the last position's logits, the KV lease that ran it) and the time to
the first token; decode reads the cache, the logits and the sampling rule from it; the store
(:meth:`Request.store`, once) hands the segments this request computed to the lease; and the
final usage is read off it (:meth:`Request.usage`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from slimrag.config import GenerationConfig
from slimrag.llm.engine.decoding import Chooser
from slimrag.llm.kv.reuse import Lease
from slimrag.types import Usage

if TYPE_CHECKING:
    import torch

    from slimrag.llm.model import KVCache


@dataclass(eq=False, slots=True)
class Request:
    """One request (see the module header).

    seg_ids: token ids of each prompt segment, tokenized on its own, the question last. root,
    path: where its cacheable segments are filed in the knowledge tree (:mod:`slimrag.llm.engine.keys`;
    empty for a request that is not cached). config: what the caller asked for (stop strings).
    max_new: the token budget, already capped by the model's context. choose: picks each token
    from logits (one per request: a repetition penalty remembers its picks). t0: when the request
    started (``time.perf_counter``), the gate's wait included.

    Filled by the prefill: cache (the model cache, holding the whole prompt in position order),
    logits (the last prompt position's), lease (what the KV reuse served and computed; it ran the
    prefill). ttft_s: seconds from ``t0`` to the first token, set when it is chosen.
    """

    seg_ids: list[list[int]]
    config: GenerationConfig
    max_new: int
    choose: Chooser
    root: str = ""
    path: list[str] = field(default_factory=list)
    t0: float = field(default_factory=time.perf_counter)
    cache: KVCache = field(init=False)
    logits: torch.Tensor = field(init=False)
    lease: Lease = field(init=False)
    ttft_s: float = 0.0
    _stored: bool = field(default=False, init=False, repr=False)

    @property
    def prompt_tokens(self) -> int:
        """Tokens of the whole prompt (the joined segment ids)."""
        return sum(len(s) for s in self.seg_ids)

    def store(self) -> None:
        """Add the segments this request computed to the cache, through its lease (once; later
        calls do nothing). Call it before the model cache grows past the prompt, i.e. before the
        second token's forward. Needs no pins: ``KVTree.insert`` walks and pins the path itself
        and adds nothing when the prefix was evicted in between (a lost chance to cache, never a
        wrong KV)."""
        if not self._stored:
            self._stored = True
            self.lease.store(self.cache.layers(), [len(s) for s in self.seg_ids[:-1]])

    def usage(self, completion_tokens: int) -> Usage:
        """The request's usage now, ``completion_tokens`` produced (the EOS included)."""
        lease = self.lease
        return Usage(prompt_tokens=self.prompt_tokens, completion_tokens=completion_tokens,
                     cached_tokens=lease.tokens, ttft_s=self.ttft_s, total_s=time.perf_counter() - self.t0,
                     recomputed_tokens=lease.recomputed, reuse=lease.reuse)
