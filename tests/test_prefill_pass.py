"""One forward per prefill (issue 28, item 2): a prompt's uncached segments in one pass, each
segment's K/V bitwise those of a run that had the segments before it cached.

Ground truth: the same prompt prefilled from nothing against prefilled on top of a cache seeded
with its first segments, in every mode the engine may pick on this machine; and the tokens of
the one-pass engine against one forward per segment's own cached/uncached pair. The real
SmolLM2 on one torch thread (the shared ``smollm`` fixture).
"""

from __future__ import annotations

import random

import pytest
import torch
from conftest import layers_equal, word_passages

from slimrag.llm import weights
from slimrag.llm.local import LocalGenerator
from slimrag.llm.model.prefill import CHUNK, CHUNKS, SEGMENTS, prefill_mode
from slimrag.llm.reference import greedy_ids
from slimrag.prompt import Prompt


def test_every_mode_computes_a_segment_the_same_with_or_without_its_prefix_cached(
        smollm: weights.LoadedModel) -> None:
    gen = LocalGenerator(loaded=smollm, cache=None)
    rng = random.Random(3)
    seg_ids = [[rng.randrange(100, 20000) for _ in range(n)] for n in (45, CHUNK + 9, 7, 130, 12)]
    for mode in sorted({prefill_mode(smollm.model), CHUNKS, SEGMENTS}):
        gen.runner._mode = mode  # the engine's choice, forced so each mode is checked here
        cold = gen.runner.new_cache()
        logits = gen.runner.prefill_segments(seg_ids, cold, 0)
        for first in (1, 2, 4):
            head = gen.runner.new_cache()
            gen.runner.prefill_segments(seg_ids[:first] + [[1]], head, 0)
            head.truncate(sum(len(s) for s in seg_ids[:first]))
            warm = gen.runner.new_cache([(k.clone(), v.clone()) for k, v in head.layers()])
            assert torch.equal(gen.runner.prefill_segments(seg_ids, warm, first), logits), (mode, first)
            assert layers_equal(warm, cold), (mode, first)


def test_the_default_mode_is_one_pass_and_the_engine_stays_exact(smollm: weights.LoadedModel) -> None:
    gen = LocalGenerator(loaded=smollm)
    assert gen.runner.one_pass and gen.runner.mode != SEGMENTS
    rng = random.Random(5)
    prompt = Prompt("Which stone is it?", tuple(word_passages(rng, 4)))
    first, cached = greedy_ids(gen, prompt, 6)
    again, cached_again = greedy_ids(gen, prompt, 6)
    cold, _ = greedy_ids(LocalGenerator(loaded=smollm, cache=None), prompt, 6)
    assert cached == 0 and cached_again > 0 and first == again == cold


def test_a_pass_checks_its_spans(smollm: weights.LoadedModel) -> None:
    from slimrag.llm.model.prefill import prefill

    model = smollm.model
    with pytest.raises(ValueError, match="cover"):
        prefill(model, torch.tensor([1, 2, 3]), torch.arange(3), model.new_cache(), [2])
    with pytest.raises(ValueError, match="mode"):
        prefill(model, torch.tensor([1, 2]), torch.arange(2), model.new_cache(), [2], SEGMENTS)
