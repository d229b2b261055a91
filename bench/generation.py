"""Benchmark: warm generation on a skewed RAG workload, four serving modes in one run.

``python -m bench.generation`` (``--quick`` for a 60-question smoke run):

- Workloads (``bench.qa_workload``): ``grouped`` = all questions of ``--passages`` random
  disfl_qa passages (30 → 209 questions), shuffled; ``zipf`` = ``--zipf-n`` arrivals over
  ``--zipf-passages`` passages with Zipf(``--zipf-s``) popularity.
- Retrieval: top-``--k`` (4) from the flat index of all 1,204 passages (cached in bench/data).
- Arrivals: bursts of ``--burst`` (8) questions arrive together; each mode serves a burst one
  prefill at a time (``bench.gen_modes``: a no reuse, b prefix cache in retrieval order,
  c ContextPilot's order and schedule, d slimrag tree + planner + longest-cached-prefix-first,
  e slimrag blend reuse, one mode per ``--recompute`` policy).
  Modes are interleaved burst by burst, in a rotating order, so a noisy neighbour on the machine
  hits all of them alike; one untimed request warms the model up first.
- Model: the embedded SmolLM2-135M-Instruct, float32, ``--threads`` torch threads, greedy,
  ``--max-new-tokens`` (10): answers are short spans; the first line is scored.
- Budgets: b, c, d each get a tree with ``--host-mib`` of host memory and ``--disk-mib`` of disk.

Reported per mode: TTFT mean and p90 from the engine (tokenize + match + prefill + first token,
plus the mode's ordering time) and the same including the wait behind earlier requests of the
burst; prefill tokens computed per request; cached-token share (cached / prompt tokens); peak
bytes per cache tier; answer EM/F1 (SQuAD normalisation) against the gold answers; planner
overhead (one planning call) and ordering overhead charged per request. Blend modes (e) add
recomputed tokens per request and fidelity against exact prefill of the same prompt
(``bench.gen_fidelity``): identical-answer rate, mean KL over the exact answer, and the F1 of the
exact answers. ``--warmup N`` serves the first N arrivals to the caching modes untimed (steady
state; mode a has no state to warm). Prints a table and writes ``bench/results/generation.json``.

``--workloads multiturn`` runs the chat workload of :mod:`bench.gen_chat` instead (conversations
of ``--turns`` questions; TTFT of each turn with and without reuse).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

from bench.qa_workload import add_workload_args, dump_requests, exact_match, f1, requests  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "generation.json"


def p90(xs: list[float]) -> float:
    return sorted(xs)[max(0, round(0.9 * len(xs)) - 1)] if xs else 0.0


def run(args: argparse.Namespace, workload: str, model: Any, checkpoint: Any) -> dict[str, Any]:
    """Serve the workload in every mode; ``checkpoint(result)`` is called after each burst with
    the summary so far (a long run on a busy machine leaves usable partial results)."""
    from bench.gen_fidelity import Fidelity
    from bench.gen_modes import MODES, BlendPlanner, relevance_prompt
    from slimrag.config import GenerationConfig
    from slimrag.llm.kv.config import CacheConfig

    cache = CacheConfig(device=str(model.model.device), device_bytes=args.device_mib << 20,
                        host_bytes=args.host_mib << 20, disk_bytes=args.disk_mib << 20)
    modes = [MODES[m](model, cache) for m in args.modes if m != "e"]
    if "e" in args.modes:  # one tree per policy: each pays for its own unseen passages
        modes += [BlendPlanner(model, cache, policy, name=f"e{i + 1}")
                  for i, policy in enumerate(args.recompute.split(","))]
    fidelity = Fidelity(model, args.max_new_tokens)
    arrivals = requests(args, workload)[: args.limit or None]
    warm, arrivals = arrivals[: args.warmup], arrivals[args.warmup:]
    gold = {r.index: answer for r, answer in arrivals}
    cfg = GenerationConfig(max_new_tokens=args.max_new_tokens, stop=("\n",))
    rows: dict[str, list[dict[str, Any]]] = {m.name: [] for m in modes}
    t_start = time.perf_counter()
    # Warm-up: the first forwards page in the memory-mapped weights; no mode should pay for that.
    warmup = MODES["a"](model, cache)
    warmup.gen.generate(relevance_prompt(arrivals[0][0]), cfg)
    for b in range(0, len(warm), args.burst):  # steady state: fill the caches, measure nothing
        for mode in modes:
            if mode.name != "a":
                for s in mode.serve([r for r, _ in warm[b : b + args.burst]]):
                    mode.gen.generate(s.prompt, cfg)
        print(f"  {workload}: warm-up {min(b + args.burst, len(warm))}/{len(warm)}, "
              f"{time.perf_counter() - t_start:.0f} s", flush=True)
    for n, b in enumerate(range(0, len(arrivals), args.burst)):
        burst = [r for r, _ in arrivals[b : b + args.burst]]
        for mode in modes[n % len(modes):] + modes[: n % len(modes)]:  # rotate: no mode always goes first
            waited = 0.0
            for s in mode.serve(burst):
                done = mode.gen.generate(s.prompt, cfg)
                u = done.usage
                ttft = u.ttft_s + s.overhead_s
                text = done.text.strip().split("\n")[0]
                fid = fidelity.compare(mode.gen, s.prompt, text) if mode.blend else {}
                if fid:
                    fid["f1_exact"] = f1(fid["reference"], gold[s.request.index])
                rows[mode.name].append({**fid, "recomputed": u.recomputed_tokens,
                    "i": s.request.index, "ttft_s": ttft, "queued_ttft_s": waited + ttft,
                    "prompt": u.prompt_tokens, "cached": u.cached_tokens, "order_s": s.overhead_s,
                    "plan_s": s.plan_s, "em": exact_match(text, gold[s.request.index]),
                    "f1": f1(text, gold[s.request.index]), "answer": text,
                })
                waited += u.total_s + s.overhead_s
        served = min(b + args.burst, len(arrivals))
        print(f"  {workload}: {served}/{len(arrivals)} questions, {time.perf_counter() - t_start:.0f} s", flush=True)
        result = {"questions": served, "of": len(arrivals), "wall_s": time.perf_counter() - t_start,
                  "modes": {m.name: summary(m, rows[m.name]) for m in modes},
                  "answers": {m.name: [r["answer"] for r in sorted(rows[m.name], key=lambda r: r["i"])]
                              for m in modes}}
        checkpoint(result)
    return result


def summary(mode: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
    ttft = [r["ttft_s"] for r in rows]
    queued = [r["queued_ttft_s"] for r in rows]
    prompt, cached = sum(r["prompt"] for r in rows), sum(r["cached"] for r in rows)
    stats = mode.gen.cache_stats()
    return {
        "label": mode.label, "ttft_mean_s": statistics.mean(ttft), "ttft_p90_s": p90(ttft),
        "queued_ttft_mean_s": statistics.mean(queued), "queued_ttft_p90_s": p90(queued),
        "prefill_tokens_per_request": (prompt - cached) / len(rows), "prompt_tokens_per_request": prompt / len(rows),
        "cached_share": cached / prompt, "em": 100 * statistics.mean(r["em"] for r in rows),
        "f1": 100 * statistics.mean(r["f1"] for r in rows),
        "recomputed_per_request": statistics.mean(r["recomputed"] for r in rows),
        **({"identical": 100 * statistics.mean(r["identical"] for r in rows),
            "kl": statistics.mean(r["kl"] for r in rows),
            "f1_exact": 100 * statistics.mean(r["f1_exact"] for r in rows)} if "kl" in rows[0] else {}),
        "order_overhead_ms": 1000 * statistics.mean(r["order_s"] for r in rows),
        "plan_ms": 1000 * statistics.mean(r["plan_s"] for r in rows),
        "tiers": [{"name": t.name, "budget_mib": t.budget / 2**20, "peak_mib": t.peak / 2**20}
                  for t in stats.tiers] if stats else [],
        "tree": {k: getattr(stats, k) for k in ("evictions", "demotions", "promotions", "discards")} if stats else {},
    }


def table(workload: str, res: dict[str, Any]) -> str:
    head = (f"{workload} ({res['questions']} of {res['of']} questions, {res['wall_s']:.0f} s)\n"
            f"{'mode':<31}{'TTFT mean':>10}{'p90':>7}{'queued':>8}{'p90':>7}{'prefill':>8}{'cached':>7}"
            f"{'EM':>6}{'F1':>6}{'plan':>7}{'order':>7}{'recomp':>7}{'ident':>7}{'KL':>7}{'F1ex':>6}"
            f"  peak MiB host/disk, evict/demote/promote")
    lines = [head]
    base = res["modes"].get("a", {}).get("ttft_mean_s")
    for name, m in res["modes"].items():
        tiers = "/".join(f"{t['peak_mib']:.0f}" for t in m["tiers"]) or "-"
        tree = "/".join(str(m["tree"][k]) for k in ("evictions", "demotions", "promotions")) if m["tree"] else "-"
        speed = f" ({base / m['ttft_mean_s']:.2f}x)" if base else ""
        lines.append(f"{name} {m['label']:<29}{m['ttft_mean_s']:>9.3f}s{m['ttft_p90_s']:>6.2f}s"
                     f"{m['queued_ttft_mean_s']:>7.2f}s{m['queued_ttft_p90_s']:>6.2f}s"
                     f"{m['prefill_tokens_per_request']:>8.0f}{m['cached_share']:>7.1%}{m['em']:>6.1f}{m['f1']:>6.1f}"
                     f"{m['plan_ms']:>6.2f}m{m['order_overhead_ms']:>6.2f}m{m.get('recomputed_per_request', 0):>7.0f}"
                     + (f"{m['identical']:>6.1f}%{m['kl']:>7.3f}{m['f1_exact']:>6.1f}" if "kl" in m else f"{'-':>7}{'-':>7}{'-':>6}")
                     + f"  {tiers}, {tree}{speed}")
    return "\n".join(lines)


#: Llama-architecture shapes for GPU timing with random weights (the SmolLM2 tokenizer and vocab).
RANDOM_LLAMAS: dict[str, dict[str, int]] = {
    "random-llama-1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                        "num_attention_heads": 32, "num_key_value_heads": 8},
    "random-llama-8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                        "num_attention_heads": 32, "num_key_value_heads": 8},
}


def load(args: argparse.Namespace) -> Any:
    """The model to serve: the embedded SmolLM2 (float32) or a random-weight Llama (bfloat16)
    with SmolLM2's tokenizer from ``--tokenizer`` (answers are noise; timings are what count)."""
    import torch

    from slimrag.llm.weights import LoadedModel, load_model

    if args.model == "smollm2":
        return load_model(device=args.device)
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    t = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    config = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=8192, rope_theta=500000.0,
                         **RANDOM_LLAMAS[args.model])
    torch.manual_seed(args.seed)
    with torch.device(args.device):
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    return LoadedModel(model, tokenizer, time.perf_counter() - t, False, Path(args.tokenizer), args.device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="60-question smoke run (grouped, 9 passages)")
    add_workload_args(ap)
    ap.add_argument("--modes", default="abcd", help="letters of bench.gen_modes; e = blend, one per --recompute")
    ap.add_argument("--recompute", default="none,boundary:8,deviation:0.15,boundary:8+deviation:0.15",
                    help="comma-separated recompute policies of the blend modes (e1, e2, ...)")
    ap.add_argument("--warmup", type=int, default=0, help="arrivals served untimed first (steady state)")
    ap.add_argument("--burst", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=10)
    ap.add_argument("--host-mib", type=int, default=256)
    ap.add_argument("--disk-mib", type=int, default=512)
    ap.add_argument("--device-mib", type=int, default=0, help="device-tier budget when the model runs on a GPU")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default="smollm2", choices=["smollm2", *RANDOM_LLAMAS])
    ap.add_argument("--tokenizer", help="folder with SmolLM2's tokenizer files (random-llama models)")
    ap.add_argument("--requests-file", type=Path, help="read the arrivals from this file (see --dump-requests)")
    ap.add_argument("--dump-requests", type=Path, help="write the workloads' arrivals to this file and exit")
    ap.add_argument("--limit", type=int, default=0, help="serve only the first N arrivals of each workload")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--report", type=Path, help="print the tables of a results file (partial or whole) and exit")
    from bench import gen_chat

    gen_chat.add_args(ap)
    args = ap.parse_args()
    if args.report:
        for workload, result in json.loads(args.report.read_text())["workloads"].items():
            print(gen_chat.table(result) if workload == "multiturn" else table(workload, result))
        return
    if args.quick:
        args.workloads, args.passages = "grouped", 9
    if args.dump_requests:
        dump_requests(args, args.dump_requests)
        print(f"wrote {args.dump_requests}")
        return
    import torch

    torch.set_num_threads(args.threads)
    model = load(args)
    gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else None
    out: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "torch_threads": args.threads,
                                       "python": platform.python_version(), "torch": torch.__version__,
                                       "gpu": gpu, "model": args.model, "loadavg_start": os.getloadavg()},
                           "args": {k: str(v) for k, v in vars(args).items()}, "workloads": {}}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def checkpoint(workload: str, result: dict[str, Any]) -> None:
        out["workloads"][workload] = result
        out["machine"]["loadavg_end"] = os.getloadavg()
        args.out.write_text(json.dumps(out, indent=1))

    for workload in args.workloads.split(","):
        if workload == "multiturn":
            result = gen_chat.run(args, model, lambda r: checkpoint("multiturn", r))
            print(gen_chat.table(result), flush=True)
            continue
        result = run(args, workload, model, lambda r, w=workload: checkpoint(w, r))
        print(table(workload, result), flush=True)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
