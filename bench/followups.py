"""Benchmark: do chat follow-ups keep the subject? Turn-2 retrieval with and without condensing.

``python -m bench.followups`` (``--conversations 200 --k 5``).

The multi-turn set is made from disfl_qa (`bench.qa_workload.passages_and_questions`): for a
passage with two questions that name the same entity (a capitalised span, not the first word, at
least 4 characters: "Normans", "Super Bowl 50"), turn 1 is the first question as written and turn 2
is the second with every mention of that entity replaced by a pronoun ("they" for a one-word
plural such as "Normans", else "it"; "its"/"their" for a possessive). Turn 2 then depends on turn 1 the way a person's follow-up does: the subject is
only in turn 1. The gold passage of turn 2 is the passage both questions were written about.
Conversations are a seeded sample; ``--show 5`` prints some to read.

Rows (gold passage among the top ``k`` of hybrid search, the default mode; and in the top 1):

- ``original``: turn 2 with its entity (the ceiling: what a perfect rewrite would get);
- ``alone``: turn 2 as the user wrote it, without context;
- ``merge``: the pipeline before issue 19, the better-scored of ``alone`` and "turn 1 + turn 2";
- ``words``: the condensed query of `slimrag.rag.condense.with_words` (the default);
- ``words+alone``: ``words`` merged with ``alone`` by score.

Prints a table and writes ``bench/results/followups.json``.
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

from bench.qa_workload import flat_index, passages_and_questions  # noqa: E402
from slimrag.rag.condense import with_words  # noqa: E402
from slimrag.rag.pipeline import merge_hits  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "followups.json"
_ENTITY = re.compile(r"(?<!^)(?<![.?!] )\b([A-Z][\w'-]*(?: (?:of |the )?[A-Z0-9][\w'-]*)*)")


def entities(question: str) -> set[str]:
    """Capitalised spans of ``question`` that are not its first word, 4 characters or more."""
    return {m.group(1) for m in _ENTITY.finditer(question) if m.start() > 0 and len(m.group(1)) >= 4}


def its(m: re.Match[str]) -> str:
    return "its" if m.group(1) else "it"


def their(m: re.Match[str]) -> str:
    return "their" if m.group(1) else "they"


def conversations(n: int, seed: int) -> list[dict[str, Any]]:
    """Up to ``n`` (turn 1, turn 2 with a pronoun, original turn 2, gold source) conversations."""
    _, by_passage = passages_and_questions()
    rng = random.Random(seed)
    out = []
    for pid in sorted(by_passage):
        qas = by_passage[pid]
        pairs = [(a, b) for a in qas for b in qas if a is not b]
        rng.shuffle(pairs)
        for a, b in pairs:
            shared = sorted(entities(a.question) & entities(b.question), key=len, reverse=True)
            if not shared:
                continue
            e = shared[0]
            pronoun = "they" if " " not in e and e.endswith("s") and not e.endswith("ss") else "it"
            follow = re.sub(r"\b" + re.escape(e) + r"\b( ' s|'s)?",
                            (its if pronoun == "it" else their), b.question)
            if follow != b.question:
                out.append({"turn1": a.question, "turn2": follow, "original": b.question, "entity": e,
                            "gold": f"disfl_qa/{pid:04d}.txt"})
                break
    rng.shuffle(out)
    return out[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--conversations", type=int, default=200)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    convs = conversations(args.conversations, args.seed)
    for c in convs[: args.show]:
        print(json.dumps(c))
    idx = flat_index()
    k = args.k

    def search(q: str) -> list[Any]:
        return idx.search(q, k=k, mode="hybrid")

    ways = {
        "original": lambda c: search(c["original"]),
        "alone": lambda c: search(c["turn2"]),
        "merge": lambda c: merge_hits(search(c["turn2"]), search(f"{c['turn1']} {c['turn2']}"), k=k),
        "words": lambda c: search(with_words(c["turn2"], [c["turn1"]])),
        "words+alone": lambda c: merge_hits(search(c["turn2"]), search(with_words(c["turn2"], [c["turn1"]])), k=k),
    }
    res: dict[str, Any] = {"args": vars(args), "machine": platform.platform(), "load_before": os.getloadavg(),
                           "n": len(convs), "rows": {}}
    for name, fn in ways.items():
        top5 = top1 = 0
        for c in convs:
            srcs = [h.source for h in fn(c)]
            top5 += c["gold"] in srcs
            top1 += bool(srcs) and srcs[0] == c["gold"]
        res["rows"][name] = {f"top{k}": top5 / len(convs), "top1": top1 / len(convs)}
        print(name, json.dumps(res["rows"][name]), flush=True)
    res["load_after"] = os.getloadavg()
    idx.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1, default=str))
    print(f"{'query':12} {'top' + str(k):>6} {'top1':>6}   (n={len(convs)} conversations)")
    for name, r in res["rows"].items():
        print(f"{name:12} {r[f'top{k}']:6.3f} {r['top1']:6.3f}")


if __name__ == "__main__":
    main()
