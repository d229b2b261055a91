"""The request object of the embedded engine and the tree path it is filed under (issue 28, item 8).

A request travels as one :class:`Request` through prefill, decode and store; these check the parts
of that contract that hold without a model: the store happens once whatever calls it, the usage
reads the lease, and a prompt's tree path is one rule (``keys``), refusing what cannot be cached.
The generation path itself (tokens with and without the cache) is checked by ``test_warm.py``.
"""

from __future__ import annotations

import pytest
import torch

from slimrag.config import GenerationConfig
from slimrag.llm.engine.decoding import greedy
from slimrag.llm.engine.keys import cache_path, tree_path
from slimrag.llm.engine.request import Request
from slimrag.llm.kv.config import CacheConfig
from slimrag.llm.kv.reuse import Lease, TreeReuse
from slimrag.llm.kv.tree import KVTree
from slimrag.llm.model import KVCache
from slimrag.prompt import Passage, Prompt, root_key

LAYERS, HEADS, DIM = 2, 1, 4


def _cache(tokens: int) -> KVCache:
    gen = torch.Generator().manual_seed(tokens)
    layers = [(torch.randn(1, HEADS, tokens, DIM, generator=gen), torch.randn(1, HEADS, tokens, DIM, generator=gen))
              for _ in range(LAYERS)]
    return KVCache.seeded(layers, dtype=torch.float32, device="cpu")


def test_a_prompt_is_filed_under_its_namespaced_system_key_and_passage_keys() -> None:
    prompt = Prompt("Which stone?", (Passage("p0", "a.md#0", "Granite."), Passage("p1", "b.md#0", "Basalt.")))
    segments = prompt.segments()
    root, path = cache_path("m", segments)
    assert root == root_key("m", prompt.system_key())
    assert path == [str(s.key) for s in segments[1:-1]] and len(path) == 2
    assert tree_path("m", segments[:-1]) == (root, path)
    with pytest.raises(ValueError, match="cacheable"):
        tree_path("m", segments)  # the question segment has no key
    with pytest.raises(ValueError, match="cacheable"):
        tree_path("m", [])


def test_a_request_stores_its_computed_segments_once_and_reports_the_lease() -> None:
    tree = KVTree(CacheConfig(device="cpu", host_bytes=1 << 20))
    reuse = TreeReuse(tree, "cpu")
    seg_ids = [[1, 2, 3], [4, 5], [6]]  # system, one passage, the question
    request = Request(seg_ids, GenerationConfig(max_new_tokens=4), 4, greedy, "m|sys", ["p0"])
    with reuse.lease(request.root, request.path) as lease:
        request.lease, request.cache = lease, _cache(request.prompt_tokens)
    assert request.prompt_tokens == 6 and lease.segments == 0
    request.store()
    request.store()  # a second call (the stream's end after its first token) adds nothing
    stats = tree.stats()
    assert stats.nodes == 2 and stats.inserted_tokens == 5  # the question is never stored
    with reuse.lease(request.root, request.path) as again:
        assert (again.segments, again.tokens) == (2, 5)
        past = again.past()
        assert past is not None and torch.equal(past[0][0], request.cache.layers()[0][0][:, :, :5])
    usage = request.usage(3)
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens, usage.reuse) == (6, 3, 0, "exact")


def test_a_request_without_reuse_stores_nothing() -> None:
    request = Request([[1, 2], [3]], GenerationConfig(), 8, greedy)
    request.lease, request.cache = Lease(), _cache(3)
    request.store()
    assert request.usage(1).cached_tokens == 0 and (request.root, request.path) == ("", [])
