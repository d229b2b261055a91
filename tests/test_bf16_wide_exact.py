"""The bfloat16 prefill's wide calls, end to end (:mod:`slimrag.llm.model.bf16`): a prompt over 512
tokens runs 512-row calls, and a segment's K/V are bitwise the same whether a pass computed it in
a 512-row call or in 128- and 64-row calls, so tokens with the cache equal tokens without it.

Ground truth: the same segments prefilled in one pass from nothing against on top of a cache that
a shorter pass seeded (the rows of the cached segments then ran in other call sizes and places),
and the tokens of a warm generator, whose passages' KV a shorter prompt computed, against a
generator with no cache. Each test first records the call sizes :func:`bf16.calls` gave the
products (the real function, wrapped) and fails unless a wide call ran on both sides. The real
SmolLM2 on the ``smollm`` fixture's thread count, the count its load checked the call sizes at.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import pytest
import torch
from conftest import WORDS, layers_equal

from slimrag.config import GenerationConfig
from slimrag.llm import weights
from slimrag.llm.engine import lifecycle
from slimrag.llm.engine.decoding import greedy
from slimrag.llm.local import LocalGenerator
from slimrag.llm.model import bf16
from slimrag.llm.model.prefill import BF16
from slimrag.prompt import Passage, Prompt


@pytest.fixture()
def wide(smollm: weights.LoadedModel) -> int:
    """The widest call size the load allowed any product at this thread count (skips where the
    model did not settle ``bf16``, or where no wide size checked out: the prefill then runs
    128-row calls, exact by construction, and there is nothing wide to test)."""
    model = smollm.model
    if model.settled_mode != BF16:
        pytest.skip(f"the model settled {model.settled_mode!r}, not the bf16 prefill")
    held = model.bf16_weights()[0]
    assert all(w.threads == torch.get_num_threads() for w in held), "checked at another thread count"
    if not any(w.wide for w in held):
        pytest.skip("no wide call size gives rows equal to 128-row calls on this CPU at this thread count")
    return max(w.wide for w in held)


@pytest.fixture()
def sizes_run(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The call sizes :func:`bf16.calls` returns from here on, in order (the real function runs)."""
    seen: list[int] = []
    real: Callable[[int, bf16.Copy], list[int]] = bf16.calls

    def recording(n: int, w: bf16.Copy) -> list[int]:
        out = real(n, w)
        seen.extend(out)
        return out

    monkeypatch.setattr(bf16, "calls", recording)
    yield seen


def _answer(gen: LocalGenerator, prompt: Prompt, new_tokens: int) -> tuple[list[int], int, torch.Tensor]:
    """:func:`slimrag.llm.reference.greedy_ids`'s tokens and cached count, with the prefill's last
    logits (bitwise: greedy tokens alone may survive a small difference in the K/V)."""
    request = gen.start(prompt, GenerationConfig(max_new_tokens=new_tokens), greedy)
    logits = request.logits.clone()
    return lifecycle.greedy(request, gen.decoding, gen.runner.eos), request.lease.tokens, logits


def test_a_segments_kv_is_the_same_in_a_wide_call_and_in_narrow_ones(
        smollm: weights.LoadedModel, wide: int, sizes_run: list[int]) -> None:
    """807 tokens in one pass (a wide call over rows 0..wide-1) against the same on top of the
    first 1 or 2 segments cached: with 2 cached (345 rows, 128-row calls) the rest runs in 128- and
    64-row calls, so rows 0..344 ran wide on one side only; with 1 (45 rows, one 64-row call) the
    other 762 rows start with a wide call at row 45, another alignment than the cold pass's."""
    runner = LocalGenerator(loaded=smollm, cache=None).runner
    assert runner.mode == BF16
    rng = random.Random(11)
    seg_ids = [[rng.randrange(100, 20000) for _ in range(n)] for n in (45, 300, 250, 200, 12)]
    cold = runner.new_cache()
    logits = runner.prefill_segments(seg_ids, cold, 0)
    assert wide in sizes_run, sizes_run
    for first in (1, 2):
        head = runner.new_cache()
        runner.prefill_segments(seg_ids[:first] + [[1]], head, 0)
        head.truncate(sum(len(s) for s in seg_ids[:first]))
        warm = runner.new_cache([(k.clone(), v.clone()) for k, v in head.layers()])
        del sizes_run[:]
        got = runner.prefill_segments(seg_ids, warm, first)
        assert (wide in sizes_run) == (first == 1), (first, sorted(set(sizes_run)))
        assert torch.equal(got, logits), first
        assert layers_equal(warm, cold), first


def test_cached_tokens_equal_uncached_when_the_pass_runs_wide_calls(
        smollm: weights.LoadedModel, wide: int, sizes_run: list[int]) -> None:
    """A warm generator asked first over one long passage, then over it and three more (the first
    passage's KV reused, the rest computed in a pass with a wide call), against no cache: the
    same tokens and bitwise the same last logits; the cold run's pass ran the first passage's rows in a wide call, the warm one's
    first ask in narrower ones."""
    rng = random.Random(2027)
    passages = [Passage(f"p{i}", f"notes/{i}.md#0", " ".join(rng.choice(WORDS) for _ in range(250)) + ".")
                for i in range(4)]
    warm = LocalGenerator(loaded=smollm)
    cold = LocalGenerator(loaded=smollm, cache=None)
    prompt = Prompt("Which word comes last?", tuple(passages))
    assert sum(len(s) for s in warm.encode_segments(prompt)) > 512 + 64
    _answer(warm, Prompt("Which word comes first?", passages[:1]), 2)
    assert wide not in sizes_run, sorted(set(sizes_run))
    del sizes_run[:]
    got, cached, got_logits = _answer(warm, prompt, 8)
    assert cached > 0 and wide in sizes_run, (cached, sorted(set(sizes_run)))
    del sizes_run[:]
    want, none, want_logits = _answer(cold, prompt, 8)
    assert none == 0 and wide in sizes_run
    assert got == want
    assert torch.equal(got_logits, want_logits)
