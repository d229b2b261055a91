"""How far the quantized engine is from the float32 engine on the same GGUF file: greedy tokens and logits.

``python -m bench.quant_agreement [--prompts 100] [--new 12]``. The quantized engine (the default
load: products on the file's Q4_1/Q8_0 blocks, activations rounded to int8 per block inside the
kernel) and the float32 engine (``quantized=False``: every weight dequantized, the engine before
issue 28) compute the same weights differently, so they are not required to agree to the bit.
Prompts: chat-templated questions over lines of this repository's ``docs/*.md`` (the first
``--prompts`` lines of 60-400 characters, in file order). Per prompt, both engines prefill the
prompt in one forward (last position's logits compared: max and mean absolute difference, and
whether the argmax agrees) and then decode ``--new`` greedy tokens one forward each. Reports
the share of prompts whose greedy tokens are all equal, the share of first tokens equal, the mean
length of the common prefix, and the logit differences; writes
``bench/results/quant_agreement.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from slimrag.llm import weights
from slimrag.llm.model import Decoder

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "quant_agreement.json"


def prompts(n: int) -> list[str]:
    lines = [ln.strip() for f in sorted((ROOT / "docs").glob("*.md")) for ln in f.read_text().splitlines()]
    lines = [ln for ln in lines if 60 <= len(ln) <= 400 and not ln.startswith(("|", "```"))][:n]
    return [f"<|im_start|>user\n{ln}\nWhat does this say, in one sentence?<|im_end|>\n<|im_start|>assistant\n"
            for ln in lines]


def run(model: Decoder, ids: list[int], new: int) -> tuple[torch.Tensor, list[int]]:
    """Last-position logits of the prompt and ``new`` greedy tokens."""
    cache = model.new_cache()
    with torch.inference_mode():
        logits = model.forward(torch.tensor(ids), torch.arange(len(ids)), cache)
        assert logits is not None
        first, out = logits.clone(), []
        for _ in range(new):
            out.append(int(logits.argmax()))
            logits = model.forward(torch.tensor(out[-1:]), torch.tensor([cache.length]), cache)
            assert logits is not None
    return first, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=100)
    ap.add_argument("--new", type=int, default=12)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    quant = weights.load_model(device="cpu")
    dense = weights.load_model(quant.path, device="cpu", quantized=False)
    texts = prompts(args.prompts)
    rows = []
    for text in texts:
        ids = quant.tokenizer.encode(text)
        lq, tq = run(quant.model, ids, args.new)
        lf, tf = run(dense.model, ids, args.new)
        diff = (lq - lf).abs()
        common = next((i for i, (a, b) in enumerate(zip(tq, tf, strict=True)) if a != b), args.new)
        rows.append({"prompt_tokens": len(ids), "max_abs": float(diff.max()), "mean_abs": float(diff.mean()),
                     "logit_scale": float(lf.abs().mean()), "first_equal": tq[0] == tf[0], "all_equal": tq == tf,
                     "common_prefix": common})
    report = {"prompts": len(rows), "new": args.new, "threads": args.threads,
              "all_tokens_equal": sum(r["all_equal"] for r in rows) / len(rows),
              "first_token_equal": sum(r["first_equal"] for r in rows) / len(rows),
              "mean_common_prefix": statistics.mean(r["common_prefix"] for r in rows),
              "logit_max_abs": max(r["max_abs"] for r in rows),
              "logit_mean_abs": statistics.mean(r["mean_abs"] for r in rows),
              "logit_mean_magnitude": statistics.mean(r["logit_scale"] for r in rows), "rows": rows}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=1))
    print(f"{len(rows)} prompts, {args.new} greedy tokens: all equal {report['all_tokens_equal']:.0%}, first token "
          f"equal {report['first_token_equal']:.0%}, common prefix {report['mean_common_prefix']:.1f} tokens; "
          f"last-position logits |q - f|: max {report['logit_max_abs']:.3f}, mean {report['logit_mean_abs']:.4f} "
          f"(mean |logit| {report['logit_mean_magnitude']:.2f})")


if __name__ == "__main__":
    main()
