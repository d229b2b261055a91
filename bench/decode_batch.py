"""Micro-benchmark: which batched matrix products keep a row's bits, and what a batched decode step costs.

``python -m bench.decode_batch`` with the embedded SmolLM2-135M (float32, ``--threads`` torch
threads, default 1):

1. Row classes. For each projection of one layer and the output head, and for two ways of
   writing the product (``F.linear(x, W)`` and ``(W @ x.T).T``), the row counts M = 1 .. 16 are
   grouped by whether a fixed row's output is bitwise the same, with the row first and last and
   random neighbours. Rows of one class can be batched without changing a request's numbers.
2. Step cost. One decode step over ``--context`` tokens of KV per sequence: the engine's
   one-token :meth:`Decoder.forward` (batching off) against
   :func:`slimrag.llm.model.batch.decode_step` for 1, 4 and 8 sequences (each row computed as
   its own one-token forward would be), median of ``--steps``; ms per step and per token.

Writes ``bench/results/decode_batch.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

RESULTS = Path(__file__).resolve().parent / "results" / "decode_batch.json"


def row_classes(form: Callable[[Any, Any], Any], w: Any, widths: range, seed: int = 0) -> list[list[int]]:
    """Row counts grouped by the bits of one fixed row's product (first and last placement)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    target = torch.randn(w.shape[1], generator=gen)
    outs: dict[tuple[int, int], Any] = {}
    for m in widths:
        for r in sorted({0, m - 1}):
            x = torch.randn(m, w.shape[1], generator=gen)
            x[r] = target
            outs[(m, r)] = form(x, w)[r].contiguous()
    classes: list[list[tuple[int, int]]] = []
    for key, out in outs.items():
        for cl in classes:
            if torch.equal(outs[cl[0]], out):
                cl.append(key)
                break
        else:
            classes.append([key])
    # a width whose rows land in two classes (placement matters) is reported in both
    return [sorted({m for m, _ in cl}) for cl in classes]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--context", type=int, default=800)
    ap.add_argument("--steps", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F

    from slimrag.llm.model.batch import decode_step, rows_are_exact
    from slimrag.llm.weights import load_model

    torch.set_num_threads(args.threads)
    model = load_model(None).model
    layer = model.layers[0]
    mats = {"qkv": layer.attn.qkv, "o": layer.attn.o, "gate_up": layer.gate_up, "down": layer.down,
            "lm_head": model.lm_head}
    forms = {"F.linear(x, W)": lambda x, w: F.linear(x, w), "(W @ x.T).T": lambda x, w: (w @ x.t()).t()}
    classes: dict[str, dict[str, list[list[int]]]] = {}
    with torch.inference_mode():
        for fname, form in forms.items():
            classes[fname] = {}
            for name, w in mats.items():
                classes[fname][name] = row_classes(form, w, range(1, 17))
                print(f"{fname:<16} {name:<8} {tuple(w.shape)}: {classes[fname][name]}", flush=True)
        together = rows_are_exact(model)
        print(f"rows_are_exact (one product call for all rows): {together}")
        caches = []
        gen = torch.Generator().manual_seed(1)
        for _ in range(8):
            cache = model.new_cache()
            model.forward(torch.randint(100, 20000, (args.context,), generator=gen), torch.arange(args.context), cache)
            caches.append(cache)

        def timed(fn: Callable[[], object], n: int) -> float:
            times = []
            for _ in range(args.steps):
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
                for c in caches[:n]:
                    c.truncate(args.context)
            return statistics.median(times)

        def old() -> None:
            model.forward(torch.tensor([5]), torch.tensor([args.context]), caches[0])

        rows = []
        cases: list[tuple[str, int, Callable[[], object]]] = [("forward (off)", 1, old)]
        for b in (1, 4, 8):
            cases.append((f"decode_step x{b}", b, lambda b=b: decode_step(
                model, [5] * b, [args.context] * b, caches[:b], together=together)))
        for name, n, fn in cases:
            step = timed(fn, n)
            rows.append({"case": name, "sequences": n, "ms_per_step": round(1000 * step, 1),
                         "ms_per_token": round(1000 * step / n, 1)})
            print(f"{name:<26} {1000 * step:7.1f} ms/step {1000 * step / n:7.1f} ms/token", flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"context": args.context, "threads": args.threads, "loadavg": os.getloadavg(),
                                   "row_classes": classes, "rows_are_exact": together, "rows": rows}, indent=1))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
