"""Per-product timings of decode's matrix products: float32 ``F.linear`` against ``QuantLinear`` (MatMulNBits).

``python -m bench.qlinear_ops [--threads 1] [--rows 1,4] [--repeats 5]``. Loads the embedded
SmolLM2 twice (float32 and the default quantized load) and times, for each projection kind
(qkv, o, gate_up, down of every layer, and the output head), one product of ``rows`` activation
rows per layer in layer order, so the weights stream from memory as in a decode step (not a
product repeated on weights still in cache). Per kind: the sum over layers in ms; the total is
the products' share of one decode step. Medians of ``--repeats``. Writes
``bench/results/qlinear_ops.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from slimrag.llm import weights
from slimrag.llm.model.qlinear import linear

RESULTS = Path(__file__).resolve().parent / "results" / "qlinear_ops.json"
KINDS = ("qkv", "o", "gate_up", "down", "head")


def mats(model: object) -> dict[str, list]:
    layers = model.layers  # type: ignore[attr-defined]
    return {"qkv": [la.attn.qkv for la in layers], "o": [la.attn.o for la in layers],
            "gate_up": [la.gate_up for la in layers], "down": [la.down for la in layers],
            "head": [model.lm_head]}  # type: ignore[attr-defined]


def time_kind(ws: list, rows: int, repeats: int) -> float:
    xs = [torch.randn(rows, w.shape[1]) for w in ws]
    out = []
    with torch.inference_mode():
        for _ in range(repeats + 1):
            t = time.perf_counter()
            for w, x in zip(ws, xs, strict=True):
                linear(x, w)
            out.append(time.perf_counter() - t)
    return statistics.median(out[1:]) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", default="1,4")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    quant = weights.load_model(device="cpu")
    dense = weights.load_model(quant.path, device="cpu", quantized=False)
    table = []
    for rows in (int(r) for r in args.rows.split(",")):
        for kind in KINDS:
            qs, fs = mats(quant.model)[kind], mats(dense.model)[kind]
            table.append({"kind": kind, "rows": rows, "count": len(qs), "float32_ms": time_kind(fs, rows, args.repeats),
                          "quantized_ms": time_kind(qs, rows, args.repeats),
                          "quantized_mb": sum(w.nbytes for w in qs) / 1e6, "float32_mb": sum(w.numel() * 4 for w in fs) / 1e6})
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"threads": args.threads, "repeats": args.repeats, "rows": table}, indent=1))
    print(f"{'product':<10}{'rows':>5}{'x':>4}{'f32 MB':>8}{'q MB':>7}{'f32 ms':>9}{'q ms':>8}{'speedup':>9}")
    for r in table:
        print(f"{r['kind']:<10}{r['rows']:>5}{r['count']:>4}{r['float32_mb']:>8.1f}{r['quantized_mb']:>7.1f}"
              f"{r['float32_ms']:>9.2f}{r['quantized_ms']:>8.2f}{r['float32_ms'] / r['quantized_ms']:>9.2f}")
    for rows in sorted({r["rows"] for r in table}):
        f = sum(r["float32_ms"] for r in table if r["rows"] == rows)
        q = sum(r["quantized_ms"] for r in table if r["rows"] == rows)
        print(f"all products of one decode step, {rows} row(s): float32 {f:.1f} ms, quantized {q:.1f} ms ({f / q:.2f}x)")


if __name__ == "__main__":
    main()
