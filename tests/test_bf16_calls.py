"""The bfloat16 prefill's call sizes (:mod:`slimrag.llm.model.bf16`): on the embedded model's own
weights, every layer's every product gives each row bitwise the result of 128-row calls whatever
call sizes its pass used, at 1 and at 2 threads, so K/V computed in a long pass (512-row calls)
equal those of a short one (64- and 128-row calls)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from slimrag.cpu import bf16_units
from slimrag.llm.model import bf16

pytestmark = pytest.mark.skipif(not bf16_units(), reason="the bf16 prefill is chosen only on a CPU with AMX")


def _reference(x: torch.Tensor, w: bf16.Copy) -> torch.Tensor:
    """``x @ w.T`` in :data:`bf16.CHUNK`-row calls only (the last padded): the schedule before
    wide and short calls."""
    n, pad = x.shape[0], -x.shape[0] % bf16.CHUNK
    xb = torch.cat([x.to(torch.bfloat16), x.new_zeros(pad, x.shape[1], dtype=torch.bfloat16)])
    return torch.cat([bf16.product(xb[i : i + bf16.CHUNK], w) for i in range(0, n + pad, bf16.CHUNK)])[:n]


def test_calls_cut_a_pass_into_the_allowed_sizes() -> None:
    threads = torch.get_num_threads()
    w = bf16.Copy(torch.empty(0), wide=512, short=True, threads=threads)
    assert bf16.calls(24, w) == [64]
    assert bf16.calls(64, w) == [64]
    assert bf16.calls(65, w) == [128]
    assert bf16.calls(1345, w) == [512, 512, 128, 128, 128]
    assert bf16.calls(1344, w) == [512, 512, 128, 128, 64]
    assert bf16.calls(1024, w) == [512, 512]
    narrow = bf16.Copy(torch.empty(0), threads=threads)
    assert bf16.calls(300, narrow) == [128, 128, 128]
    # checked at another thread count: 128-row calls only, the size every other was checked against
    other = bf16.Copy(torch.empty(0), wide=512, short=True, threads=threads + 1)
    assert bf16.calls(1345, other) == [128] * 11


@pytest.mark.parametrize("threads", [1, 2])
def test_every_layers_rows_are_the_same_in_every_call_size(smollm: Any, threads: int) -> None:
    """Exhaustive over the model: all 30 layers x 4 products, pass lengths that reach every call
    size and remainder, rows compared with 128-row calls (the sizes settled at this thread count
    on layer 0, as the load does, then applied to every layer, as the held copy does)."""
    model = smollm.model
    if model.settled_mode != "bf16":
        pytest.skip(f"the model settled {model.settled_mode!r} (the copy did not fit)")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        held = model.bf16_weights()
        first = tuple(bf16.sizes(w) for w in held[0])
        gen = torch.Generator().manual_seed(threads)
        used: set[int] = set()
        for layer in held:
            for w, like in zip(layer, first, strict=True):
                w = dataclasses.replace(like, packed=w.packed)
                x = torch.randn(1345 + 7, w.shape[1], generator=gen)
                for a, b in ((0, 24), (3, 64 + 3), (0, 300), (7, 1345 + 7)):
                    used.update(bf16.calls(b - a, w))
                    assert torch.equal(bf16.linear(x[a:b], w), _reference(x[a:b], w)), (threads, w.shape, a, b)
        allowed = {w.wide for w in first} | {bf16.SHORT for w in first if w.short} | {bf16.CHUNK}
        assert used == allowed - {0}, (used, allowed)
    finally:
        torch.set_num_threads(before)
    narrow = [i for i, w in enumerate(first) if not w.wide]
    if narrow:  # correct (those products fall back to 128-row calls), but the prefill gains less
        pytest.skip(f"products {narrow} of (qkv, o, gate_up, down) have no wide call size whose rows "
                    f"equal 128-row calls here at {threads} threads: rows checked, wide calls untested there")
