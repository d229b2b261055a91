"""Benchmark: the engine (plain PyTorch, issue 21) against the transformers engine it replaced, same run.

``python -m bench.engine --baseline SRC`` where ``SRC`` is the ``src`` folder of a checkout
before the engine (``git archive aa1e708 src | tar -x -C /tmp/base`` gives ``/tmp/base/src``).
Every figure comes from a fresh interpreter (``PYTHONPATH`` picks the engine), the two engines
alternating, ``--repeats`` times, medians reported:

- import: ``import slimrag.llm.local`` (torch, and before: transformers' model-loading modules);
- first load: ``LocalGenerator.load()`` with an empty ``SLIMRAG_HOME`` (before: the GGUF
  conversion into the float32 cache; now: the GGUF read in place) and a second load in a new
  process (before: from the cache);
- prefill tok/s: ``generate_ids`` of one new token over a ~``--prompt``-token prompt (no reuse);
- decode tok/s: greedy tokens after the first, ``(t(n + 1 tokens) - t(1 token)) / n``;
- identical: per engine, the share of ``--agree`` prompts (16 greedy tokens each) whose tokens
  equal the transformers engine's (float32); the bfloat16 row is the engine with
  ``dtype=torch.bfloat16`` (opt-in, never the CPU default).

``--threads`` torch threads in each child (default 1: the machine is shared). The cold
``slimrag ask`` profile (first token on a flat index from a new process) is ``--ask INDEX``: the
parent reads the child's stdout and times the first byte of the answer, on the second ask of the
``SLIMRAG_HOME`` (the first exports the embedder to ONNX once, as on a new machine). Prints a table and
writes ``bench/results/engine.json``.
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

RESULTS = Path(__file__).resolve().parent / "results" / "engine.json"
SRC = Path(__file__).resolve().parents[1] / "src"

_CHILD = """
import json, sys, time
t0 = time.perf_counter()
import torch
torch.set_num_threads({threads})
from slimrag.llm.local import LocalGenerator
t1 = time.perf_counter()
gen = LocalGenerator(cache=None, device="cpu", **({{"dtype": torch.bfloat16}} if {bf16} else {{}}))
gen.load()
t2 = time.perf_counter()
words = "river stone cat moon paper green seven blue house tree light harbour lamp tower".split()
text = "<|im_start|>system\\nAnswer from the notes.<|im_end|>\\n<|im_start|>user\\n" + " ".join(
    words[(i * 7) % len(words)] for i in range({prompt})) + "\\nWhich word comes after lamp?<|im_end|>\\n<|im_start|>assistant\\n"
ids = gen.encode_texts([text])[0]
out = {{"import_s": t1 - t0, "load_s": t2 - t1, "prompt_tokens": len(ids)}}
if {measure}:
    gen.generate_ids(ids, 2)  # warm-up: first touch of the weights
    one, many = [], []
    for _ in range(3):
        a = time.perf_counter(); gen.generate_ids(ids, 1); one.append(time.perf_counter() - a)
        a = time.perf_counter(); toks = gen.generate_ids(ids, {new} + 1); many.append(time.perf_counter() - a)
    t_one, t_many = sorted(one)[1], sorted(many)[1]
    out.update(prefill_tok_s=len(ids) / t_one, decode_tok_s=(len(toks) - 1) / (t_many - t_one), tokens=toks)
    prompts = [text.replace("lamp?", w + "?") for w in words[:{agree}]]
    out["answers"] = [gen.generate_ids(gen.encode_texts([p])[0], 16) for p in prompts]
print("RESULT " + json.dumps(out))
"""


def _child(src: str, home: str, threads: int, prompt: int, new: int, measure: bool, bf16: bool = False,
           agree: int = 8) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": src, "SLIMRAG_HOME": home, "OMP_NUM_THREADS": str(threads),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    code = _CHILD.format(threads=threads, prompt=prompt, new=new, measure=measure, bf16=bf16, agree=agree)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"child failed ({src}):\n{done.stderr[-2000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def _ask_first_token_s(src: str, home: str, docs: str, threads: int) -> float:
    """Seconds from spawning ``slimrag ask`` on a flat index of ``docs`` (built once per home by
    that engine's own code: index formats differ between the two checkouts) to the first byte of
    its answer on stdout."""
    env = {**os.environ, "PYTHONPATH": src, "SLIMRAG_HOME": home, "OMP_NUM_THREADS": str(threads),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    index = str(Path(home) / "ask.slimrag")
    if not Path(index).exists():
        subprocess.run([sys.executable, "-m", "slimrag", "build", docs, "-o", index, "--storage", "flat"],
                       env=env, check=True, capture_output=True)
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "slimrag", "ask", index, "What does VACUUM do?",
                             "--max-tokens", "8"], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    first = proc.stdout.read(1)
    elapsed = time.perf_counter() - t
    proc.communicate()
    if not first or proc.returncode:
        raise RuntimeError(f"slimrag ask failed ({src}), exit {proc.returncode}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", required=True, help="src folder of the transformers engine")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=300, help="prompt words (~tokens)")
    ap.add_argument("--new", type=int, default=32, help="decoded tokens per measurement")
    ap.add_argument("--ask", help="a folder of documents: also time a cold `slimrag ask` to its first token "
                                  "on a flat index of it")
    ap.add_argument("--agree", type=int, default=8, help="prompts for the identical-token rate")
    ap.add_argument("--no-bf16", action="store_true", help="skip the engine's bfloat16 row")
    args = ap.parse_args()
    engines = {"transformers (before)": args.baseline, "engine (now)": str(SRC)}
    if not args.no_bf16:
        engines["engine bfloat16 (opt-in)"] = str(SRC)
    load0 = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in engines}
    first: dict[str, list[float]] = {name: [] for name in engines}
    asks: dict[str, list[float]] = {name: [] for name in engines}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name, src in engines.items():
                home = str(Path(tmp) / f"{r}-{abs(hash(name))}")
                bf16 = "bfloat16" in name
                first[name].append(_child(src, home, args.threads, args.prompt, args.new, False, bf16)["load_s"])
                runs[name].append(_child(src, home, args.threads, args.prompt, args.new, True, bf16, args.agree))
                if args.ask and not bf16:
                    _ask_first_token_s(src, home, args.ask, args.threads)  # the embedder's one-time ONNX export
                    asks[name].append(_ask_first_token_s(src, home, args.ask, args.threads))
    rows = []
    for name in engines:
        rs = runs[name]
        row = {"engine": name, "first_load_s": statistics.median(first[name]),
               "import_s": statistics.median(r["import_s"] for r in rs),
               "load_s": statistics.median(r["load_s"] for r in rs),
               "prefill_tok_s": statistics.median(r["prefill_tok_s"] for r in rs),
               "decode_tok_s": statistics.median(r["decode_tok_s"] for r in rs),
               "prompt_tokens": rs[0]["prompt_tokens"]}
        if asks[name]:
            row["ask_first_token_s"] = statistics.median(asks[name])
        rows.append(row)
    reference = runs["transformers (before)"][0]["answers"]
    for row in rows:
        got = runs[row["engine"]][0]["answers"]
        row["identical"] = sum(a == b for a, b in zip(got, reference, strict=True)) / len(reference)
    before, now = runs["transformers (before)"][0]["tokens"], runs["engine (now)"][0]["tokens"]
    report = {"threads": args.threads, "repeats": args.repeats, "new_tokens": args.new, "rows": rows,
              "identical_tokens": before == now, "loadavg_before": load0, "loadavg_after": os.getloadavg(),
              "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count()}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=1))
    cols = ["first_load_s", "import_s", "load_s", "prefill_tok_s", "decode_tok_s", "identical"] + (
        ["ask_first_token_s"] if args.ask else [])
    print(f"{'engine':<26}" + "".join(f"{c:>18}" for c in cols))
    for row in rows:
        print(f"{row['engine']:<26}" + "".join(f"{row.get(c, float('nan')):>18.2f}" for c in cols))
    b = rows[0]
    for n in rows[1:]:
        print(f"{n['engine']}: decode {n['decode_tok_s'] / b['decode_tok_s']:.2f}x, "
              f"prefill {n['prefill_tok_s'] / b['prefill_tok_s']:.2f}x")
    print(f"float32 greedy tokens equal on the timed prompt: {before == now}; "
          f"load average {load0[0]:.1f} -> {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
