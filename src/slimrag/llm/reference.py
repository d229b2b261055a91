"""Greedy references of the embedded generator, for the exactness tests and the benchmarks.

Not part of the serving path: :func:`greedy_ids` runs a prompt through the same warm path as
:meth:`LocalGenerator.stream` (cached prefix reused, computed segments stored) and returns token
ids instead of text, which is what the cached-equals-uncached tests compare; :func:`generate_ids`
is a whole-prompt forward with no reuse at all, the reference against ``model.generate`` and
what ``bench/engine.py`` times against llama.cpp.
"""

from __future__ import annotations

from slimrag.config import GenerationConfig
from slimrag.llm.engine import lifecycle
from slimrag.llm.engine.decoding import greedy
from slimrag.llm.engine.request import Request
from slimrag.llm.kv.reuse import Lease
from slimrag.llm.local import LocalGenerator
from slimrag.prompt import Prompt


def greedy_ids(gen: LocalGenerator, prompt: Prompt, max_new_tokens: int = 64) -> tuple[list[int], int]:
    """Greedy token ids for ``prompt`` through ``gen``'s warm path (cache reused and extended, as
    :meth:`LocalGenerator.stream` does), ending with the EOS id when one ended generation, and the
    number of prompt tokens served from the cache."""
    if max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be positive, got {max_new_tokens}")
    request = gen.start(prompt, GenerationConfig(max_new_tokens=max_new_tokens), greedy)
    return lifecycle.greedy(request, gen.decoding, gen.runner.eos), request.lease.tokens


def generate_ids(gen: LocalGenerator, prompt_ids: list[int], max_new_tokens: int = 64) -> list[int]:
    """Greedy continuation of ``prompt_ids`` with one whole-prompt forward and no KV reuse: the
    generated ids, ending with the EOS id when one ended generation (as ``model.generate``
    returns them)."""
    if max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be positive, got {max_new_tokens}")
    runner = gen.runner
    runner.load()
    max_new = runner.room(len(prompt_ids), max_new_tokens, gen.name)
    request = Request([list(prompt_ids)], GenerationConfig(max_new_tokens=max_new), max_new, greedy)
    request.lease = Lease()  # nothing served, nothing stored
    request.cache = runner.new_cache()
    request.logits = runner.forward_ids(list(prompt_ids), request.cache, 0)
    return lifecycle.greedy(request, gen.decoding, runner.eos)
