"""Blend fidelity in the steady state: every passage has an entry, so every passage but the first is
placed, and only the recompute policy decides how close the answer stays to exact mode.

``python -m bench.gen_blend_fidelity`` (``--limit`` 10 requests of the ``grouped`` workload,
``--recompute`` policies): for each request, the entries of its passages are stored first (one
request per passage alone, as an earlier arrival would have), then the request is served in
blend mode once per policy, passages in relevance order, and compared with exact prefill of the
same prompt (``bench.gen_fidelity``: identical first answer line, mean KL teacher-forced over the
exact answer). All policies share one knowledge tree (``BlendReuse`` over one ``KVTree``), so
entries are computed once and every policy sees the same placed K/V. This is the fidelity side of
``bench.gen_blend_warm`` (the speed side of the same case); the ``grouped`` run of
``bench.generation`` measures both while the cache warms. Writes
``bench/results/gen_blend_fidelity.json``.
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

from bench.qa_workload import add_workload_args, requests  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_workload_args(ap)
    ap.add_argument("--limit", type=int, default=10, help="requests of the first workload to serve")
    ap.add_argument("--recompute", default="boundary:8,boundary:32,deviation:0.5,deviation:0.7,deviation:0.9")
    ap.add_argument("--max-new-tokens", type=int, default=10)
    ap.add_argument("--out", type=Path,
                    default=Path(__file__).resolve().parent / "results" / "gen_blend_fidelity.json")
    args = ap.parse_args()
    import torch

    from bench.gen_fidelity import Fidelity
    from bench.gen_modes import relevance_prompt
    from slimrag.config import GenerationConfig
    from slimrag.llm.kv.blend import BlendReuse
    from slimrag.llm.kv.config import CacheConfig
    from slimrag.llm.kv.tree import KVTree
    from slimrag.llm.local import LocalGenerator
    from slimrag.llm.weights import load_model
    from slimrag.prompt import Prompt

    torch.set_num_threads(1)
    model = load_model(device="cpu")
    tree = KVTree(CacheConfig(reuse="blend", host_bytes=1 << 30))
    policies = args.recompute.split(",")
    gens = {p: LocalGenerator(loaded=model, cache=BlendReuse(tree, "cpu", recompute=p)) for p in policies}
    fidelity = Fidelity(model, args.max_new_tokens)
    cfg = GenerationConfig(max_new_tokens=args.max_new_tokens, stop=("\n",))
    warm = gens[policies[0]]
    rows: dict[str, list[dict[str, float]]] = {p: [] for p in policies}
    t0 = time.perf_counter()
    arrivals = requests(args, args.workloads.split(",")[0])[: args.limit]
    for n, (req, _) in enumerate(arrivals):
        for passage in req.ranked:  # each passage alone first: its entry is stored
            warm.generate(Prompt(req.question, (passage,)), GenerationConfig(max_new_tokens=1))
        prompt = relevance_prompt(req)
        for policy, gen in gens.items():
            done = gen.generate(prompt, cfg)
            fid = fidelity.compare(gen, prompt, done.text.strip().split("\n")[0])
            rows[policy].append({"identical": fid["identical"], "kl": fid["kl"],
                                 "ttft_s": done.usage.ttft_s, "recomputed": done.usage.recomputed_tokens,
                                 "computed": done.usage.prompt_tokens - done.usage.cached_tokens})
        print(f"  {n + 1}/{len(arrivals)} requests, {time.perf_counter() - t0:.0f} s", flush=True)
    out = {p: {k: statistics.mean(r[k] for r in rs) for k in rs[0]} for p, rs in rows.items()}
    print(f"{'policy':<28}{'identical':>10}{'KL':>8}{'computed':>10}{'recomp':>8}{'TTFT':>8}")
    for p, m in out.items():
        print(f"{p:<28}{100 * m['identical']:>9.0f}%{m['kl']:>8.3f}{m['computed']:>10.0f}{m['recomputed']:>8.0f}"
              f"{m['ttft_s']:>7.2f}s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"requests": len(arrivals), "loadavg": os.getloadavg(), "policies": out,
                                    "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
