"""Benchmark: the engine against llama.cpp's ``llama-bench`` on the same GGUF file, same run, alternating.

``python -m bench.engine --llama-bench PATH`` (or ``LLAMA_BENCH=PATH``). ``llama-bench`` is built
in the bench environment only, never a dependency: from the ``llama-cpp-python`` sdist's vendored
tree (``pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36``, unpack, then in
``vendor/llama.cpp``: ``cmake -B /tmp/llamacpp-build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON
-DLLAMA_CURL=OFF && cmake --build /tmp/llamacpp-build --target llama-bench -j2``).

For each repeat and each thread count, llama.cpp and then each engine row run once, each in a
fresh process:

- llama.cpp: ``llama-bench -m GGUF -p PROMPT -n 0 -t THREADS -r 1 -o json`` (prefill of ``PROMPT``
  tokens on an empty context), then ``llama-bench -m GGUF -p 0 -n NEW -d DEPTHS ...`` (decode of
  ``NEW`` tokens with ``DEPTH`` tokens in the context first, filled before the timing), its own tok/s;
- the engine: a child process loads the model (``load_model``; ``import_s`` and ``load_s`` are
  its import and load times; ``step_s`` the time to make the fused decode step ready, loaded from
  ``$SLIMRAG_HOME/steps`` or built and saved there, ``step_loaded`` which), then through
  ``slimrag.llm.reference.generate_ids``: prefill tok/s = ``PROMPT / t(1 token)`` on a ``PROMPT``-token
  prompt, and per depth, after a ``DEPTH``-token prompt (1 token for depth 0), decode tok/s =
  ``NEW / (t(NEW + 1 tokens) - t(1 token))``, each time the median of 3 (greedy may stop at an EOS
  early; the count of tokens actually made is used). Rows: ``quantized`` (the default load) and
  ``float32`` (``quantized=False``, the engine before issue 28) unless ``--rows`` says otherwise.

Depth. Decode slows as the context grows (attention reads every cached position), so both sides
are timed at the same depths: ``--depths`` (default 0 and ``PROMPT``). Until 2026-11-28 this bench
compared llama.cpp's ``tg`` test, which decodes from an empty context (positions 0-127), with the
engine's decode after the ``PROMPT``-token prompt (positions 512-639): not the same work.

Figures are medians over ``--repeats``; ratios are engine / llama.cpp. Prints a table and writes
``bench/results/engine.json``. torch and ONNX Runtime get ``THREADS`` threads in the child.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "engine.json"
SRC = Path(__file__).resolve().parents[1] / "src"
DEFAULT_LLAMA_BENCH = "/tmp/llamacpp-build/bin/llama-bench"

#: Engine rows: name -> keyword arguments of ``load_model``.
ROWS: dict[str, dict[str, Any]] = {"quantized": {}, "float32": {"quantized": False}}

_CHILD = """
import json, sys, time
t0 = time.perf_counter()
import torch
torch.set_num_threads({threads})
from slimrag.llm import weights
from slimrag.llm.local import LocalGenerator
from slimrag.llm.reference import generate_ids
t1 = time.perf_counter()
loaded = weights.load_model({gguf!r}, device="cpu", **{kwargs!r})
t2 = time.perf_counter()
loaded.model.warm_step()  # the fused decode step: loaded from $SLIMRAG_HOME/steps, or built and saved there
t3 = time.perf_counter()
gen = LocalGenerator(loaded=loaded, cache=None, device="cpu")
words = "river stone cat moon paper green seven blue house tree light harbour lamp tower".split()
text = " ".join(words[(i * 7) % len(words)] for i in range(4 * max({prompt}, *{depths})))
ids = gen.encode_texts([text])[0]
generate_ids(gen, ids[: {prompt}], 2)  # warm-up: first touch of the weights


def timed(n):  # medians of 3: t(1 token), t(NEW + 1 tokens) and the tokens made after an n-token prompt
    one, many = [], []
    for _ in range(3):
        a = time.perf_counter(); generate_ids(gen, ids[:n], 1); one.append(time.perf_counter() - a)
        a = time.perf_counter(); toks = generate_ids(gen, ids[:n], {new} + 1); many.append(time.perf_counter() - a)
    return sorted(one)[1], sorted(many)[1], len(toks) - 1


t_one, t_many, t_made = timed({prompt})
out = {{"import_s": t1 - t0, "load_s": t2 - t1, "step_s": t3 - t2, "prompt_tokens": len(ids[: {prompt}]),
       "prefill_tok_s": len(ids[: {prompt}]) / t_one}}
for d in {depths}:  # decode after a d-token prompt (a 1-token one for depth 0)
    one, many, made = (t_one, t_many, t_made) if d == {prompt} else timed(max(d, 1))
    out[f"decode_tok_s_d{{d}}"] = made / (many - one)
    out[f"decoded_d{{d}}"] = made
step = loaded.model._step
out["step_loaded"] = bool(step is not None and step.loaded)
print("RESULT " + json.dumps(out))
"""


def engine_run(gguf: str, kwargs: dict[str, Any], threads: int, prompt: int, new: int,
               depths: list[int]) -> dict[str, Any]:
    """One engine measurement in a fresh process (see the module header)."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
    code = _CHILD.format(threads=threads, gguf=gguf, kwargs=kwargs, prompt=prompt, new=new, depths=depths)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"engine child failed:\n{done.stderr[-2000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def llama_run(binary: str, gguf: str, threads: int, prompt: int, new: int, depths: list[int],
              extra: list[str]) -> dict[str, float]:
    """``llama-bench`` twice: prefill of ``prompt`` tokens on an empty context, then decode of
    ``new`` tokens at each depth (``-d``: that many tokens in the context first, not timed)."""
    out: dict[str, float] = {}
    common = ["-t", str(threads), "-r", "1", "-o", "json", *extra]
    for cmd in ([binary, "-m", gguf, "-p", str(prompt), "-n", "0", *common],
                [binary, "-m", gguf, "-p", "0", "-n", str(new), "-d", ",".join(map(str, depths)), *common]):
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode:
            raise RuntimeError(f"llama-bench failed ({' '.join(cmd)}):\n{done.stderr[-2000:]}")
        for rec in json.loads(done.stdout):
            if rec["n_prompt"] and not rec["n_gen"]:
                out["prefill_tok_s"] = float(rec["avg_ts"])
            elif rec["n_gen"] and not rec["n_prompt"]:
                out[f"decode_tok_s_d{int(rec.get('n_depth', 0))}"] = float(rec["avg_ts"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH", DEFAULT_LLAMA_BENCH))
    ap.add_argument("--llama-args", default="", help="extra llama-bench arguments (e.g. '--repack 0' where "
                    "the CPU lists AMX that the machine does not allow: llama.cpp's AMX path then stops on SIGILL)")
    ap.add_argument("--gguf", help="the model file (default: the embedded SmolLM2 Q4_1)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=512, help="prefill tokens")
    ap.add_argument("--new", type=int, default=128, help="decoded tokens")
    ap.add_argument("--depths", default=None, help="comma-separated context depths decode is timed at "
                    "(default: 0 and --prompt)")
    ap.add_argument("--rows", default="quantized", help=f"engine rows among {sorted(ROWS)}")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    if args.gguf is None:
        sys.path.insert(0, str(SRC))
        from slimrag.llm.weights import default_gguf_path

        args.gguf = str(default_gguf_path())
    if not Path(args.llama_bench).is_file():
        sys.exit(f"no llama-bench at {args.llama_bench}: build it (see the module header) or pass --llama-bench")
    threads = [int(t) for t in args.threads.split(",")]
    rows = [r for r in args.rows.split(",") if r]
    depths = [int(d) for d in args.depths.split(",")] if args.depths else sorted({0, args.prompt})
    keys = ["prefill_tok_s", *(f"decode_tok_s_d{d}" for d in depths)]
    load0 = os.getloadavg()
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in range(args.repeats):
        for t in threads:
            runs.setdefault(("llama.cpp", t), []).append(llama_run(args.llama_bench, args.gguf, t, args.prompt, args.new,
                                                                           depths, args.llama_args.split()))
            for name in rows:
                runs.setdefault((name, t), []).append(engine_run(args.gguf, ROWS[name], t, args.prompt, args.new,
                                                                   depths))
            print(f"repeat {r + 1}/{args.repeats}, {t} thread(s) done", file=sys.stderr, flush=True)
    table = []
    for t in threads:
        base = {k: statistics.median(x[k] for x in runs[("llama.cpp", t)]) for k in keys}
        table.append({"engine": "llama.cpp", "threads": t, **base, "runs": runs[("llama.cpp", t)]})
        for name in rows:
            rs = runs[(name, t)]
            row = {k: statistics.median(x[k] for x in rs) for k in (*keys, "load_s", "import_s", "step_s")}
            for k in keys:
                row[k.replace("_tok_s", "_ratio")] = row[k] / base[k]
            # per repeat, against the llama.cpp run of the same repeat
            row["decode_ratios"] = {k: [e[k] / b[k] for e, b in zip(rs, runs[("llama.cpp", t)], strict=True)]
                                    for k in keys[1:]}
            table.append({"engine": name, "threads": t, **row, "runs": rs})
    report = {"gguf": args.gguf, "prompt": args.prompt, "new": args.new, "depths": depths, "repeats": args.repeats, "rows": table,
              "llama_bench": args.llama_bench, "llama_args": args.llama_args, "loadavg_before": load0, "loadavg_after": os.getloadavg(),
              "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"{Path(args.gguf).name}: prefill {args.prompt}, decode {args.new} at depths {depths}, "
          f"medians of {args.repeats}")
    head = f"{'engine':<12}{'threads':>8}{'prefill tok/s':>15}{'ratio':>8}"
    head += "".join(f"{'decode @' + str(d):>14}{'ratio':>8}" for d in depths)
    print(head + f"{'load s':>8}{'step s':>8}")
    for row in table:
        line = f"{row['engine']:<12}{row['threads']:>8}"
        line += "".join(f"{row[k]:>{15 if i == 0 else 14}.1f}{row.get(k.replace('_tok_s', '_ratio'), 1):>8.2f}"
                        for i, k in enumerate(keys))
        print(line + f"{row.get('load_s', float('nan')):>8.2f}{row.get('step_s', float('nan')):>8.2f}")
    print(f"load average {load0[0]:.1f} -> {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
