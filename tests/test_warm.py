"""Warm generation with the real SmolLM2 model: cached KV gives the same tokens as no cache.

Ground truth is a generator with no KV reuse (``cache=None``), which prefills every prompt from
scratch with the same segment-wise schedule. The warm generator shares the loaded model and
keeps a knowledge tree. Passages are short and generations ≤ 8 tokens: two CPU cores.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import WORDS, word_passages

from slimrag.config import GenerationConfig
from slimrag.llm import weights
from slimrag.llm.base import Delta
from slimrag.llm.kv.config import CacheConfig
from slimrag.llm.local import LocalGenerator
from slimrag.llm.reference import greedy_ids
from slimrag.prompt import Prompt
from slimrag.rag.plan import plan_prompt

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

NEW_TOKENS = 8


@pytest.fixture()
def cold(smollm: weights.LoadedModel) -> LocalGenerator:
    return LocalGenerator(loaded=smollm, cache=None)




def test_cached_tokens_equal_uncached_over_random_passage_sets(smollm: weights.LoadedModel,
                                                                cold: LocalGenerator) -> None:
    rng = random.Random(1234)
    passages = word_passages(rng)
    warm = LocalGenerator(loaded=smollm)
    served = 0
    for case in range(8):
        chosen = tuple(rng.sample(passages, rng.randint(1, 4)))
        if case % 3 == 2:  # a permutation of an earlier set: the tree must not serve its KV out of order
            chosen = tuple(rng.sample(chosen, len(chosen)))
        prompt = Prompt(f"Which word comes after {rng.choice(WORDS)}?", chosen)
        got, cached = greedy_ids(warm, prompt, NEW_TOKENS)
        want, none = greedy_ids(cold, prompt, NEW_TOKENS)
        assert got == want, f"case {case}: cached {cached} tokens changed the output"
        assert none == 0
        served += cached
        again, cached_again = greedy_ids(warm, prompt, NEW_TOKENS)  # the whole passage path is cached now
        assert again == want
        assert cached_again == sum(len(s) for s in warm.encode_segments(prompt)[:-1])
    assert served > 0
    stats = warm.cache_stats()
    assert stats is not None and stats.served_tokens > 0
    warm.reuse.tree.check()  # type: ignore[attr-defined]


def test_exact_through_eviction_and_the_disk_tier(smollm: weights.LoadedModel, cold: LocalGenerator,
                                                   tmp_path: Path) -> None:
    """A host budget of a few segments: nodes are demoted to disk and promoted back, output unchanged."""
    rng = random.Random(7)
    passages = word_passages(rng, 6)
    budget = 46_080 * 130  # SmolLM2-135M KV in float32: the system segment (~45 tokens) + ~4 passages
    warm = LocalGenerator(loaded=smollm, cache=CacheConfig(host_bytes=budget, disk_bytes=50 * budget,
                                                          disk_dir=str(tmp_path)))
    prompts = [Prompt("Which colour is named?", tuple(rng.sample(passages, 2))) for _ in range(6)]
    for prompt in prompts + prompts:
        got, _ = greedy_ids(warm, prompt, 4)
        assert got == greedy_ids(cold, prompt, 4)[0]
    stats = warm.cache_stats()
    assert stats is not None
    host, disk = stats.tiers
    assert host.peak <= host.budget and disk.peak <= disk.budget
    assert stats.demotions > 0 and stats.promotions > 0
    warm.reuse.tree.check()  # type: ignore[attr-defined]
    warm.close()
    assert not any(tmp_path.rglob("*.pt")), "close() must delete the disk tier's files"


def test_stream_reports_cached_tokens_and_the_planner_puts_them_first(smollm: weights.LoadedModel) -> None:
    rng = random.Random(3)
    a, b, c, d = word_passages(rng, 4)
    warm = LocalGenerator(loaded=smollm)
    cfg = GenerationConfig(max_new_tokens=2)
    first, plan = plan_prompt("Which tree?", [a, b, c], warm.planning_cache())
    assert [p.key for p in first.passages] == ["p0", "p1", "p2"] and plan.cached == 0
    assert warm.generate(first, cfg).usage.cached_tokens == 0
    # New relevance order (d, b, a): the cached path a → b goes first, d after, ranking stated.
    second, plan = plan_prompt("Which lamp?", [d, b, a], warm.planning_cache())
    assert [p.key for p in second.passages] == ["p0", "p1", "p3"] and plan.cached == 2
    assert "Most relevant first: notes/3.md#0, notes/1.md#0, notes/0.md#0." in second.question_text()
    usage = warm.generate(second, cfg).usage
    assert usage.cached_tokens == plan.cached_tokens > 0
    assert usage.cached_tokens == sum(len(s) for s in warm.encode_segments(second)[:3])


def test_rag_reuses_passages_across_questions(smollm: weights.LoadedModel, docs_dir: Path, tmp_path: Path,
                                              embedder) -> None:  # noqa: ANN001
    """A second question over the first one's passages, retrieved in another order: the planner
    restores the cached order, the system segment and every passage come from the tree, and the
    answer's tokens equal a run without any cache over the same prompt."""
    from slimrag.index.core import Index
    from slimrag.rag.pipeline import RAG

    idx = Index.build(docs_dir, tmp_path / "warm.slimrag", embedder=embedder)
    gen, cfg = LocalGenerator(loaded=smollm), GenerationConfig(max_new_tokens=3)
    rag = RAG(idx, llm=gen, generation=cfg, answer="free")
    first = rag.ask("What is the name of the office cat?", k=3)
    assert first.usage.cached_tokens == 0 and len(first.sources) == 3
    question = "Where does the office cat sleep?"
    rag.retrieve = lambda q, k=4, source=None: list(reversed(first.sources))  # type: ignore[method-assign]
    prompt = rag.prompt(question, rag.retrieve(question, 3))
    second = rag.ask(question, k=3)
    assert [h.chunk_id for h in second.sources] == [h.chunk_id for h in first.sources]
    segments = gen.encode_segments(prompt)
    assert second.usage.cached_tokens == sum(len(s) for s in segments[:-1]) > len(segments[0])
    cold = LocalGenerator(loaded=smollm, cache=None).generate(prompt, cfg)
    assert cold.usage.cached_tokens == 0
    assert (second.text, second.usage.completion_tokens) == (cold.text.strip(), cold.usage.completion_tokens)


class _Recording(LocalGenerator):
    """The real engine, keeping the prompts it was given."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.prompts: list[Prompt] = []

    def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
        self.prompts.append(prompt)
        return super().stream(prompt, config)


def test_chat_turn_two_is_served_from_turn_one_and_its_answer_exactly(
        smollm: weights.LoadedModel, cold: LocalGenerator, docs_dir: Path, tmp_path: Path,
        embedder) -> None:  # noqa: ANN001
    """Turn two prefills only its new passages and question: turn one's whole prompt and answer
    come from the tree (kept after turn one), and its tokens equal a run without any cache."""
    from slimrag.index.core import Index
    from slimrag.rag.pipeline import RAG

    idx = Index.build(docs_dir, tmp_path / "chat.slimrag", embedder=embedder)
    gen = _Recording(loaded=smollm)
    cfg = GenerationConfig(max_new_tokens=NEW_TOKENS)
    conv = RAG(idx, llm=gen, generation=cfg, answer="free").chat(replay=True)
    first = conv.ask("Where does Whiskers sleep?", k=2)
    kept = conv.prefix()
    second = conv.ask("And how do I install slimrag on Windows?", k=2)
    p1, p2 = gen.prompts
    segments = gen.encode_segments(p2)
    assert len(kept) == len(p1.segments()) + 1 and segments[len(kept):-1]  # turn two brought new passages
    assert [s.key for s in p2.segments()[: len(kept)]] == [s.key for s in kept]
    assert first.usage.cached_tokens == 0
    assert second.usage.cached_tokens == sum(len(s) for s in segments[: len(kept)])
    reference = cold.generate(p2, cfg)
    assert (second.text, second.usage.completion_tokens) == (reference.text.strip(), reference.usage.completion_tokens)
    warm_ids, cached = greedy_ids(gen, p2, NEW_TOKENS)  # now everything but the question is cached
    assert cached == sum(len(s) for s in segments[:-1])
    assert warm_ids == greedy_ids(cold, p2, NEW_TOKENS)[0]


@pytest.fixture()
def remote_rag(docs_dir: Path, tmp_path: Path, embedder) -> Iterator[tuple]:  # noqa: ANN001
    from openai_server import OpenAIServer

    from slimrag.index.core import Index

    idx = Index.build(docs_dir, tmp_path / "remote.slimrag", embedder=embedder)
    with OpenAIServer() as srv:
        yield idx, srv


def test_shadow_cache_orders_passages_for_a_remote_prefix_cache(remote_rag: tuple) -> None:
    from slimrag.rag.pipeline import RAG

    idx, srv = remote_rag
    hits = idx.search("cat radiator winter", k=3)
    keys = [h.chunk_id for h in hits]
    results = {}
    for shadow in (False, True):
        rag = RAG(idx, llm=srv.base_url, shadow=shadow)
        rag.ask("cat radiator winter", k=3)
        # Same passages retrieved in another order: only the shadow knows the sent order.
        rag.retrieve = lambda q, k=4, source=None, _h=hits: list(reversed(_h))  # type: ignore[method-assign]
        ans = rag.ask("cat radiator winter", k=3)
        results[shadow] = ans.usage.cached_tokens / ans.usage.prompt_tokens
        if shadow:
            assert [h.chunk_id for h in ans.sources] == keys  # sent in the first request's order
    assert results[True] > results[False]
