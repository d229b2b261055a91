"""Benchmark: do the answer guards (`slimrag.rag.guards`) cost answer quality, and what do they catch?

``python -m bench.guards`` (``--questions 20 --unanswerable 5 --max-new-tokens 48``):

- Questions: the first ``--questions`` arrivals of the ``grouped`` disfl_qa workload
  (`bench.qa_workload`, seed 0), each with its gold answer, retrieved from the flat index of all
  1,204 passages (built on first use), plus ``--unanswerable`` questions about things no passage
  covers (sports, cooking, cars...).
- Model: the embedded SmolLM2-135M-Instruct, greedy, ``--max-new-tokens`` new tokens, long
  enough for the model to cite (or invent) passage labels.
- Arms, each through `RAG.ask` with the same index and model: ``off`` = ``Guards(floor=None,
  citations="keep", stop_loops=False)`` (the pipeline before the guards); ``on`` = the defaults
  (floor 0.28, invented citations marked, loops stopped); ``remove`` = the defaults with
  ``citations="remove"``.
- Reported per arm: answer EM/F1 on the answerable questions (SQuAD normalisation, first line of
  the answer, as bench.generation scores); abstentions on answerable and on unanswerable
  questions (the second is the floor's job, the first its cost); model calls; invented citations
  detected (`Answer.unknown_citations`) and still present unmarked in the text; finish reasons.

Prints a table and writes ``bench/results/guards.json``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import re
import time
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

from bench.qa_workload import exact_match, f1, flat_index, grouped  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "guards.json"

#: Questions no disfl_qa passage answers (the corpus is Wikipedia paragraphs on SQuAD topics).
UNANSWERABLE = (
    "Who won the 1998 FIFA World Cup final?",
    "How long should I boil an egg for a soft yolk?",
    "What is the towing capacity of a 2015 Ford Ranger?",
    "How do I reset my home wifi router password?",
    "Which git version introduced sparse checkout?",
    "What's the best way to remove a red wine stain from a carpet?",
    "How many calories are in a banana?",
    "What time does the Louvre open on Sundays?",
)

_CITE = re.compile(r"\[([^\[\]\n]+#\d+)\]")


def arms() -> dict[str, Any]:
    from slimrag.rag.guards import Guards

    return {"off": Guards(floor=None, citations="keep", stop_loops=False), "on": Guards(),
            "remove": Guards(citations="remove")}


def first_line(text: str) -> str:
    return text.strip().split("\n")[0] if text.strip() else ""


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from slimrag.config import GenerationConfig
    from slimrag.llm.local import LocalGenerator
    from slimrag.rag.pipeline import RAG

    torch.set_num_threads(args.threads)
    questions = [(q.text, q.answer) for q in grouped(args.passages, args.seed)[: args.questions]]
    questions += [(q, None) for q in UNANSWERABLE[: args.unanswerable]]
    idx = flat_index()
    gen = LocalGenerator()
    gen.load()
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, repetition_penalty=gen.default_repetition_penalty)
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in arms()}
    for i, (question, gold) in enumerate(questions):
        for name, guards in arms().items():  # interleaved, so machine noise hits every arm alike
            rag = RAG(idx, gen, generation=config, guards=guards)
            t = time.perf_counter()
            ans = rag.ask(question, k=args.k)
            given = {h.label for h in ans.sources}
            unmarked = [c for c in _CITE.findall(ans.text) if c not in given]
            rows[name].append({
                "question": question, "gold": gold, "text": ans.text, "abstained": ans.abstained,
                "finish_reason": ans.finish_reason, "unknown_citations": list(ans.unknown_citations),
                "unmarked_invented": unmarked, "seconds": time.perf_counter() - t,
                "em": None if gold is None else exact_match(first_line(ans.text), gold),
                "f1": None if gold is None else f1(first_line(ans.text), gold),
            })
        print(f"{i + 1}/{len(questions)}", flush=True)
    idx.close()
    return {"args": vars(args), "machine": platform.platform(), "rows": rows,
            "summary": {name: summary(r) for name, r in rows.items()}}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    answerable = [r for r in rows if r["gold"] is not None]
    other = [r for r in rows if r["gold"] is None]
    n = max(1, len(answerable))
    return {
        "em": sum(r["em"] for r in answerable) / n,
        "f1": sum(r["f1"] for r in answerable) / n,
        "abstained_answerable": sum(r["abstained"] for r in answerable),
        "abstained_unanswerable": sum(r["abstained"] for r in other),
        "answerable": len(answerable), "unanswerable": len(other),
        "model_calls": sum(not r["abstained"] for r in rows),
        "invented_detected": sum(len(r["unknown_citations"]) for r in rows),
        "invented_unmarked": sum(len(r["unmarked_invented"]) for r in rows),
        "finish": dict(collections.Counter(r["finish_reason"] for r in rows)),
        "seconds": sum(r["seconds"] for r in rows),
    }


def table(res: dict[str, Any]) -> str:
    head = (f"{'arm':7} {'EM':>5} {'F1':>5} {'abst. ans.':>10} {'abst. unans.':>12} {'calls':>5} "
            f"{'invented':>8} {'unmarked':>8} {'seconds':>8}  finish")
    lines = [head, "-" * len(head)]
    for name, s in res["summary"].items():
        lines.append(f"{name:7} {s['em']:5.3f} {s['f1']:5.3f} {s['abstained_answerable']:>4}/{s['answerable']:<5} "
                     f"{s['abstained_unanswerable']:>6}/{s['unanswerable']:<5} {s['model_calls']:>5} "
                     f"{s['invented_detected']:>8} {s['invented_unmarked']:>8} {s['seconds']:8.1f}  {s['finish']}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--questions", type=int, default=20)
    ap.add_argument("--unanswerable", type=int, default=5)
    ap.add_argument("--passages", type=int, default=30, help="passages of the grouped workload to draw from")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    res = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1, default=str))
    print(table(res))


if __name__ == "__main__":
    main()
