"""Warm generation on a GPU: cached KV gives the same tokens as no cache, through all three tiers.

Runs only where CUDA is available (skipped elsewhere, CI included). The model is a small
random-weight Llama in bfloat16 (exactness does not depend on the weights, and no weights need
to travel to the GPU machine); the tokenizer is SmolLM2's, from ``$SLIMRAG_TEST_TOKENIZER`` or
else the embedded model's GGUF; built with transformers, saved as safetensors and loaded by the engine. Ground truth is a generator with no KV reuse, which prefills
every prompt with the same segment-wise schedule on the same device.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import WORDS, word_passages

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from slimrag.llm import weights  # noqa: E402
from slimrag.llm.kv.config import CacheConfig  # noqa: E402
from slimrag.llm.local import LocalGenerator  # noqa: E402
from slimrag.llm.reference import greedy_ids  # noqa: E402
from slimrag.prompt import Prompt  # noqa: E402

os.environ["HF_HUB_OFFLINE"] = "1"
KV_BYTES_PER_TOKEN = 2 * 4 * 2 * 64 * 2  # K and V x layers x kv heads x head dim x bfloat16


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[weights.LoadedModel]:
    """A random-weight Llama built with transformers, saved, and loaded by the engine on CUDA."""
    from reference_models import build_reference

    from slimrag.llm.model import Tokenizer

    folder = os.environ.get("SLIMRAG_TEST_TOKENIZER")
    tokenizer = (Tokenizer.from_folder(Path(folder)) if folder is not None
                 else weights.load_model(device="cpu").tokenizer)
    out = tmp_path_factory.mktemp("llama-cuda")
    build_reference("llama", out, tokenizer, layers=4, hidden_size=256, intermediate_size=1024,
                    num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    yield weights.load_model(out, device="cuda", dtype=torch.bfloat16)


def test_cached_tokens_equal_uncached_through_device_host_and_disk(model: weights.LoadedModel,
                                                                    tmp_path: Path) -> None:
    rng = random.Random(99)
    passages = word_passages(rng, 10, max_words=40)
    segment = KV_BYTES_PER_TOKEN * 64
    warm = LocalGenerator(loaded=model, cache=CacheConfig(
        device="cuda", device_bytes=3 * segment, host_bytes=4 * segment, disk_bytes=100 * segment,
        disk_dir=str(tmp_path)))
    cold = LocalGenerator(loaded=model, cache=None)
    served = 0
    for case in range(40):
        chosen = tuple(rng.sample(passages, rng.randint(1, 4)))
        prompt = Prompt(f"Which word comes after {rng.choice(WORDS)}?", chosen)
        got, cached = greedy_ids(warm, prompt, 8)
        want, none = greedy_ids(cold, prompt, 8)
        assert got == want, f"case {case}: {cached} cached tokens changed the output"
        assert none == 0
        served += cached
    stats = warm.cache_stats()
    assert stats is not None and served > 0
    device, host, disk = stats.tiers
    assert device.peak <= device.budget and host.peak <= host.budget and disk.peak <= disk.budget
    assert stats.demotions > 0 and stats.promotions > 0, "the small budgets must move nodes between tiers"
    warm.reuse.tree.check()  # type: ignore[attr-defined]
    warm.close()
