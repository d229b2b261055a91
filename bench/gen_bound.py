"""How much prefill can any cache skip on a workload? Ceilings for ``bench.generation``.

``python -m bench.gen_bound`` replays a workload's prompts (same questions, same top-k passages,
same token counts as ``bench.generation``) through size-only caches with unlimited memory and
reports the cached-token share each could reach, and the TTFT speed-up that share allows if
prefill time were proportional to the tokens computed (an optimistic ceiling: it ignores the
fixed cost of a forward and the question segment's attention over the cached context):

- ``prefix, relevance order``: what mode b could reach with unlimited memory.
- ``prefix, planner (greedy)``: the slimrag planner, unlimited memory, arrival order.
- ``prefix, hindsight``: for each request the longest cached path over *all* orders of its
  passages (exhaustive search), unlimited memory: no exact-prefix planner can do better in this
  arrival order.
- ``any seen passage``: every passage retrieved before counts as cached wherever it sits
  (position-independent reuse à la CacheBlend, which is *not* exact): the ceiling of any reuse.

- ``any seen, boundary:k`` / ``any seen, deviation:r``: the same, less the tokens blend reuse
  computes again (``--recompute``): k tokens, or the fraction r, of every reused passage that
  does not stand right after the system segment (there an entry is exact and nothing is
  recomputed; the best case puts a seen passage there).

The system segment counts as cached after the first request; the question segment never does.
``--after N`` counts only requests from the N-th on (the caches still see every request): the
steady state of a long workload, e.g. ``--workloads zipf --zipf-n 1000 --zipf-passages 300
--after 200`` (issue 9's steady-state workload). Prints a table and writes
``bench/results/gen_bound.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

from bench.qa_workload import add_workload_args, requests, token_counter  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "gen_bound.json"


def shares(reqs: list[Any], count: Any, after: int = 0, recompute: tuple[str, ...] = ()) -> dict[str, float]:
    from bench.gen_sim import TreeView, admit
    from slimrag.llm.kv.config import CacheConfig
    from slimrag.llm.kv.tree import KVTree
    from slimrag.prompt import Prompt
    from slimrag.rag.plan import plan_prompt

    def hindsight(tree: KVTree, root: str, keys: set[str]) -> list[str]:
        def dfs(node: Any, rest: set[str]) -> tuple[list[str], int]:
            best: tuple[list[str], int] = ([], 0)
            for k in rest:
                child = node.children.get(k)
                if child is not None:
                    path, tokens = dfs(child, rest - {k})
                    if tokens + child.tokens > best[1]:
                        best = ([k, *path], tokens + child.tokens)
            return best

        node = tree._sentinel.children.get(root)  # read-only peek for the exhaustive search
        return dfs(node, keys)[0] if node is not None else []

    out = {}
    for name in ("prefix, relevance order", "prefix, planner (greedy)", "prefix, hindsight"):
        tree = KVTree.simulated(CacheConfig(host_bytes=1 << 50))
        view, total, cached = TreeView(tree), 0, 0
        for i, r in enumerate(reqs):
            if name.endswith("relevance order"):
                prompt = plan_prompt(r.question, r.ranked, None)[0]
            elif name.endswith("(greedy)"):
                prompt = plan_prompt(r.question, r.ranked, view)[0]
            else:
                base = Prompt(r.question, r.ranked)
                by = {base.passage_key(p): p for p in r.ranked}
                path = hindsight(tree, base.system_key(), set(by))
                order = [by[k] for k in path] + [p for p in r.ranked if base.passage_key(p) not in path]
                prompt = Prompt(r.question, tuple(order), ranking=tuple(p.key for p in r.ranked))
            tokens, hit = admit(tree, prompt, count)
            if i >= after:
                total, cached = total + tokens, cached + hit
        out[name] = cached / total
    seen: set[str] = set()
    policies = {"any seen passage": None, **{f"any seen, {p}": p for p in recompute}}
    totals = dict.fromkeys(policies, 0)
    hits = dict.fromkeys(policies, 0)
    for i, r in enumerate(reqs):
        segs = plan_prompt(r.question, r.ranked, None)[0].segments()
        lengths = [count(s.text) for s in segs]
        reused = sorted((n for s, n in zip(segs[1:-1], lengths[1:-1], strict=True) if s.key in seen), reverse=True)
        seen.update(str(s.key) for s in segs[1:-1])
        if i < after:
            continue
        for name, policy in policies.items():
            # the longest reused passage stands right after the system segment: exact, never recomputed
            again = sum(_recomputed(policy, n) for n in reused[1:])
            hits[name] += (lengths[0] if i else 0) + sum(reused) - again
            totals[name] += sum(lengths)
    out.update({name: hits[name] / totals[name] for name in policies})
    return out


def _recomputed(policy: str | None, tokens: int) -> int:
    """Tokens of a reused passage of ``tokens`` tokens that ``policy`` computes again (``none``,
    ``all``, ``boundary:k``, ``deviation:r`` and their unions, counted as a sum: an upper bound)."""
    if policy is None:
        return 0
    total = 0
    for part in policy.split("+"):
        name, _, arg = part.partition(":")
        total += _RECOMPUTED[name](arg, tokens)
    return min(total, tokens)


#: policy name -> (argument, passage tokens) -> tokens it computes again.
_RECOMPUTED = {
    "none": lambda arg, n: 0,
    "all": lambda arg, n: n,
    "boundary": lambda arg, n: min(n, int(arg)),
    "deviation": lambda arg, n: math.ceil(float(arg) * n),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_workload_args(ap)
    ap.add_argument("--after", type=int, default=0, help="count only requests from the N-th on (steady state)")
    ap.add_argument("--recompute", default="boundary:8,deviation:0.15,deviation:0.5",
                    help="blend recompute policies to account for (comma-separated)")
    args = ap.parse_args()
    count = token_counter()

    result = {}
    for workload in args.workloads.split(","):
        reqs = [r for r, _ in requests(args, workload)]
        key = f"{workload} ({len(reqs)} requests, after {args.after})" if args.after else workload
        result[key] = shares(reqs, count, args.after, tuple(p for p in args.recompute.split(",") if p))
        counted = f"{len(reqs) - args.after} of {len(reqs)}" if args.after else str(len(reqs))
        print(f"{workload} ({counted} requests): cached-token share ceiling, TTFT speed-up ceiling")
        for name, share in result[key].items():
            print(f"  {name:<28}{share:7.1%}{1 / (1 - share):7.2f}x")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    RESULTS.write_text(json.dumps({**old, **result}, indent=1))  # one workload at a time keeps the others


if __name__ == "__main__":
    main()
