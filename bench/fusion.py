"""Benchmark: which fusion should hybrid search use? RRF, RRF with a keyword margin rule, convex.

``python -m bench.fusion`` (same corpora and options as `bench.retrieval`: ``--questions 300
--pydocs 3000``): for each question the vector and the keyword candidates (50 each, as hybrid
search fetches them) are computed once, then every strategy of `slimrag.index.fusion` fuses the
same two lists, so the rows differ only by fusion. Measured: gold source in the top 5 and top 1,
and, for the margin rule, how often it fired (the keyword top hit moved first). Prints a table and
writes ``bench/results/fusion.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench.retrieval import CORPORA
from slimrag.config import SearchConfig
from slimrag.index.fusion import Ranked, convex, convex_margin, decisive, rrf, rrf_margin

RESULTS = Path(__file__).resolve().parent / "results" / "fusion.json"

def _margin(v: Ranked, w: Ranked, margin: float) -> Ranked:
    return rrf_margin(v, w, margin=margin)


STRATEGIES: dict[str, Callable[[Ranked, Ranked], Ranked]] = {
    "rrf": lambda v, w: rrf([v, w]),
    **{f"margin:{m:g}": partial(_margin, margin=m) for m in (1.5, 2.0, 3.0, 4.0)},
    **{f"convex:{a:g}": partial(convex, alpha=a) for a in (0.3, 0.4, 0.5, 0.6, 0.7)},
    **{f"convex:{a:g}+margin:2": partial(convex_margin, alpha=a, margin=2.0) for a in (0.3, 0.4, 0.5, 0.6)},
}


def candidates(idx: Any, questions: list[tuple[str, str]], n: int) -> tuple[list[tuple[Ranked, Ranked, str]],
                                                                             dict[int, str]]:
    """(vector list, keyword list, gold source) per question, and the source of every chunk seen."""
    out, source = [], {}
    for q, gold in questions:
        lists = [idx.search(q, k=n, mode=mode) for mode in ("vector", "keyword")]
        source.update((h.chunk_id, h.source) for hits in lists for h in hits)
        out.append(([(h.chunk_id, h.score) for h in lists[0]], [(h.chunk_id, h.score) for h in lists[1]], gold))
    return out, source


def measure(cands: list[tuple[Ranked, Ranked, str]], source: dict[int, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, fn in STRATEGIES.items():
        top1 = top5 = 0
        for v, w, gold in cands:
            srcs = [source.get(cid) for cid, _ in fn(v, w)[:5]]
            top5 += gold in srcs
            top1 += bool(srcs) and srcs[0] == gold
        row: dict[str, Any] = {"top1": top1 / len(cands), "top5": top5 / len(cands), "n": len(cands)}
        if name.startswith("margin:"):
            m = float(name.split(":")[1])
            fired = [(w, gold) for v, w, gold in cands if decisive(w, m) is not None]
            row["fired"] = len(fired) / len(cands)
            row["fired_right"] = (sum(source.get(w[0][0]) == gold for w, gold in fired) / len(fired)) if fired else None
        out[name] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpora", default="disfl_qa,pydocs,tests")
    ap.add_argument("--questions", type=int, default=300)
    ap.add_argument("--pydocs", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    res: dict[str, Any] = {"args": vars(args), "machine": platform.platform(), "corpora": {}}
    for name in args.corpora.split(","):
        idx, questions = CORPORA[name](args)
        res["corpora"][name] = measure(*candidates(idx, questions, SearchConfig().candidates))
        idx.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1, default=str))
    corpora = list(res["corpora"])
    print(f"{'fusion':20} " + "  ".join(f"{c + ' top5/top1':>20}" for c in corpora) + "  fired (right)")
    for name in STRATEGIES:
        cells = "  ".join(f"{res['corpora'][c][name]['top5']:10.3f} / {res['corpora'][c][name]['top1']:.3f}"
                          for c in corpora)
        fired = "  ".join(f"{res['corpora'][c][name]['fired']:.2f} ({res['corpora'][c][name]['fired_right'] or 0:.2f})"
                          for c in corpora) if name.startswith("margin:") else ""
        print(f"{name:20} {cells}  {fired}")


if __name__ == "__main__":
    main()
