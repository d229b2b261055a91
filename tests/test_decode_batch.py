"""Batched decoding (issue 21, item 6): concurrent streams share decode steps, tokens stay those of
unbatched runs.

Ground truth is the same generator serving one request at a time. The real SmolLM2 model on one
torch thread; prompts are short and generations a dozen tokens (two shared CPU cores).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from slimrag.api import listen
from slimrag.cli import cli
from slimrag.config import GenerationConfig
from slimrag.embed.local import LocalEmbedder
from slimrag.errors import RequestError
from slimrag.index.core import Index
from slimrag.llm import backends, weights
from slimrag.llm.backends import make_generator
from slimrag.llm.engine.batcher import BatchConfig
from slimrag.llm.local import LocalGenerator
from slimrag.llm.model import KVCache
from slimrag.llm.model.batch import decode_step, rows_are_exact
from slimrag.llm.reference import greedy_ids
from slimrag.prompt import Passage, Prompt
from slimrag.serve import app as serve_app

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

NEW_TOKENS = 12
PASSAGES = [
    Passage("c0", "notes/cats.md#0", "The cat's name is Whiskers and she sleeps on the piano."),
    Passage("d0", "notes/dogs.md#0", "The dog is called Rex and likes long walks by the river."),
    Passage("b0", "notes/birds.md#0", "A robin built a nest in the old oak tree behind the barn."),
    Passage("f0", "notes/fish.md#0", "The goldfish, Bubbles, lives in a round bowl on the desk."),
]
QUESTIONS = ["What is the cat's name?", "Who likes long walks?", "Where is the nest?",
             "Where does Bubbles live?", "Which animals are named?", "Write a poem about the river."]


def _prompts() -> list[Prompt]:
    return [Prompt(q, passages=tuple(PASSAGES[(i + j) % len(PASSAGES)] for j in range(1 + i % 3)))
            for i, q in enumerate(QUESTIONS)]


def test_a_row_of_a_step_is_bitwise_the_one_token_forward_alone(smollm: weights.LoadedModel) -> None:
    """Each sequence's logits from a shared step equal those of the one-token forward of that
    sequence alone (the unbatched decode step), whatever its row, neighbours and cache length;
    with one product call for all rows (exact here) and one per row."""
    model = smollm.model
    assert rows_are_exact(model)  # on this CPU: MKL's gemv by blocks, MLAS's quantized kernel over rows
    lengths = [5, 37, 64, 90, 11, 250, 3]
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        caches = []
        for n in lengths:
            cache = model.new_cache()
            model.forward(torch.randint(100, 20000, (n,), generator=gen), torch.arange(n), cache)
            caches.append(cache)
        tokens = torch.randint(100, 20000, (len(lengths),), generator=gen).tolist()
        alone = []
        for t, n, cache in zip(tokens, lengths, caches, strict=True):
            logits = model.forward(torch.tensor([t]), torch.tensor([n]), cache)
            assert logits is not None
            alone.append(logits)
            assert torch.equal(decode_step(model, [t], [n + 1], [cache])[0],
                               model.forward(torch.tensor([t]), torch.tensor([n + 1]), _copy(cache, n + 1)))
            cache.truncate(n)
        order = [6, 2, 0, 5, 1, 4, 3]
        for together in (True, False):
            shared = decode_step(model, [tokens[i] for i in order], [lengths[i] for i in order],
                                 [caches[i] for i in order], 8, together=together)
            for row, i in enumerate(order):
                assert torch.equal(shared[row], alone[i]), f"sequence {i} at row {row}, together={together}"
                assert caches[i].length == lengths[i] + 1
                caches[i].truncate(lengths[i])
        with pytest.raises(ValueError, match="width 4"):
            decode_step(model, tokens[:5], lengths[:5], caches[:5], 4)


def _copy(cache: KVCache, n: int) -> KVCache:
    """A new cache holding the first ``n`` positions of ``cache``."""
    return KVCache.seeded([(k[:, :, :n], v[:, :, :n]) for k, v in cache.layers()], dtype=cache.dtype,
                          device=cache.device)


def test_concurrent_greedy_streams_give_each_prompt_its_tokens_alone(smollm: weights.LoadedModel) -> None:
    gen = LocalGenerator(loaded=smollm, cache=None, batch=BatchConfig(width=8, wait_s=0.02))
    prompts = _prompts()
    alone = [greedy_ids(gen, p, NEW_TOKENS)[0] for p in prompts]
    before = gen.batch_stats()
    assert before is not None and before.rows == before.steps  # one request at a time: one row a step
    threads_before = threading.active_count()
    start = threading.Barrier(len(prompts))

    def run(p: Prompt) -> list[int]:
        start.wait()
        return greedy_ids(gen, p, NEW_TOKENS)[0]

    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        together = list(pool.map(run, prompts))
    assert together == alone
    after = gen.batch_stats()
    assert after is not None
    steps, rows = after.steps - before.steps, after.rows - before.rows
    assert rows == sum(len(t) - 1 for t in together)  # every step after the first token, once
    assert steps < rows  # steps were shared
    assert threading.active_count() == threads_before  # the batcher starts no thread
    assert gen.decoding.batcher is not None and gen.decoding.batcher.active == 0


def test_streams_with_sampling_and_the_unbatched_path_agree_with_their_own_runs(smollm: weights.LoadedModel) -> None:
    """Seeded sampling under batching gives the text of the same request alone; width 1 (the
    engine without batching) is deterministic too."""
    cfg = GenerationConfig(max_new_tokens=8, temperature=0.8)
    batched = LocalGenerator(loaded=smollm, cache=None, batch=BatchConfig(width=8))
    prompts = _prompts()[:4]
    alone = [batched.generate(p, cfg).text for p in prompts]
    with ThreadPoolExecutor(max_workers=4) as pool:
        assert list(pool.map(lambda p: batched.generate(p, cfg).text, prompts)) == alone
    off = LocalGenerator(loaded=smollm, cache=None, batch=BatchConfig(width=1))
    assert off.batch_stats() is None
    first = greedy_ids(off, prompts[0], 6)[0]
    assert greedy_ids(off, prompts[0], 6)[0] == first
    assert [off.generate(p, cfg).text for p in prompts] == alone  # batched and unbatched: one set of tokens


def test_a_stalled_stream_delays_but_does_not_stop_the_others(smollm: weights.LoadedModel) -> None:
    gen = LocalGenerator(loaded=smollm, cache=None, batch=BatchConfig(width=8, wait_s=0.01))
    a, b = _prompts()[:2]
    want = greedy_ids(gen, b, NEW_TOKENS)[0]
    stalled = gen.stream(a, GenerationConfig(max_new_tokens=NEW_TOKENS))
    next(stalled)  # decoding, then its caller stops asking
    batcher = gen.decoding.batcher
    assert batcher is not None and batcher.active == 1
    assert greedy_ids(gen, b, NEW_TOKENS)[0] == want
    stalled.close()
    assert batcher.active == 0


def test_batch_config_is_validated() -> None:
    with pytest.raises(ValueError, match="width"):
        BatchConfig(width=0)
    with pytest.raises(ValueError, match="wait_s"):
        BatchConfig(wait_s=-1)
    assert not BatchConfig(width=1).enabled and BatchConfig().enabled


def test_the_width_reaches_the_engine_from_the_registry_and_serve(docs_dir: Path, tmp_path: Path,
                                                                   embedder: LocalEmbedder,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    gen = make_generator(None, batch=BatchConfig(width=1))
    assert isinstance(gen, LocalGenerator) and gen.batch == BatchConfig(width=1) and gen.batch_stats() is None
    with pytest.raises(RequestError, match="embedded model only"):
        make_generator("http://127.0.0.1:9/v1", batch=BatchConfig())
    with Index.build(docs_dir, tmp_path / "w.slimrag", embedder=embedder) as idx:
        root = str(idx.root)
    built: list[Any] = []
    real = backends.BACKENDS["local"]
    monkeypatch.setitem(backends.BACKENDS, "local", lambda spec, **kw: built.append(real(spec, **kw)) or built[-1])
    monkeypatch.setattr(serve_app, "warm_up", lambda rag: None)  # no model load: the config is what counts
    monkeypatch.setattr(listen, "run", lambda app, sock, host, **kw: sock.close())  # serve's loop, not entered
    for args, width in ((["--decode-width", "4"], 4), ([], BatchConfig().width)):
        r = CliRunner().invoke(cli, ["serve", root, "--port", "0", *args])
        assert r.exit_code == 0, r.output
        assert built[-1].batch.width == width
