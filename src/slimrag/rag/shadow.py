"""A shadow of a remote backend's prefix cache, so the planner can order passages for it too.

vLLM, SGLang and llama.cpp keep their own prefix caches and show nothing of them but the
``cached_tokens`` they report after the fact. The pipeline therefore mirrors what it *sent*: a
simulated knowledge tree (:meth:`KVTree.simulated`: sizes only, no tensors) where each request's
system segment and passages, in prompt order, are inserted with an estimated token count
(``len(text) / 4``, close enough for English with BPE vocabularies). The planner walks it exactly
as it walks the embedded engine's tree, so passages the backend has already seen after the same
prefix go first, and the backend's cache hits on them.

The mirror is optimistic: it cannot see the backend evict. Its budget (``tokens``, default 256k,
the order of a 7B model's KV pool on one 24 GB GPU) and LRU eviction (what vLLM and SGLang use)
keep it from believing in much more than a backend holds; a wrong belief only costs the reordering,
never correctness, and the ranking stated after the passages keeps the relevance order known.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from slimrag.llm.kv.config import CacheConfig
from slimrag.llm.kv.payload import SegmentKV
from slimrag.llm.kv.tree import KVTree
from slimrag.prompt import CachedSegment, Prompt, root_key

#: Characters per token assumed for remote tokenizers.
CHARS_PER_TOKEN = 4


class ShadowCache:
    """What the pipeline believes a remote backend's prefix cache holds (a ``PlanningCache``)."""

    def __init__(self, tokens: int = 1 << 18, namespace: str = "remote") -> None:
        if tokens <= 0:
            raise ValueError(f"tokens must be positive, got {tokens}")
        self.tree = KVTree.simulated(CacheConfig(device="cpu", host_bytes=tokens, policy="lru"))
        self.namespace = namespace

    def root_key(self, prompt: Prompt) -> str:
        """The shadow tree's root for ``prompt``'s system segment."""
        return root_key(self.namespace, prompt.system_key())

    def walk(self, root_key: str, choose: Callable[[Mapping[str, CachedSegment]], str | None],
             ) -> tuple[list[str], int]:
        """The planner's walk over the shadow tree."""
        return self.tree.walk(root_key, choose)

    def record(self, prompt: Prompt) -> None:
        """Note that ``prompt`` was sent: its system segment and passages are now (believed) cached."""
        segments = prompt.segments()[:-1]
        root, path = self.root_key(prompt), [str(s.key) for s in segments[1:]]
        sizes = [SegmentKV.simulated(max(1, len(s.text) // CHARS_PER_TOKEN)) for s in segments]
        with self.tree.matching(root, path) as m:
            self.tree.insert(root, path, sizes[len(m.nodes):])
