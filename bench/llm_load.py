"""Benchmark: loading the embedded LLM from its GGUF file (cold) versus from the converted cache (warm).

``python -m bench.llm_load`` runs, in one go and against a fresh temporary ``SLIMRAG_HOME``:

- cold: :func:`slimrag.llm.weights.load_model` on an empty cache, which hashes the GGUF,
  dequantizes it with transformers and writes the safetensors cache;
- warm: the same call again in this process (median of three), transformers already imported;
- warm, new process: a fresh interpreter that imports transformers and loads from the cache,
  which is what a ``slimrag ask`` on the command line pays.

For each it also times the first forward pass over a short prompt, because a memory-mapped load
defers reading the weights until they are first touched. It prints a table and writes
``bench/results/llm_load.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

RESULTS = Path(__file__).resolve().parent / "results" / "llm_load.json"
WARM_REPEATS = 3
PROBE = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"

# Runs in a fresh interpreter: times the import of the loader stack, the load and a first forward.
_CHILD = """
import json, time
t0 = time.perf_counter()
import torch
from slimrag.llm.weights import load_model
import transformers
t1 = time.perf_counter()
lm = load_model(device="cpu")
t2 = time.perf_counter()
ids = torch.tensor([lm.tokenizer.encode({probe!r}, add_special_tokens=False)])
with torch.inference_mode():
    lm.model(ids)
t3 = time.perf_counter()
print(json.dumps({{"import_s": t1 - t0, "load_s": t2 - t1, "first_forward_s": t3 - t2,
                  "from_cache": lm.from_cache}}))
"""


def _first_forward_s(loaded: Any) -> float:
    import torch

    ids = torch.tensor([loaded.tokenizer.encode(PROBE, add_special_tokens=False)])
    t = time.perf_counter()
    with torch.inference_mode():
        loaded.model(ids)
    return time.perf_counter() - t


def run() -> dict[str, Any]:
    """Measure cold, warm and warm-new-process loads; return the results as a dict."""
    import torch

    from slimrag.llm.weights import default_gguf_path, load_model

    gguf = default_gguf_path()
    with tempfile.TemporaryDirectory(prefix="slimrag-bench-") as home:
        cold = load_model(device="cpu", home=home)
        if cold.from_cache:
            raise RuntimeError(f"{home} was expected to be empty")
        cold_s, cold_fwd = cold.load_s, _first_forward_s(cold)
        del cold  # one copy of the weights in memory at a time

        warm_runs: list[float] = []
        for _ in range(WARM_REPEATS):
            warm = load_model(device="cpu", home=home)
            if not warm.from_cache:
                raise RuntimeError("the second load did not find the cache")
            warm_runs.append(warm.load_s)
        warm_fwd = _first_forward_s(warm)
        del warm

        child = subprocess.run(
            [sys.executable, "-c", _CHILD.format(probe=PROBE)],
            env=dict(os.environ, SLIMRAG_HOME=home),
            capture_output=True,
            text=True,
            check=True,
        )
        fresh = json.loads(child.stdout.strip().splitlines()[-1])

    warm_s = statistics.median(warm_runs)
    rows = [
        {
            "path": "gguf (cold: hash + dequantize + write cache)",
            "load_s": cold_s,
            "first_forward_s": cold_fwd,
        },
        {"path": "cache (warm, same process, median of 3)", "load_s": warm_s, "first_forward_s": warm_fwd},
        {
            "path": "cache (warm, new process)",
            "load_s": fresh["load_s"],
            "first_forward_s": fresh["first_forward_s"],
        },
    ]
    for row in rows:
        row["ratio"] = cold_s / row["load_s"]
    return {
        "benchmark": "llm_load",
        "model": gguf.name,
        "gguf_bytes": gguf.stat().st_size,
        "rows": rows,
        "warm_runs_s": warm_runs,
        "new_process_import_s": fresh["import_s"],
        "machine": {
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            # Timings on a shared 2-core machine swing with other work; this says how busy it was.
            "loadavg_1m_at_end": os.getloadavg()[0],
        },
        "unix_time": time.time(),
    }


def _print_table(result: dict[str, Any]) -> None:
    rows = result["rows"]
    width = max(len(r["path"]) for r in rows)
    print(f"{'path':<{width}}  {'load s':>8}  {'1st fwd s':>9}  {'ratio':>7}")
    for r in rows:
        print(f"{r['path']:<{width}}  {r['load_s']:8.2f}  {r['first_forward_s']:9.2f}  {r['ratio']:6.1f}x")
    print(
        f"new process: {result['new_process_import_s']:.2f} s importing torch + transformers before the "
        "load; its load time includes transformers' lazy import of the model code"
    )


def main() -> None:
    """Run the benchmark, print the table, write the JSON file."""
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    result = run()
    _print_table(result)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
