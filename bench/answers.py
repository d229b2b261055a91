"""Benchmark: answers you can check. Evidence sentences, model answers, and their latency, per QA set
and search mode.

``python -m bench.answers`` (``--questions 300 --k 4 --llm-questions 30``), on the QA sets of
`bench.qa_sets` (disfl_qa, nq_conflicts) and, named with ``--sets pydocs``, the folder of files of
`bench.pydocs_qa` (the Python docs as 497 files, 49 questions written from them), for each search
mode (vector, keyword, hybrid):

- ``retrieved``: the gold passage among the ``k`` retrieved;
- ``ev1`` / ``ev2``: among the questions whose gold passage was retrieved, the gold answer string
  (SQuAD-normalised, `bench.qa_workload.normalize`) inside the top-1 / top-2 evidence sentences
  (`slimrag.rag.evidence`); ``cos2``: the same for the top 2 by embedding cosine alone, the
  baseline issue 19 measured;
- ``evidence_ms``: the evidence-only answer (`slimrag.rag.evidence.evidence_answer`: retrieval,
  relevance floor, sentence ranking) per question, after the index is open: what
  ``slimrag ask --no-llm`` costs; ``evidence_cpu_ms`` the CPU time of the same (on a machine whose
  other processes take the cores, wall time measures them; one thread's CPU time measures us);
- with ``--llm-questions N`` (hybrid only, the first N questions): the embedded model's answer
  containing the gold answer, with the default system prompt and with each candidate of
  `PROMPTS`, and its latency per question.

- ``--recheck RUN.json``: the figures of a saved ``--reader`` run with today's check (`recheck`):
  greedy decoding makes the recorded model texts what the model writes again, so a change to the
  check is measured without the model; timings stay the run's.
- with ``--reader N`` (hybrid, the first N questions): what the reader sees, per answer mode (issue 29),
  every mode over the same questions in the same run (`reader_rows`). Modes: ``grounded`` (the
  default for the embedded model: the evidence lead, then the model's sentence, checked), ``free``
  (the model over the passages, checked: the baseline), and two candidates read off the same runs
  without another model call: ``phrase`` (extract-then-phrase: the grounded run's model sentence
  alone, without the lead, under the same verdict) and ``evidence`` (the evidence-only answer, the
  top sentences presented as the answer, no check). Per mode: ``shown_gold_retrieved`` (the shown
  answer, `Answer.shown`, contains the gold answer, among questions whose gold passage was
  retrieved), ``shown_gold`` (the same over all), ``confidently_wrong`` (presented as backed,
  verdict supported or partial, and the gold answer absent from what is shown), ``withheld_or_marked``
  (verdict not_backed or partial: an answer counts as flagged when any part of what is shown is
  withheld or marked), ``check_precision`` (of those, the share whose model text truly lacks the gold
  answer: the issue's figure), ``mark_precision`` (of those, the share whose withheld or marked text
  lacks it: the model text of a withheld answer, the marked sentences of a partial one; a partial
  answer whose gold value stands in a backed, cited sentence is no miss here), ``read_precision``
  (with ``--labels``: of those, the share that lacks the gold answer or whose flag a reader labelled
  right, the flagged text stating what no passage says; an unlabelled flag on a text holding the gold
  counts as a miss), ``abstained`` (below the relevance floor), the median first byte (``ttfb_s``:
  the first text piece a reader sees, from the call) and total time (``total_s``).
- ``--labels FILE`` (`LABELS`): hand labels of flagged answers whose model text holds the gold string,
  keyed ``set|mode|question``: ``right`` (what is withheld or marked states something no passage
  says: a wrong director beside the right actor) or ``wrong`` (the text is backed and answers: the
  check erred), alone or as ``{"label": ..., "reason": ..., "text": ...}`` with what the reader found
  and the model text read (`label_of`: a label read on another text counts for nothing).
  Labels are read, never written, by the benchmark.

``--tune`` chooses the evidence weights instead: it computes the features once for the questions
of the first set (disfl_qa) in hybrid mode, scores every weight vector of a small grid (cosine
fixed at 1, the others in `GRID`), and prints the best ones with their top-2 figure on that set and
on the second set (nq_conflicts), which had no say in the choice.

Prints a table and writes ``bench/results/answers.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import numpy as np  # noqa: E402

from bench.pydocs_qa import pydocs, pydocs_html  # noqa: E402
from bench.qa_sets import SETS, Item  # noqa: E402
from bench.qa_workload import normalize  # noqa: E402
from slimrag.rag.evidence import FEATURES, Candidates, Weights, features  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "answers.json"
#: Hand labels of the check's flags on gold-holding answers (module header, ``--labels``).
LABELS = Path(__file__).resolve().parent / "check_labels.json"
#: Every set ``--sets`` may name: the QA sets of `bench.qa_sets` and the folder of files (`bench.pydocs_qa`,
#: ``pydocs``: its index is built on first use, minutes, so it is not among the defaults).
ALL_SETS = {**SETS, "pydocs": pydocs, "pydocs_html": pydocs_html}
MODES = ("vector", "keyword", "hybrid")
#: Values tried for each weight but the cosine's (fixed at 1) by ``--tune``.
GRID = (0.0, 0.25, 0.5, 1.0, 2.0)


@dataclass
class Case:
    """One question's evidence candidates: features, and which sentences hold the gold answer."""

    feats: np.ndarray
    gold_in: np.ndarray  # bool per sentence
    cos_order: np.ndarray


def load(name: str, n: int | None = None, seed: int = 0) -> tuple[Any, list[Item]]:
    """The index of set ``name`` (`ALL_SETS`) and ``n`` of its items (a seeded sample; all when None or
    when the set has no more)."""
    idx, items = ALL_SETS[name]()
    if n is not None and n < len(items):
        items = random.Random(seed).sample(items, n)
    return idx, items


def collect(idx: Any, items: list[Item], mode: str, k: int) -> tuple[list[Case], int]:
    """Cases for the questions whose gold passage is retrieved, and how many were retrieved."""
    cases: list[Case] = []
    for it in items:
        hits = idx.search(it.question, k=k, mode=mode)
        if it.source not in {h.source for h in hits}:
            continue
        cands = Candidates.of(hits)
        vecs = np.asarray(idx.embedder.embed([it.question, *cands.texts]), dtype=np.float64)
        f = features(it.question, hits, cands, vecs[0], vecs[1:])
        gold = normalize(it.answer)
        inside = np.array([gold in normalize(t) for t in cands.texts], dtype=bool)
        cases.append(Case(f, inside, np.argsort(-f[:, 0], kind="stable")))
    return cases, len(cases)


def top_share(cases: list[Case], w: np.ndarray, n: int) -> float:
    """Share of cases whose gold answer is in the top ``n`` sentences by ``features @ w``."""
    if not cases:
        return 0.0
    hit = 0
    for c in cases:
        order = np.argsort(-(c.feats @ w), kind="stable")
        hit += bool(c.gold_in[order[:n]].any())
    return hit / len(cases)


def tune(args: argparse.Namespace) -> dict[str, Any]:
    names = args.sets.split(",")
    data = {}
    for name in names:
        idx, items = load(name, args.questions, args.seed)
        data[name] = collect(idx, items, "hybrid", args.k)[0]
        idx.close()
    dev, *held = names
    rows = []
    for rest in itertools.product(GRID, repeat=len(FEATURES) - 1):
        w = np.array((1.0, *rest))
        rows.append((top_share(data[dev], w, 2), top_share(data[dev], w, 1), w))
    rows.sort(key=lambda r: (-r[0], -r[1]))
    out = {"dev": dev, "best": []}
    print(f"{'weights ' + str(FEATURES):60} {dev + ' ev2/ev1':>18} " + " ".join(f"{h + ' ev2':>16}" for h in held))
    for ev2, ev1, w in rows[:10]:
        checks = {h: top_share(data[h], w, 2) for h in held}
        out["best"].append({"weights": w.tolist(), dev: {"ev2": ev2, "ev1": ev1}, **{h: {"ev2": v} for h, v in checks.items()}})
        print(f"{str(w.tolist()):60} {ev2:10.3f} / {ev1:.3f} " + " ".join(f"{v:16.3f}" for v in checks.values()))
    default = Weights().vector()
    out["default"] = {n: {"ev2": top_share(data[n], default, 2), "ev1": top_share(data[n], default, 1)} for n in names}
    out["cosine"] = {n: {"ev2": top_share(data[n], np.eye(len(FEATURES))[0], 2)} for n in names}
    out["n"] = {n: len(data[n]) for n in names}
    print("default weights", default.tolist(), json.dumps(out["default"]), "cosine only", json.dumps(out["cosine"]))
    return out


def evidence_rows(idx: Any, items: list[Item], k: int) -> dict[str, Any]:
    from slimrag.rag.evidence import evidence_answer

    out: dict[str, Any] = {}
    weights = Weights().vector()
    for mode in MODES:
        cases, n_ret = collect(idx, items, mode, k)
        t, c = time.perf_counter(), time.process_time()
        for it in items:
            evidence_answer(idx, it.question, k, mode=mode)
        ms = 1000 * (time.perf_counter() - t) / len(items)
        cpu_ms = 1000 * (time.process_time() - c) / len(items)
        out[mode] = {"n": len(items), "retrieved": n_ret / len(items), "ev1": top_share(cases, weights, 1),
                     "ev2": top_share(cases, weights, 2), "cos2": top_share(cases, np.eye(len(FEATURES))[0], 2),
                     "evidence_ms": ms, "evidence_cpu_ms": cpu_ms}
        print(mode, json.dumps(out[mode]), flush=True)
    return out


#: System prompts compared with ``--llm-questions`` (name -> text); "default" is slimrag's before
#: issue 19 (`slimrag.prompt.DEFAULT_SYSTEM`).
PROMPTS: dict[str, str] = {
    "quote": ("You are a helpful assistant. Answer the question using only the passages given. "
              "Quote the words of the passage that answer it, and cite the passage's label in brackets. "
              "If the passages do not contain the answer, say you do not know."),
    "short-first": ("You are a helpful assistant. Answer the question using only the passages given. "
                    "Start with the short answer itself (a name, a number, a date or a few words), then one "
                    "sentence from the passage that supports it, with the passage's label in brackets. "
                    "If the passages do not contain the answer, say you do not know."),
}


def llm_rows(idx: Any, items: list[Item], k: int, n: int, llm: str | None = None,
             prompts: str = "default,quote,short-first") -> dict[str, Any]:
    from slimrag.llm.backends import make_generator
    from slimrag.prompt import DEFAULT_SYSTEM
    from slimrag.rag.pipeline import RAG, default_generation

    out: dict[str, Any] = {}
    gen = make_generator(llm)
    answers: dict[str, list[str]] = {}
    systems = {"default": DEFAULT_SYSTEM, **PROMPTS}
    for name in prompts.split(","):
        # free answers: a system prompt is what the model reads over the passages (grounded mode has its own)
        rag = RAG(idx, gen, mode="hybrid", attribution=False, answer="free", system=systems[name],
                  generation=default_generation(gen, 64))
        right = 0
        t = time.perf_counter()
        answers[name] = []
        for it in items[:n]:
            ans = rag.ask(it.question, k)
            answers[name].append(ans.text)
            right += normalize(it.answer) in normalize(ans.text)
        out[name] = {"n": n, "contains_gold": right / n, "s_per_answer": (time.perf_counter() - t) / n}
        print("llm", name, json.dumps(out[name]), flush=True)
    out["answers"] = answers
    return out


def _median(xs: list[float]) -> float:
    return float(np.median(xs)) if xs else 0.0


def _timed(stream: Any) -> tuple[Any, float, float | None, float]:
    """Run an answer stream (`AnswerStream`): the `Answer`, the seconds to its first text piece, to the
    grounded model's first piece (after `IN_SHORT`; None in free mode) and to its end."""
    from slimrag.rag.grounded import IN_SHORT

    t0 = time.perf_counter()
    first = model = None
    for piece in stream:
        now = time.perf_counter() - t0
        first = now if first is None else first
        if piece == IN_SHORT and model is None:
            model = now
    return stream.answer, first or 0.0, model, time.perf_counter() - t0


def _model_text(answer: Any) -> str:
    """What the model wrote: a free answer's text, a grounded answer's sentence after the lead."""
    from slimrag.rag.grounded import IN_SHORT

    if answer.mode == "grounded":
        return answer.text.split(IN_SHORT, 1)[1] if IN_SHORT in answer.text else ""
    return answer.text


def _flagged_text(verdict: str | None, said: str, support: Any) -> str:
    """What the check withheld or marked of the model's text ``said``: all of it when not backed,
    the unsupported sentences when partial, nothing when supported (module header, ``mark_precision``)."""
    if verdict == "not_backed":
        return said
    return " ".join(s.sentence for s in support if not s.supported) if verdict == "partial" else ""


def _phrase_view(answer: Any) -> tuple[str, str]:
    """Extract-then-phrase read off a grounded answer: (verdict, shown) of its model sentence alone."""
    from slimrag.rag.grounded import IN_SHORT
    from slimrag.rag.verdict import NOT_BACKED

    if answer.verdict == "not_backed" or not answer.verdict:
        return answer.verdict or "not_backed", answer.shown or NOT_BACKED
    return answer.verdict, answer.shown.split(IN_SHORT, 1)[1] if IN_SHORT in answer.shown else answer.shown


def reader_rows(idx: Any, items: list[Item], k: int, n: int, llm: str | None = None,
                modes: str = "grounded,free") -> dict[str, Any]:
    """What the reader sees per answer mode on the first ``n`` items (module header)."""
    from slimrag.llm.backends import make_generator
    from slimrag.rag.evidence import evidence_answer
    from slimrag.rag.pipeline import RAG, default_generation

    gen = make_generator(llm)
    gen.load()
    rags = {m: RAG(idx, gen, mode="hybrid", answer=m, generation=default_generation(gen, 64)) for m in modes.split(",")}
    records: list[dict[str, Any]] = []
    for i, it in enumerate(items[:n]):
        gold = normalize(it.answer)
        rec: dict[str, Any] = {"question": it.question, "gold": it.answer}
        for m, rag in rags.items():
            ans, first, model, total = _timed(rag.respond(it.question, k))
            rec["retrieved"] = it.source in {h.source for h in ans.sources}
            rec["hits"] = [{"chunk_id": h.chunk_id, "score": h.score, "text": h.text, "source": h.source,
                            "metadata": h.metadata} for h in ans.sources]  # to re-check offline
            said = _model_text(ans)
            flagged = _flagged_text(ans.verdict, said, ans.support)
            rec[m] = {"verdict": ans.verdict, "abstained": ans.abstained, "shown": ans.shown or ans.text,
                      "model": said, "model_gold": gold in normalize(said), "marked_gold": gold in normalize(flagged),
                      "ttfb_s": first, "total_s": total}
            if m == "grounded":
                verdict, shown = _phrase_view(ans)
                rec["phrase"] = {"verdict": verdict, "abstained": ans.abstained, "shown": shown, "model": said,
                                 "model_gold": gold in normalize(said), "marked_gold": gold in normalize(flagged),
                                 "ttfb_s": model or total, "total_s": total}
            for view in (m, "phrase") if m == "grounded" else (m,):
                rec[view]["shown_gold"] = gold in normalize(rec[view]["shown"])
        t = time.perf_counter()
        ev = evidence_answer(idx, it.question, k, mode="hybrid")
        rec["evidence"] = {"verdict": "" if ev.abstained else "supported", "abstained": ev.abstained,
                           "shown": ev.text, "model": "", "model_gold": False, "marked_gold": False,
                           "shown_gold": gold in normalize(ev.text),
                           "ttfb_s": time.perf_counter() - t, "total_s": time.perf_counter() - t}
        records.append(rec)
        print(i, json.dumps({v: (r["verdict"], r["shown_gold"]) for v, r in rec.items() if isinstance(r, dict)}),
              flush=True)
    return {"summary": summarize(records), "records": records}


def recheck(path: Path, labels: dict[str, Any] | None = None) -> dict[str, Any]:
    """The reader-view figures of a saved ``--reader`` run with today's check: each recorded model
    text (greedy, so what the model writes again) is attributed and judged again against its
    recorded passages (`slimrag.rag.attribution`, `slimrag.rag.verdict`); timings stay the run's."""
    from slimrag.embed.local import LocalEmbedder
    from slimrag.rag.attribution import OFF_QUESTION_MARK, UNSUPPORTED_MARK, attribute, with_markers
    from slimrag.rag.evidence import EvidenceConfig, Memo, rank_sentences
    from slimrag.rag.grounded import CONTEXT, IN_SHORT, LEAD, lead_of, lead_text
    from slimrag.rag.verdict import judge
    from slimrag.rag.vocabulary import Vocabulary
    from slimrag.types import Hit

    saved = json.loads(path.read_text())
    embedder = LocalEmbedder()
    embedder.load()
    out: dict[str, Any] = {}
    for name, res in saved["sets"].items():
        records = res["reader"]["records"]
        idx = ALL_SETS[name]()[0]
        common = Vocabulary(idx).common
        for rec in records:
            hits = [Hit(h["chunk_id"], h["score"], h["text"], h["source"], h["metadata"]) for h in rec["hits"]]
            gold, memo = normalize(rec["gold"]), Memo(embedder)
            evidence = rank_sentences(rec["question"], hits, memo, EvidenceConfig(top=max(CONTEXT, LEAD)))
            for m in ("grounded", "free"):
                view = rec.get(m)
                if view is None or view["abstained"]:
                    continue
                said = view["model"].replace(f" {UNSUPPORTED_MARK}", "").replace(f" {OFF_QUESTION_MARK}", "").strip()
                if m == "grounded":  # the recorded sentence ends with the run's citation or mark
                    said = said.rsplit(" [", 1)[0] if said.endswith("]") else said
                check = attribute(rec["question"], said, hits, memo, common=common)
                verdict = judge(rec["question"], said, check, evidence, hits)
                marked_gold = gold in normalize(_flagged_text(verdict.kind, said, check.support))
                if m == "grounded":
                    lead = lead_text(lead_of(evidence, hits))
                    shown = (lead + IN_SHORT + with_markers(said, check)) if verdict.kind != "not_backed" else verdict.shown
                    phrase = with_markers(said, check) if verdict.kind != "not_backed" else verdict.shown
                    rec["phrase"].update(verdict=verdict.kind, shown=phrase, shown_gold=gold in normalize(phrase),
                                         marked_gold=marked_gold)
                else:
                    shown = verdict.shown
                view.update(verdict=verdict.kind, shown=shown, shown_gold=gold in normalize(shown), marked_gold=marked_gold)
        idx.close()
        out[name] = summarize(records, labels, name)
        for v, m in out[name].items():
            print(name, v, json.dumps(m), flush=True)
    return out


def _misses(flagged: list[tuple[dict[str, Any], dict[str, Any]]], key: str) -> int:
    return sum(x.get(key, x["model_gold"]) for _, x in flagged)


def summarize(records: list[dict[str, Any]], labels: dict[str, Any] | None = None, name: str = "") -> dict[str, Any]:
    """The reader-view figures of each mode over ``records`` (module header); ``labels``: the hand
    labels of `LABELS` for ``read_precision``, set ``name``'s."""
    out: dict[str, Any] = {}
    views = [v for v in ("grounded", "phrase", "free", "evidence") if records and v in records[0]]
    for v in views:
        rows = [(r["retrieved"], r[v]) for r in records]
        ret = [x for got, x in rows if got]
        flagged = [(r, r[v]) for r in records if r[v]["verdict"] in ("not_backed", "partial") and not r[v]["abstained"]]
        right = sum(x["model_gold"] and label_of(labels, f"{name}|{_LABELLED.get(v, v)}|{r['question']}",
                                                 r[_LABELLED.get(v, v)]["model"]) == "right"
                    for r, x in flagged)
        out[v] = {
            "n": len(rows), "retrieved": len(ret),
            "shown_gold_retrieved": sum(x["shown_gold"] for x in ret) / len(ret) if ret else 0.0,
            "shown_gold": sum(x["shown_gold"] for _, x in rows) / len(rows),
            "confidently_wrong": sum(x["verdict"] in ("supported", "partial") and not x["shown_gold"]
                                     for _, x in rows) / len(rows),
            "withheld_or_marked": len(flagged) / len(rows),
            "check_precision": 1 - _misses(flagged, "model_gold") / len(flagged) if flagged else None,
            "mark_precision": 1 - _misses(flagged, "marked_gold") / len(flagged) if flagged else None,
            "read_precision": (1 - (_misses(flagged, "model_gold") - right) / len(flagged)
                               if flagged and labels is not None else None),
            "abstained": sum(x["abstained"] for _, x in rows) / len(rows),
            "ttfb_s": _median([x["ttfb_s"] for _, x in rows]), "total_s": _median([x["total_s"] for _, x in rows]),
        }
    return out


def label_of(labels: dict[str, Any] | None, key: str, text: str | None = None) -> str | None:
    """The hand label (``right`` or ``wrong``) of flag ``key`` in `LABELS`: a bare string, or a
    ``{"label": ..., "reason": ..., "text": ...}`` object saying what the reader found in the passages
    and, with ``text``, the model text that was read. A label read on another text than ``text`` (the
    model wrote something else in a later run) is no label: None. A label without ``text`` predates
    the field and is taken as it is."""
    got = (labels or {}).get(key)
    if not isinstance(got, dict):
        return got
    return None if text is not None and "text" in got and got["text"] != text else got.get("label")


#: The view whose labels a view reads: extract-then-phrase shows the grounded run's model sentence.
_LABELLED = {"phrase": "grounded"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--questions", type=int, default=300)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--llm-questions", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tune", action="store_true")
    ap.add_argument("--llm-only", action="store_true", help="only the model rows (with --llm-questions)")
    ap.add_argument("--llm", default=None, help="the generator: None for the embedded model, or a URL")
    ap.add_argument("--prompts", default="default,quote,short-first", help="system prompts to compare")
    ap.add_argument("--reader", type=int, default=0, help="what the reader sees, per answer mode, on N questions")
    ap.add_argument("--answer-modes", default="grounded,free", help="answer modes compared by --reader")
    ap.add_argument("--skip", type=int, default=0,
                    help="--reader starts after this many questions of the sample (a held-out slice)")
    ap.add_argument("--recheck", type=Path, default=None,
                    help="judge the model texts of a saved --reader run again with today's check (no model)")
    ap.add_argument("--labels", type=Path, default=None,
                    help=f"hand labels of the check's flags for read_precision (module header; ours: {LABELS.name})")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    res: dict[str, Any] = {"args": vars(args), "machine": platform.platform(), "load_before": os.getloadavg()}
    if args.recheck is not None:
        res["recheck"] = recheck(args.recheck, json.loads(args.labels.read_text()) if args.labels else None)
        args.out.with_name(args.recheck.stem + "-recheck.json").write_text(json.dumps(res, indent=1, default=str))
        return
    if args.tune:
        res["tune"] = tune(args)
    else:
        res["sets"] = {}
        for name in args.sets.split(","):
            idx, items = load(name, args.questions, args.seed)
            res["sets"][name] = {} if args.llm_only or args.reader else {"evidence": evidence_rows(idx, items, args.k)}
            if args.reader:
                res["sets"][name]["reader"] = reader_rows(idx, items[args.skip:], args.k, args.reader, args.llm,
                                                          args.answer_modes)
            if args.llm_questions:
                res["sets"][name]["llm"] = llm_rows(idx, items, args.k, args.llm_questions, args.llm, args.prompts)
            idx.close()
    res["load_after"] = os.getloadavg()
    out = args.out.with_name(args.out.stem + "-tune.json") if args.tune else args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1, default=str))
    if not args.tune:
        print(f"{'set':13} {'mode':8} {'n':>4} {'retrieved':>9} {'ev1':>6} {'ev2':>6} {'cos2':>6} {'evid ms':>8} "
              f"{'cpu ms':>7}")
        for name, r in res["sets"].items():
            for mode, m in r.get("evidence", {}).items():
                print(f"{name:13} {mode:8} {m['n']:>4} {m['retrieved']:9.3f} {m['ev1']:6.3f} {m['ev2']:6.3f} "
                      f"{m['cos2']:6.3f} {m['evidence_ms']:8.1f} {m.get('evidence_cpu_ms', 0):7.1f}")
            for v, m in r.get("reader", {}).get("summary", {}).items():
                prec = "-" if m["check_precision"] is None else f"{m['check_precision']:.3f}"
                prec += "" if m.get("mark_precision") is None else f" (marked text {m['mark_precision']:.3f})"
                print(f"{name:13} reader:{v:9} n={m['n']} retrieved={m['retrieved']} shown gold (retrieved) "
                      f"{m['shown_gold_retrieved']:.3f}, all {m['shown_gold']:.3f}, confidently wrong "
                      f"{m['confidently_wrong']:.3f}, withheld/marked {m['withheld_or_marked']:.3f}, precision {prec}, "
                      f"abstained {m['abstained']:.3f}, first byte {m['ttfb_s']:.2f} s, total {m['total_s']:.2f} s")
            for p, m in r.get("llm", {}).items():
                if p == "answers":
                    continue
                print(f"{name:13} llm:{p:10} n={m['n']} contains gold {m['contains_gold']:.3f}, "
                      f"{m['s_per_answer']:.2f} s/answer")


if __name__ == "__main__":
    main()
