"""A warm question's forward: 24 new tokens on top of a cached prefix, run under whichever source tree is on ``PYTHONPATH``.

Why: the bfloat16 prefill pads every product call to a fixed size (``llm/model/bf16.py``), so a
short pass, the question after cached passages, pays for the padding. This times what a warm
question costs the model alone: one forward of 24 tokens (the length of a typical question
segment) at position 1,000 on a cache holding 1,000 positions, no tokenizer, no decode. The
prefix is computed once; each timed forward runs on a fresh copy of it. Median of ``--repeat``
after two warm-ups. Each tree runs this file in its own process (``PYTHONPATH=WT/src``),
alternately, as ``bench/cold_prefill.py`` does.

Run: ``flock /tmp/slimrag-timing.lock python bench/short_forward.py --threads 2 --label after``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--label", default="tree")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--prefix", type=int, default=1000, help="cached positions before the question")
    ap.add_argument("--tokens", type=int, default=24, help="the question's tokens")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from slimrag.llm import weights

    model = weights.load_model(device="cpu").model
    ids = torch.arange(100, 100 + args.prefix) % 40000
    q = torch.arange(7000, 7000 + args.tokens)
    pos = torch.arange(args.prefix, args.prefix + args.tokens)
    times = []
    with torch.inference_mode():
        prefix = model.new_cache()
        model.forward(ids, torch.arange(args.prefix), prefix)
        for i in range(args.repeat + 2):
            cache = copy.deepcopy(prefix)
            t = time.perf_counter()
            model.forward(q, pos, cache)
            if i >= 2:
                times.append(time.perf_counter() - t)
    print(json.dumps({"tree": args.label, "threads": args.threads, "mode": getattr(model, "settled_mode", None),
                      "prefix": args.prefix, "tokens": args.tokens,
                      "median_ms": round(statistics.median(times) * 1e3, 1),
                      "times_ms": [round(x * 1e3, 1) for x in times], "loadavg_1m": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
