"""The engine against transformers, the reference: logits within a stated tolerance, greedy tokens equal.

Models: random-weight Llama (with Llama 3 RoPE scaling), Qwen2 (q/k/v biases; plain and yarn
RoPE), Qwen3 (q/k norms, head_dim != hidden / heads) and Mistral, each built with transformers
(seeded), saved as safetensors and loaded by the engine; SmolLM2-135M itself is compared in
``test_llm_local.py`` (logits equal transformers' GGUF load to the bit there). Tolerance: every
logit within ``ATOL`` = 1e-4 absolute (the models' logits are O(1); float32 sums in a different
order differ by ~1e-6). Paths: one whole-prompt forward, the generator's segment-wise prefill
with and without the knowledge tree, and a tree small enough to evict and reload from disk.
Also: the GGUF tokenizer gives transformers' ids, special tokens included, and the engine's
RoPE frequencies equal transformers' for every scaling type.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import word_passages
from reference_models import build_reference

from slimrag.hf import using_transformers
from slimrag.llm import weights
from slimrag.llm.kv.config import CacheConfig
from slimrag.llm.local import LocalGenerator
from slimrag.llm.model.config import ModelConfig
from slimrag.llm.model.rope import inverse_frequencies
from slimrag.llm.reference import generate_ids, greedy_ids
from slimrag.prompt import Prompt

ATOL = 1e-4

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama3-rope": ("llama", {"rope": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 512}}),
    "qwen2": ("qwen2", {}),
    "qwen2-yarn": ("qwen2", {"rope": {"rope_type": "yarn", "factor": 4.0,
                                      "original_max_position_embeddings": 1024}}),
    "qwen3": ("qwen3", {}),
    "mistral": ("mistral", {}),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request: pytest.FixtureRequest, smollm: weights.LoadedModel,
         tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, weights.LoadedModel]:
    """(transformers model, the engine's load of the same folder)."""
    family, kwargs = CASES[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    ref = build_reference(family, folder, smollm.tokenizer, **kwargs)
    return ref, weights.load_model(folder, device="cpu")


def _ids(gen: LocalGenerator, prompt: Prompt) -> list[int]:
    return [i for seg in gen.encode_segments(prompt) for i in seg]


def test_logits_match_transformers(pair: tuple[Any, weights.LoadedModel]) -> None:
    ref, loaded = pair
    gen = LocalGenerator(loaded=loaded, cache=None)
    ids = _ids(gen, Prompt("Which word comes after river?", tuple(word_passages(random.Random(5), 3))))
    model = loaded.model
    with torch.inference_mode():
        want = ref(torch.tensor([ids])).logits[0]
        got = model.forward(torch.tensor(ids), torch.arange(len(ids)), model.new_cache(), logits="all")
        assert got is not None
        assert (got - want).abs().max().item() < ATOL
        # decode steps on top of the cache: the last position, one token at a time
        cache = model.new_cache()
        model.forward(torch.tensor(ids[:-3]), torch.arange(len(ids) - 3), cache)
        for i in range(len(ids) - 3, len(ids)):
            step = model.forward(torch.tensor(ids[i:i + 1]), torch.tensor([i]), cache)
            assert step is not None and (step - want[i]).abs().max().item() < ATOL


def test_greedy_tokens_equal_transformers_cached_uncached_and_evicted(pair: tuple[Any, weights.LoadedModel],
                                                                      tmp_path: Path) -> None:
    ref, loaded = pair
    rng = random.Random(9)
    passages = word_passages(rng, 5)
    cold = LocalGenerator(loaded=loaded, cache=None)
    warm = LocalGenerator(loaded=loaded)
    budget = loaded.model.config.kv_bytes_per_token * 120  # a few segments: forces demotion to disk
    tight = LocalGenerator(loaded=loaded, cache=CacheConfig(host_bytes=budget, disk_bytes=40 * budget,
                                                           disk_dir=str(tmp_path)))
    prompts = [Prompt("Which word comes after stone?", tuple(rng.sample(passages, 2))) for _ in range(4)]
    for prompt in prompts + prompts:
        ids = _ids(cold, prompt)
        with torch.inference_mode():
            out = ref.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False,
                               attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        want = out[0, len(ids):].tolist()
        assert generate_ids(cold, ids, 6)[: len(want)] == want
        assert greedy_ids(cold, prompt, 6)[0][: len(want)] == want
        assert greedy_ids(warm, prompt, 6)[0][: len(want)] == want
        assert greedy_ids(tight, prompt, 6)[0][: len(want)] == want
    stats = tight.cache_stats()
    assert stats is not None and stats.demotions > 0
    tight.close()


@pytest.mark.parametrize("case", sorted(CASES))
def test_rope_frequencies_equal_transformers(case: str) -> None:
    family, kwargs = CASES[case]
    with using_transformers():
        import transformers
        from reference_models import FAMILIES
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        config_name, _, extra = FAMILIES[family]
        fields = {"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096,
                  "rope_theta": 10000.0, **extra}
        if "rope" in kwargs:
            fields["rope_scaling"] = kwargs["rope"]
        config = getattr(transformers, config_name)(**fields)
        kind = config.rope_parameters.get("rope_type", "default")
        if kind == "default":
            dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
            want = 1.0 / (config.rope_parameters["rope_theta"] ** (
                torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
            want_scale = 1.0
        else:
            want, want_scale = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
        raw = config.to_dict()
    ours = ModelConfig.from_hf(raw)
    got, scale = inverse_frequencies(ours.rope, ours.head_dim)
    assert torch.allclose(got, want.float(), rtol=1e-6, atol=0) and scale == pytest.approx(want_scale)


TEXTS = [
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n",
    "<|im_start|>assistant\n", "<|endoftext|>", "a<|im_end|>b",
    "The cat's name is Whiskers. It's 12 o'clock; 3.14159 and 2024-11-24.",
    "  leading spaces\tand\ttabs\n\n\nnewlines  ", "ünïcödé, “quotes”, — dashes, 😀 emoji, 漢字, ﷽",
    "def f(x):\n    return x ** 2  # comment\n", "I'M HERE, we'll see; they've gone. y'all", "1234567890 007 3,000,000",
    "https://example.com/path?q=1&r=2#frag", "", " ", "\n", "<|im_start|", "<repo_name>x<file_sep>",
]


def test_gguf_tokenizer_equals_transformers(smollm: weights.LoadedModel) -> None:
    gguf = weights.default_gguf_path()
    with using_transformers():
        from transformers import AutoTokenizer

        ref = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    rng = random.Random(3)
    alphabet = "abcXYZ 0123456789.,;:'\"!?-\n\t<|>_éü中😀"
    texts = TEXTS + ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))) for _ in range(300)]
    tok = smollm.tokenizer
    for text in texts:  # transformers splits as GPT-2 does: equal wherever no digit follows a space
        if not re.search(r"\s\d", text):
            assert tok.encode(text) == ref.encode(text, add_special_tokens=False), text
    # SmolLM2's own split isolates every digit first (its tokenizer.json, llama.cpp's "smollm");
    # with that split given to transformers' tokenizer, vocabulary, merges and special tokens agree
    # on every text
    from tokenizers import pre_tokenizers

    ref.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    for text in texts:
        ids = tok.encode(text)
        assert ids == ref.encode(text, add_special_tokens=False), text
        assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        assert tok.decode(ids, skip_special_tokens=False) == ref.decode(ids, skip_special_tokens=False,
                                                                        clean_up_tokenization_spaces=False)
    assert tok.eos_token_id == ref.eos_token_id and len(tok) == len(ref)
