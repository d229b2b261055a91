"""Prefill and lone-stream decode of the embedded engine on a ~1,000-token RAG prompt.

What it measures (issue 28, items 2 and 4), in one process, medians of ``--repeat`` runs:

- ``prefill``: a cold prompt ([system][4 passages][question], ~1,000 tokens) through
  ``slimrag.llm.reference.greedy_ids(gen, prompt, 1)`` with no KV reuse: tokenization, the prefill
  forward(s) and the choice of the first token; reported as prompt tokens per second, for the
  engine's one-pass prefill and for one forward per segment (the engine before), alternating.
- ``decode``: a lone stream's decode steps through the batcher (the default, ``BatchConfig()``)
  and with batching off (``width=1``): ``(t(1 + n tokens) - t(1 token)) / n``.

Run: ``flock /tmp/slimrag-timing.lock .venv/bin/python bench/warm_prefill.py --threads 1 --json out.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from slimrag.llm import weights
from slimrag.llm.engine.batcher import BatchConfig
from slimrag.llm.local import LocalGenerator
from slimrag.llm.reference import greedy_ids
from slimrag.prompt import Passage, Prompt

DOCS = Path(__file__).resolve().parent.parent / "docs"


def passages(gen: LocalGenerator, count: int = 4, tokens: int = 220) -> tuple[Passage, ...]:
    """``count`` passages of about ``tokens`` tokens each, cut from the project's own docs."""
    words = " ".join(p.read_text() for p in sorted(DOCS.glob("*.md"))).split()
    out, start = [], 0
    for i in range(count):
        end = start + tokens
        while len([t for seg in gen.encode_texts([" ".join(words[start:end])]) for t in seg]) > tokens:
            end -= 5
        out.append(Passage(f"p{i}", f"docs/part{i}.md#0", " ".join(words[start:end])))
        start = end
    return tuple(out)


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--decode", type=int, default=16, help="decode tokens timed")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--form", choices=("float", "quantized", "dense"), default="quantized",
                    help="the model's weights: float32 (quantized=False), quantized (the default load), "
                         "quantized with float32 prefill (dense_rows=64)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    form = {"float": {"quantized": False}, "quantized": {}, "dense": {"dense_rows": 64}}[args.form]
    loaded = weights.load_model(device="cpu", **form)
    gen = LocalGenerator(loaded=loaded, cache=None)
    seg = LocalGenerator(loaded=loaded, cache=None)
    seg.runner._mode = "segments"  # the engine before issue 28: one forward per segment
    prompt = Prompt("Which parts does the engine keep, and what does a cold answer wait for?",
                    passages=passages(gen))
    n = sum(len(s) for s in gen.encode_segments(prompt))
    row = {"form": args.form, "threads": args.threads, "prompt_tokens": n, "segments": len(prompt.segments()),
           "one_pass_mode": gen.runner.mode}
    for g in (gen, seg):
        greedy_ids(g, prompt, 1)  # warm-up (first-call allocations, the kernels' first use, dense copies)
    times: dict[str, list[float]] = {"one_pass": [], "segments": []}
    for _ in range(args.repeat):  # alternating, so load changes hit both alike
        for name, g in (("one_pass", gen), ("segments", seg)):
            times[name].append(timed(lambda g=g: greedy_ids(g, prompt, 1), 1))
    for name, ts in times.items():
        row[f"prefill_{name}_s"] = round(statistics.median(ts), 3)
        row[f"prefill_{name}_tok_s"] = round(n / statistics.median(ts), 1)
    short = Prompt("What does the engine keep?", passages=prompt.passages[:1])
    for name, batch in (("batched", BatchConfig()), ("width1", BatchConfig(width=1))):
        g = LocalGenerator(loaded=loaded, cache=None, batch=batch)
        greedy_ids(g, short, 3)
        one = timed(lambda g=g: greedy_ids(g, short, 1), args.repeat)
        ids, _ = greedy_ids(g, short, 1 + args.decode)
        many = timed(lambda g=g: greedy_ids(g, short, 1 + args.decode), args.repeat)
        steps = len(ids) - 1
        row[f"decode_{name}_ms"] = round(1000 * (many - one) / max(steps, 1), 2)
        row[f"decode_{name}_steps"] = steps
    print(json.dumps(row))
    if args.json:
        args.json.write_text(json.dumps(row, indent=1) + "\n")


if __name__ == "__main__":
    main()
