"""Benchmark: loading the embedded LLM straight from its GGUF file, in a fresh process and in process.

``python -m bench.llm_load`` measures :func:`slimrag.llm.weights.load_model` on the embedded
SmolLM2 GGUF (read in place by :mod:`slimrag.llm.model.gguf`; there is no conversion cache, so
every load is a "first" load):

- new process: a fresh interpreter with an empty ``SLIMRAG_HOME`` imports the loader stack, loads,
  and runs a first forward over a short prompt (what a ``slimrag ask`` on the command line pays);
- same process: three more loads here (median), imports already paid.

Tokens/s against llama.cpp on the same file, same run: ``bench.engine``.
Prints a table and writes ``bench/results/llm_load.json``.
"""

from __future__ import annotations

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

RESULTS = Path(__file__).resolve().parent / "results" / "llm_load.json"
REPEATS = 3
PROBE = "<|im_start|>user\\nWhat is the capital of France?<|im_end|>\\n<|im_start|>assistant\\n"

_CHILD = """
import json, time
t0 = time.perf_counter()
import torch
from slimrag.llm.weights import load_model
t1 = time.perf_counter()
lm = load_model(device="cpu")
t2 = time.perf_counter()
ids = lm.tokenizer.encode("{probe}")
with torch.inference_mode():
    lm.model.forward(torch.tensor(ids), torch.arange(len(ids)), lm.model.new_cache())
t3 = time.perf_counter()
print(json.dumps({{"import_s": t1 - t0, "load_s": t2 - t1, "first_forward_s": t3 - t2}}))
"""


def run() -> dict[str, Any]:
    """Measure a fresh-process load and in-process loads; return the results."""
    from slimrag.llm.weights import default_gguf_path, load_model

    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="slimrag-bench-") as home:
        child = subprocess.run([sys.executable, "-c", _CHILD.format(probe=PROBE)],
                               env=dict(os.environ, SLIMRAG_HOME=home), capture_output=True, text=True, check=True)
        fresh = json.loads(child.stdout.strip().splitlines()[-1])
        written = sorted(str(p.relative_to(home)) for p in Path(home).rglob("*"))
    same = [load_model(device="cpu").load_s for _ in range(REPEATS)]
    gguf = default_gguf_path()
    return {"benchmark": "llm_load", "model": gguf.name, "gguf_bytes": gguf.stat().st_size,
            "new_process": fresh, "same_process_load_s": same, "files_written": written,
            "loadavg_before": load0, "loadavg_after": os.getloadavg(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "unix_time": time.time()}


def main() -> None:
    result = run()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1))
    f = result["new_process"]
    print(f"{'path':<28}{'import s':>10}{'load s':>10}{'1st fwd s':>11}")
    print(f"{'GGUF, new process':<28}{f['import_s']:>10.2f}{f['load_s']:>10.2f}{f['first_forward_s']:>11.2f}")
    print(f"{'GGUF, same process (median)':<28}{'':>10}{statistics.median(result['same_process_load_s']):>10.2f}")
    print(f"files written under SLIMRAG_HOME: {len(result['files_written'])}; "
          f"load average {result['loadavg_before'][0]:.1f} -> {result['loadavg_after'][0]:.1f}")


if __name__ == "__main__":
    main()
