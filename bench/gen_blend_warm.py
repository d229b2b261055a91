"""Blend reuse when every passage has an entry: TTFT of one warm request against no reuse.

``python -m bench.gen_blend_warm`` builds prompts shaped like the disfl_qa ones (system, 4 passages
of ~160 tokens, a ~75-token question segment), stores every passage's entry once, then serves
permutations of the passages (so exact prefix reuse serves only the system segment and the first
passage) in no reuse and in blend mode for each ``--recompute`` policy, interleaved, and prints
mean TTFT per mode (engine usage ``ttft_s``) and tokens computed. This is the steady state's best
case: no passage unseen. ``--per-segment`` adds, for each policy, a mode that runs its recompute
set one forward per segment (the schedule every policy used before; now only ``all`` does), to
measure the one-forward schedule within one run. Writes ``bench/results/gen_blend_warm.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

WORDS = ("river stone cat moon paper green seven blue house tree light harbour lamp tower winter apple "
         "clock bridge violin garden the of and a to in is was for on with by").split()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recompute", default="none,boundary:8+deviation:0.15,deviation:0.5")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--per-segment", action="store_true", help="also each policy with one forward per segment")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "gen_blend_warm.json")
    args = ap.parse_args()
    import torch

    from slimrag.config import GenerationConfig
    from slimrag.llm.kv.config import CacheConfig
    from slimrag.llm.local import LocalGenerator
    from slimrag.llm.weights import load_model
    from slimrag.prompt import Passage, Prompt

    torch.set_num_threads(1)
    model = load_model(device="cpu")
    rng = random.Random(0)
    passages = [Passage(f"p{i}", f"doc/{i}.md#0", " ".join(rng.choice(WORDS) for _ in range(150)) + ".")
                for i in range(4)]
    question = "Which object is named right after the old bridge in these notes, and why? " * 3
    cfg = GenerationConfig(max_new_tokens=1)
    gens = {"a no reuse": LocalGenerator(loaded=model, cache=None)}
    for policy in args.recompute.split(","):
        gens[f"blend {policy}"] = LocalGenerator(loaded=model, cache=CacheConfig(reuse="blend", recompute=policy))
        if args.per_segment:
            gen = LocalGenerator(loaded=model, cache=CacheConfig(reuse="blend", recompute=policy))
            gen.reuse.policy.exact = True  # type: ignore[attr-defined]  # forces the per-segment schedule
            gens[f"blend {policy} (per segment)"] = gen
    for name, gen in gens.items():  # store every entry: each passage first once
        if name != "a no reuse":
            for p in passages:
                gen.generate(Prompt(question, (p,)), cfg)
    orders = [o for o in itertools.permutations(passages) if o[0] is passages[0]][1:]
    rows: dict[str, list[tuple[float, int, int]]] = {n: [] for n in gens}
    for r in range(args.rounds):
        prompt = Prompt(question, orders[r % len(orders)])
        for name in list(gens)[r % len(gens):] + list(gens)[: r % len(gens)]:
            u = gens[name].generate(prompt, cfg).usage
            rows[name].append((u.ttft_s, u.prompt_tokens - u.cached_tokens, u.recomputed_tokens))
    base = statistics.mean(t for t, _, _ in rows["a no reuse"])
    out = {}
    print(f"{'mode':<36}{'TTFT':>8}{'computed':>10}{'recomp':>8}  speed-up")
    for name, rs in rows.items():
        ttft = statistics.mean(t for t, _, _ in rs)
        out[name] = {"ttft_mean_s": ttft, "computed": statistics.mean(c for _, c, _ in rs),
                     "recomputed": statistics.mean(x for _, _, x in rs), "speedup": base / ttft}
        print(f"{name:<36}{ttft:>7.2f}s{out[name]['computed']:>10.0f}{out[name]['recomputed']:>8.0f}  {base / ttft:.2f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"loadavg": os.getloadavg(), "modes": out}, indent=1))


if __name__ == "__main__":
    main()
