"""Cached-token share of the ``bench.generation`` modes under a byte budget, without a model.

``python -m bench.gen_sim`` replays a workload's prompts (same questions, same top-k passages,
same token counts, same bursts as ``bench.generation``) through size-only knowledge trees with the
benchmark's host and disk budgets and SmolLM2-135M's float32 KV size (46,080 bytes per token), for
each serving order (b relevance, c ContextPilot, d slimrag planner + longest-cached-prefix-first)
and each eviction policy. It answers in seconds what the model run answers in an hour: which
share of prompt tokens a mode can skip at a given budget, and how much of that is the policy's and
how much the order's. TTFT is not simulated.

Prints one table per workload and writes ``bench/results/gen_sim.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

from bench.qa_workload import add_workload_args, requests, token_counter  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "gen_sim.json"
KV_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4  # K and V x layers x kv heads x head dim x float32


class TreeView:
    """The planner's view of a simulated tree (what ``LocalGenerator.planning_cache`` gives)."""

    def __init__(self, tree: Any) -> None:
        self.tree = tree

    def root_key(self, prompt: Any) -> str:
        return prompt.system_key()

    def walk(self, root: str, choose: Any) -> tuple[list[str], int]:
        return self.tree.walk(root, choose)


def admit(tree: Any, prompt: Any, count: Any) -> tuple[int, int]:
    """Serve one prompt through a simulated tree: match its path of segment keys, then insert the
    segments it missed (the question segment is never cached). Returns (prompt tokens, cached tokens)."""
    from slimrag.llm.kv.payload import SegmentKV

    segs = prompt.segments()
    lengths = [count(s.text) for s in segs]
    keys = [s.key for s in segs[1:-1]]
    with tree.matching(segs[0].key, keys) as m:
        tree.insert(segs[0].key, keys, [SegmentKV.simulated(n, KV_BYTES_PER_TOKEN) for n in lengths[len(m.nodes):-1]])
    return sum(lengths), m.tokens


def orders(mode: str, burst: list[Any], view: TreeView) -> Any:
    """The burst's prompts in service order, lazily (mode d plans against the tree as it is when
    each request is admitted)."""
    from bench.gen_modes import pilot_prompts, relevance_prompt
    from slimrag.llm.engine.scheduler import pick_next
    from slimrag.rag.plan import plan_prompt

    if mode == "b":
        yield from (relevance_prompt(r) for r in burst)
    elif mode == "c":
        from contextpilot.server.live_index import ContextPilot

        if not hasattr(orders, "pilot"):
            orders.pilot = ContextPilot(use_gpu=False)  # type: ignore[attr-defined]
        with contextlib.redirect_stdout(io.StringIO()):
            reordered, schedule = orders.pilot.reorder([[p.key for p in r.ranked] for r in burst])  # type: ignore[attr-defined]
        yield from (prompt for _, prompt in pilot_prompts(burst, reordered, schedule))
    else:
        waiting = list(burst)
        while waiting:
            plans = [plan_prompt(r.question, r.ranked, view) for r in waiting]
            i = pick_next([0.0] * len(waiting), [lambda p=p: p.cached_tokens for _, p in plans], 0.0, float("inf"))
            waiting.pop(i)
            yield plans[i][0]


def replay(reqs: list[Any], mode: str, policy: str, host_mib: int, disk_mib: int, burst: int,
           count: Any) -> dict[str, float]:
    """Serve ``reqs`` in bursts through one simulated tree; the cached share and tier activity."""
    from slimrag.llm.kv.config import CacheConfig
    from slimrag.llm.kv.tree import KVTree

    if mode == "c":
        with contextlib.suppress(AttributeError):
            del orders.pilot  # type: ignore[attr-defined]  # a fresh ContextPilot per replay
    tree = KVTree.simulated(CacheConfig(host_bytes=host_mib << 20, disk_bytes=disk_mib << 20, policy=policy))
    view, total, cached = TreeView(tree), 0, 0
    for start in range(0, len(reqs), burst):
        for prompt in orders(mode, reqs[start:start + burst], view):
            tokens, hit = admit(tree, prompt, count)
            total, cached = total + tokens, cached + hit
    stats = tree.stats()
    tree.close()
    return {"cached_share": cached / total, "prefill_tokens": (total - cached) / len(reqs),
            **{f.name: getattr(stats, f.name) for f in dataclasses.fields(stats) if f.name != "tiers"}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_workload_args(ap)
    ap.add_argument("--burst", type=int, default=8)
    ap.add_argument("--budgets", default="256+512,512+1024,100000+0", help="host+disk MiB pairs")
    ap.add_argument("--policies", default="lru,gdsf")
    ap.add_argument("--modes", default="bcd")
    args = ap.parse_args()
    count = token_counter()

    result: dict[str, Any] = {}
    for workload in args.workloads.split(","):
        reqs = [r for r, _ in requests(args, workload)]
        rows = result[workload] = {}
        print(f"{workload} ({len(reqs)} requests, bursts of {args.burst}): cached-token share")
        print(f"  {'budget MiB host+disk':<22}" + "".join(f"{m + ' ' + p:>11}" for m in args.modes
                                                          for p in args.policies.split(",")))
        for budget in args.budgets.split(","):
            host, disk = (int(x) for x in budget.split("+"))
            line = f"  {budget:<22}"
            for mode in args.modes:
                for policy in args.policies.split(","):
                    r = rows[f"{budget} {mode} {policy}"] = replay(reqs, mode, policy, host, disk, args.burst, count)
                    line += f"{r['cached_share']:>11.1%}"
            print(line, flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
