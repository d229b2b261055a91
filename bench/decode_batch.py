"""Micro-benchmark: does batching the decode steps of several requests pay on this machine?

``python -m bench.decode_batch`` times one greedy decode step of SmolLM2-135M (float32) for a
batch of B sequences that already hold ``--context`` tokens of KV, B = 1, 2, 4, 8, with 1 and
2 torch threads, and reports ms per step and ms per generated token. Equal lengths (no padding)
are the best case for batching: real requests have different lengths and need padding and an
attention mask, which costs more. Writes ``bench/results/decode_batch.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

RESULTS = Path(__file__).resolve().parent / "results" / "decode_batch.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--context", type=int, default=800)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--threads", default="1,2")
    args = ap.parse_args()
    import torch

    from slimrag.hf import using_transformers
    from slimrag.llm.weights import default_gguf_path

    gguf = default_gguf_path()
    with using_transformers():  # the transformers engine this measurement was made for (issue 21 replaced it)
        from transformers import AutoModelForCausalLM, DynamicCache

        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name).eval()
    rows = []
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for b in (int(x) for x in args.batches.split(",")):
            ids = torch.randint(100, 20000, (b, args.context))
            cache = DynamicCache(config=model.config)
            pos = torch.arange(args.context).unsqueeze(0).expand(b, -1)
            with torch.inference_mode():
                model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=1)
                times = []
                tok = torch.randint(100, 20000, (b, 1))
                for i in range(args.steps):
                    t = time.perf_counter()
                    p = torch.full((b, 1), args.context + i)
                    model(input_ids=tok, position_ids=p, past_key_values=cache, use_cache=True, logits_to_keep=1)
                    times.append(time.perf_counter() - t)
            step = statistics.median(times)
            rows.append({"threads": threads, "batch": b, "ms_per_step": 1000 * step, "ms_per_token": 1000 * step / b})
            print(f"threads={threads} batch={b}: {1000 * step:7.1f} ms/step {1000 * step / b:7.1f} ms/token", flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"context": args.context, "loadavg": os.getloadavg(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
