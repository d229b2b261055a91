"""Blend reuse (``CacheConfig(reuse="blend")``): passages placed from position-independent entries.

Ground truth: a generator without any cache. The limiting case (every placed token recomputed)
must give exactly its tokens, on SmolLM2 (Llama) and on a tiny random-weight Qwen2 built here;
re-rotating K by Δ must equal computing K Δ positions later. Recompute policies are checked on
spans without a model.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator

import pytest
from conftest import word_passages

from slimrag.config import GenerationConfig
from slimrag.llm import weights
from slimrag.llm.engine import runner
from slimrag.llm.kv.blend import BlendReuse, Rotary
from slimrag.llm.kv.config import REUSE_MODES, CacheConfig
from slimrag.llm.kv.payload import SegmentKV, cache_layers
from slimrag.llm.kv.recompute import Span, parse_recompute
from slimrag.llm.kv.strategies import REUSE_STRATEGIES
from slimrag.llm.kv.tree import KVTree
from slimrag.llm.local import LocalGenerator
from slimrag.llm.reference import greedy_ids
from slimrag.prompt import Prompt

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"


@pytest.fixture(scope="module")
def qwen2(smollm: weights.LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> weights.LoadedModel:
    """A tiny random-weight Qwen2 (a second RoPE architecture, with q/k/v biases), SmolLM2's
    tokenizer, built with transformers and loaded by the engine from its safetensors folder."""
    from reference_models import build_reference

    folder = tmp_path_factory.mktemp("qwen2")
    build_reference("qwen2", folder, smollm.tokenizer)
    return weights.load_model(folder, device="cpu")


# -- policies, without a model -------------------------------------------------------------------


def test_policies_pick_boundaries_top_deviations_and_their_union() -> None:
    spans = [Span(10, 5), Span(20, 3)]
    assert parse_recompute("boundary:2").select(spans, None) == {10, 11, 20, 21}
    assert parse_recompute("boundary:4").select(spans, None) == {10, 11, 12, 13, 20, 21, 22}
    scores = [0.0, 9.0, 0.0, 0.0, 1.0, 0.0, 8.0, 0.0]  # positions 10..14 then 20..22
    assert parse_recompute("deviation:0.25").select(spans, scores) == {11, 21}
    assert parse_recompute("boundary:1+deviation:0.25").select(spans, scores) == {10, 11, 20, 21}
    assert parse_recompute("all").select(spans, None) == set(range(10, 15)) | {20, 21, 22}
    # only a policy that recomputes every placed token keeps exact mode's schedule
    assert parse_recompute("all").exact and parse_recompute("boundary:2+all").exact
    assert not parse_recompute("boundary:2+deviation:0.25").exact and not parse_recompute("none").exact
    assert parse_recompute("none").select(spans, None) == set()
    assert parse_recompute("deviation:0.5").select([], None) == set()  # nothing placed: nothing to score
    assert parse_recompute("boundary:8+deviation:0.15").needs_deviation
    assert not parse_recompute("boundary:8").needs_deviation


@pytest.mark.parametrize("spec", ["boundary", "boundary:x", "deviation:1.5", "deviation:abc", "tail:3",
                                  "all:3", "boundary:2+"])
def test_bad_recompute_specs_are_refused_by_the_config(spec: str) -> None:
    with pytest.raises(ValueError, match="recompute policy"):
        CacheConfig(reuse="blend", recompute=spec)


def test_reuse_modes_match_the_strategy_registry() -> None:
    assert set(REUSE_MODES) == set(REUSE_STRATEGIES)
    with pytest.raises(ValueError, match="reuse must be one of"):
        CacheConfig(reuse="approximate")
    assert CacheConfig().reuse == "exact"


def test_entries_are_root_children_pinned_and_counted_as_hits() -> None:
    tree = KVTree.simulated(CacheConfig(host_bytes=10_000))
    tree.insert("sys", ["a"], [SegmentKV.simulated(10), SegmentKV.simulated(20)])
    tree.insert("sys", ["a", "b"], [SegmentKV.simulated(30)])  # b behind a: not an entry
    tree.insert("sys", ["c"], [SegmentKV.simulated(40)])
    match = tree.match("sys", ["x", "c", "b"])
    assert len(match.nodes) == 1 and tree.stats().misses == 3
    got = tree.entries("sys", ["x", "c", "b"])
    assert got.path == ("c",) and got.tokens == 40 and got.nodes[0].pins == 1
    assert tree.stats().hits == 2 and tree.stats().misses == 2
    tree.release(got)
    tree.release(match)
    assert all(n.pins == 0 for n in tree.nodes())
    tree.check()


# -- re-rotation -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm_float32(smollm: weights.LoadedModel) -> weights.LoadedModel:
    """SmolLM2 with float32 weights. The default computes on the GGUF's blocks with activations
    rounded to int8 per block, where a float difference in the last bits between two positions can
    flip a rounding step at a later layer; re-rotation is exact in float arithmetic, which is what
    the test below checks."""
    return weights.load_model(smollm.path, device="cpu", quantized=False)


@pytest.mark.parametrize("which", ["smollm_float32", "qwen2"])
def test_rerotated_keys_equal_keys_computed_later(which: str, request: pytest.FixtureRequest) -> None:
    """RoPE attention depends on relative positions only, so a sequence run from position Δ has
    the K of the same sequence run from 0, rotated by Δ, at every layer."""
    import torch

    loaded: weights.LoadedModel = request.getfixturevalue(which)
    gen = LocalGenerator(loaded=loaded, cache=None)
    ids = gen.encode_texts(["The river passes the old stone bridge near the harbour at night."])[0]
    rotary = Rotary(loaded.model)
    for delta in (57, 700):
        keys = []
        for start in (0, delta):
            cache = gen.runner.new_cache()
            gen.runner.forward(torch.tensor(ids), torch.arange(start, start + len(ids)), cache)
            keys.append([k for k, _ in cache_layers(cache)])
        for k0, kd in zip(*keys, strict=True):
            shifted = rotary.shift(k0, torch.full((len(ids),), delta))
            scale = kd.abs().max().item()
            assert torch.allclose(shifted, kd, atol=2e-5 * max(scale, 1.0), rtol=1e-4), f"Δ={delta}"


# -- the limiting case and usage --------------------------------------------------------------


@pytest.mark.parametrize("which", ["smollm", "qwen2"])
def test_blend_recomputing_every_placed_token_equals_exact(which: str, request: pytest.FixtureRequest) -> None:
    loaded: weights.LoadedModel = request.getfixturevalue(which)
    cold = LocalGenerator(loaded=loaded, cache=None)
    blend = LocalGenerator(loaded=loaded, cache=CacheConfig(reuse="blend", recompute="all"))
    rng = random.Random(11)
    passages = word_passages(rng, 5)
    for case in range(5):
        prompt = Prompt("Which word comes after river?", tuple(rng.sample(passages, 3)))
        want, _ = greedy_ids(cold, prompt, 5)
        got, _ = greedy_ids(blend, prompt, 5)
        assert got == want, f"case {case}"
    # The last prompt's passages all have entries now: the first is an exact match, the other
    # two are placed and (recompute="all") computed again.
    usage = blend.generate(prompt, GenerationConfig(max_new_tokens=1)).usage
    seg = blend.encode_segments(prompt)
    assert usage.reuse == "blend"
    assert usage.cached_tokens == len(seg[0]) + len(seg[1])
    assert usage.recomputed_tokens == len(seg[2]) + len(seg[3])
    blend.reuse.tree.check()  # type: ignore[attr-defined]


def test_blend_serves_passages_in_a_new_order_and_reports_usage(smollm: weights.LoadedModel) -> None:
    """Entries are depth-1 nodes: after one request, a permutation of its passages is served from
    the cache (exact mode serves only the system segment and the first passage of the same
    order), and ``boundary:k`` recomputes k tokens of every passage placed behind another."""
    rng = random.Random(4)
    a, b, c = word_passages(rng, 3)
    k = 3
    blend = LocalGenerator(loaded=smollm, cache=CacheConfig(reuse="blend", recompute=f"boundary:{k}"))
    cfg = GenerationConfig(max_new_tokens=2)
    first = blend.generate(Prompt("Which lamp?", (a, b, c)), cfg).usage
    assert (first.cached_tokens, first.recomputed_tokens, first.reuse) == (0, 0, "blend")
    again = Prompt("Which tree?", (c, a, b))
    seg = blend.encode_segments(again)
    usage = blend.generate(again, cfg).usage
    # c stands first after the system segment: exact tree match; a and b are placed, k each recomputed
    assert usage.recomputed_tokens == 2 * k
    assert usage.cached_tokens == sum(len(s) for s in seg[:-1]) - 2 * k
    tree = blend.reuse.tree  # type: ignore[attr-defined]
    assert isinstance(blend.reuse, BlendReuse)
    _, keys = blend.cache_path(again.segments())
    depth = {n.key: 1 + sum(1 for _ in _ancestors(n)) for n in tree.nodes()}
    assert sorted(depth.values()) == [1, 2, 2, 2] and set(keys) <= set(depth)  # root + entries, no deeper paths
    tree.check()


def _ancestors(node: object) -> Iterator[object]:
    """The nodes above ``node`` up to the root (the sentinel excluded)."""
    parent = node.parent  # type: ignore[attr-defined]
    while parent is not None and parent.parent is not None:
        yield parent
        parent = parent.parent


def test_unseen_passages_are_computed_once_before_the_first_token(smollm: weights.LoadedModel,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A passage without an entry is prefilled in context, not as an entry and then again: the
    prefill runs every prompt token through the model exactly once. Its entry is computed when the
    lease stores (after the first token), equal to a prefill of system + passage alone."""
    rng = random.Random(7)
    prompt = Prompt("Which stone?", tuple(word_passages(rng, 3)))
    gen = LocalGenerator(loaded=smollm, cache=CacheConfig(reuse="blend", recompute="boundary:4"))
    seg_ids = gen.encode_segments(prompt)
    root, path = gen.cache_path(prompt.segments())
    seen: list[int] = []
    forward = smollm.model.forward

    def counting(ids, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202  (the decoder's own forward, counted)
        seen.append(int(ids.shape[0]))
        return forward(ids, *args, **kwargs)

    monkeypatch.setattr(smollm.model, "forward", counting)
    one_pass = runner.prefill  # the engine's prefill of several segments in one forward, counted too

    def counting_pass(model, ids, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        seen.append(int(ids.shape[0]))
        return one_pass(model, ids, *args, **kwargs)

    monkeypatch.setattr(runner, "prefill", counting_pass)
    with gen.reuse.lease(root, path) as lease:
        cache, _ = lease.prefill(gen.runner, seg_ids)
    prefilled = sum(seen)
    added = lease.store(cache_layers(cache), [len(s) for s in seg_ids[:-1]])
    monkeypatch.undo()
    assert prefilled == sum(len(s) for s in seg_ids)  # each token once, before the first token
    assert added == 4 and sum(seen) == prefilled + sum(len(s) for s in seg_ids[1:-1])  # system + 3 entries
    entry = gen.reuse.tree.entries(root, path[2:])  # type: ignore[attr-defined]
    try:
        alone = gen.runner.new_cache()
        gen.runner.prefill_segments([seg_ids[0], seg_ids[3]], alone, 0)
        n = len(seg_ids[0])
        for (k, v), (ek, ev) in zip(cache_layers(alone), entry.nodes[0].kv.layers, strict=True):
            assert k[:, :, n:].equal(ek) and v[:, :, n:].equal(ev)
    finally:
        gen.reuse.tree.release(entry)  # type: ignore[attr-defined]
