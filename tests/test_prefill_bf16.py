"""The bfloat16 prefill's weight copy (:mod:`slimrag.llm.model.bf16`): its own dequantizer of the
embedded model's block types gives ``gguf``'s float32 values exactly, and its chunked product gives a
row the same result whatever rows share its call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from slimrag.cpu import bf16_units
from slimrag.llm.model import bf16
from slimrag.llm.model.qlinear import Q4_1, Q8_0, QuantPart, dequantize


def _part(kind: int, rows: int, cols: int, rng: np.random.Generator) -> QuantPart:
    nb = cols // 32
    scales = rng.normal(0, 0.02, (rows, nb, 2 if kind == Q4_1 else 1)).astype(np.float16).view(np.uint8)
    body = rng.integers(0, 256, (rows, nb, 16 if kind == Q4_1 else 32), dtype=np.uint8)
    return QuantPart(np.concatenate([scales, body], -1).reshape(rows, -1), kind, cols)


def test_the_copy_dequantizes_as_gguf_does() -> None:
    rng = np.random.default_rng(0)
    for kind in (Q4_1, Q8_0):
        part = _part(kind, 48, 256, rng)
        assert torch.equal(bf16._dequantized(part), torch.from_numpy(dequantize(part))), kind


@pytest.mark.skipif(not bf16_units(), reason="the bf16 prefill is chosen only on a CPU with AMX (elsewhere unchecked)")
def test_a_rows_product_does_not_depend_on_its_call() -> None:
    gen = torch.Generator().manual_seed(1)
    w16 = bf16.sizes(bf16.copy(torch.randn(96, 64, generator=gen)))
    x = torch.randn(max(bf16.WIDE) + 40, 64, generator=gen)
    full = bf16.linear(x, w16)
    for a, b in ((0, 1), (3, 9), (20, bf16.CHUNK + 7), (bf16.CHUNK, bf16.CHUNK + 40), (7, max(bf16.WIDE) + 30)):
        assert torch.equal(bf16.linear(x[a:b], w16), full[a:b]), (a, b)


def test_the_copy_is_budgeted_on_a_containers_limit(tmp_path: Path) -> None:
    """A cgroup limit below the machine's memory is the budget; "max" (no limit) and an absent
    file leave the machine's memory."""
    machine = bf16.memory_bytes(())
    limit = tmp_path / "memory.max"
    limit.write_text(f"{2**30}\n")
    assert bf16.memory_bytes((tmp_path / "absent", limit)) == min(machine, 2**30)
    limit.write_text("max\n")
    assert bf16.memory_bytes((limit,)) == machine


def test_a_one_shot_load_keeps_the_quantized_rows_and_holds_no_copy() -> None:
    """``bf16_prefill=False`` (what a one-shot ``ask`` asks for) settles ``rows`` at load and builds
    no bfloat16 copy; the runner takes the settled mode, and the KV namespace names it."""
    from slimrag.llm.engine.runner import PREFILL_SCHEDULES
    from slimrag.llm.local import LocalGenerator

    gen = LocalGenerator(bf16_prefill=False, cache=None)
    model = gen.load().model
    assert model.settled_mode == gen.runner.mode == "rows" and model._bf16 is None
    assert PREFILL_SCHEDULES["rows"] in gen.runner.namespace(gen.load().path)


@pytest.mark.skipif(not bf16_units(), reason="the bf16 prefill is chosen only on a CPU with AMX (elsewhere unchecked)")
def test_the_held_copy_reuses_the_checks_layer_0_and_equals_a_fresh_build(smollm: Any) -> None:
    """The load's row check builds layer 0's copy; the held copy takes it as its first layer
    (not built twice), and it equals a fresh build bitwise."""
    model = smollm.model
    if model.settled_mode != "bf16":
        pytest.skip(f"the model settled {model.settled_mode!r} (the copy did not fit)")
    held, fresh = model.bf16_weights()[0], model.bf16_weights(layers=1)[0]
    assert all(torch.equal(h.dense(), f.dense()) for h, f in zip(held, fresh, strict=True))
    with pytest.raises(ValueError):
        model.bf16_weights(first=fresh[:2])
