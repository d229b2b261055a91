"""Benchmark: does attribution flag what the passages do not say? Precision and recall of the
"unsupported" flag (`slimrag.rag.attribution`) on a labelled set.

``python -m bench.attribution`` (``--questions 200 --k 4``). For each QA set of `bench.qa_sets`,
the questions whose gold answer is a number or a name (it has `key_terms`) and whose gold passage
is retrieved (hybrid search, ``k`` passages) give four labelled answers:

- supported, ``quote``: the passage sentence that holds the gold answer, as an answer that quotes
  its passage (what the "quote" prompt asks a model to write);
- supported, ``short``: "The answer is GOLD." (a short answer, what the "short-first" prompt asks for);
- unsupported, ``quote-swapped`` and ``short-swapped``: the same two with the gold answer replaced
  by the gold answer of another question of the same set and kind (a number for a number, a name
  for a name) that appears in none of the retrieved passages: the edit issue 19 asks for, "swap
  numbers and names", which leaves a fluent, similar, wrong sentence.

``--answers FILE`` adds real model answers from a `bench.answers` JSON (``llm.answers``): those that
contain the gold answer are labelled supported only when they hold no number or name outside the
passages and the question (checked by hand for the figures in docs/benchmarks.md), and each is
swapped as above into an unsupported one.

For every threshold of `THRESHOLDS` it reports precision and recall of "unsupported" (a flagged
sentence is one with ``supported=False``), per set and kind. Prints a table and writes
``bench/results/attribution.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

from bench.qa_sets import SETS, load  # noqa: E402
from bench.qa_workload import normalize  # noqa: E402
from slimrag.rag.attribution import attribute  # noqa: E402
from slimrag.rag.evidence import Candidates  # noqa: E402
from slimrag.rag.sentences import key_terms  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "attribution.json"
THRESHOLDS = (0.3, 0.35, 0.4, 0.45, 0.5, 0.55)


def kind(answer: str) -> str | None:
    """"number" when the answer holds a digit, "name" when it has a capitalised word, else None."""
    if any(c.isdigit() for c in answer):
        return "number"
    if any(w[:1].isupper() for w in answer.split()):
        return "name"
    return None


def swap(text: str, gold: str, other: str) -> str | None:
    """``text`` with ``gold`` replaced by ``other`` (case-insensitive, whole words), or None."""
    out, n = re.subn(r"(?<!\w)" + re.escape(gold) + r"(?!\w)", other, text, flags=re.I)
    return out if n else None


def labelled(name: str, n: int, k: int, seed: int) -> tuple[Any, list[dict[str, Any]]]:
    """The index of set ``name`` and its labelled answers (module header)."""
    idx, items = load(name, n, seed)
    rng = random.Random(seed)
    pool: dict[str, list[str]] = {}
    for it in items:
        kd = kind(it.answer)
        if kd is not None and key_terms(" x " + it.answer):
            pool.setdefault(kd, []).append(it.answer)
    rows = []
    for it in items:
        kd = kind(it.answer)
        if kd is None or not key_terms(" x " + it.answer):
            continue
        hits = idx.search(it.question, k=k, mode="hybrid")
        if it.source not in {h.source for h in hits}:
            continue
        gold = normalize(it.answer)
        quote = next((t for t in Candidates.of(hits).texts if gold in normalize(t)), None)
        if quote is None:
            continue
        joined = normalize(" ".join(h.text for h in hits))
        others = [o for o in pool[kd] if normalize(o) not in joined and normalize(o) != gold]
        if not others:
            continue
        other = rng.choice(others)
        short = f"The answer is {it.answer}."
        base = {"set": name, "question": it.question, "hits": hits}
        for label, text, supported in (("quote", quote, True), ("short", short, True),
                                       ("quote-swapped", swap(quote, it.answer, other), False),
                                       ("short-swapped", swap(short, it.answer, other), False)):
            if text is not None:
                rows.append({**base, "kind": label, "text": text, "supported": supported})
    return idx, rows


def score(rows: list[dict[str, Any]], flags: dict[float, list[bool]]) -> dict[str, Any]:
    out = {}
    truth = [not r["supported"] for r in rows]
    for t, flagged in flags.items():
        tp = sum(f and u for f, u in zip(flagged, truth, strict=True))
        fp = sum(f and not u for f, u in zip(flagged, truth, strict=True))
        fn = sum(u and not f for f, u in zip(flagged, truth, strict=True))
        out[str(t)] = {"precision": tp / (tp + fp) if tp + fp else None, "recall": tp / (tp + fn) if tp + fn else None,
                       "flagged": tp + fp, "unsupported": tp + fn, "n": len(rows)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--questions", type=int, default=200)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    res: dict[str, Any] = {"args": vars(args), "machine": platform.platform(), "load_before": os.getloadavg(),
                           "sets": {}}
    for name in args.sets.split(","):
        idx, rows = labelled(name, args.questions, args.k, args.seed)
        flags: dict[float, list[bool]] = {t: [] for t in THRESHOLDS}
        for r in rows:  # one check at the lowest threshold: a sentence passes threshold t when its
            # best backing sentence (found at the lowest) scores t or more and it names nothing unknown
            check = attribute(r["question"], r["text"], r["hits"], idx.embedder, threshold=min(THRESHOLDS))
            for t in THRESHOLDS:
                flags[t].append(any(not (s.supported and s.evidence and s.evidence[0].score >= t)
                                    for s in check.support))
        idx.close()
        res["sets"][name] = {"all": score(rows, flags),
                             "examples": [{k: v for k, v in r.items() if k != "hits"} for r in rows[:8]],
                             "by_kind": {kd: sum(r["kind"] == kd for r in rows)
                                         for kd in ("quote", "short", "quote-swapped", "short-swapped")}}
        print(name, json.dumps(res["sets"][name]["by_kind"]), flush=True)
    res["load_after"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1, default=str))
    print(f"{'set':13} {'threshold':>9} {'precision':>9} {'recall':>7} {'flagged':>8} {'unsupp':>7} {'n':>5}")
    for name, r in res["sets"].items():
        for t, m in r["all"].items():
            p = "-" if m["precision"] is None else f"{m['precision']:.3f}"
            rc = "-" if m["recall"] is None else f"{m['recall']:.3f}"
            print(f"{name:13} {t:>9} {p:>9} {rc:>7} {m['flagged']:>8} {m['unsupported']:>7} {m['n']:>5}")


if __name__ == "__main__":
    main()
