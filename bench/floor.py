"""Benchmark: the relevance floor read from the hits' similarity against the probe it replaced.

``python -m bench.floor`` (``--k 4 --timed 100``). Until issue 29 the floor of a hybrid search
(`slimrag.rag.guards`) ran a second, one-hit vector search per question to learn the best cosine
(the ``_cosine_probe`` that keyword mode still runs, ``FLOORS["keyword"]``); now it reads
`Hits.similarity`, the best cosine among the hybrid search's vector candidates, carried with its
hits. Three parts, on the flat index of the 1,204 disfl_qa passages (`bench.qa_workload.flat_index`;
``--storage slim``: the decisions on a slim index of the same passages, built on first use):

- **Decisions**: every disfl_qa question (7,999 of 8,000: a search refuses the blank one) and
  the unanswerable ones of `bench.guards`, searched in hybrid mode (``--k`` hits, the pipeline's 4); per question the new decision
  (`answerable`), the probe's decision on the same hits, the search's best similarity, the best
  `Hit.similarity` among the hits (``hits_best``: what a floor reading only the hits would use),
  the probe's cosine (the index's best), the best *exact* cosine among the hits (every hit
  re-embedded from its stored text: what computing it for every hit would give) and how many
  hits carry no similarity; the summary counts the decisions each rule would change. Questions are embedded once, in batches, and the index is opened with an
  embedder that answers from those vectors (`Remembered`): the same vectors the searches would
  compute, without 16,000 one-text model calls.
- **Follow-ups** (``--followups``, 200): `bench.followups`' two-turn conversations, the second
  turn retrieved with its condensed query (`slimrag.rag.condense.with_words`) as the pipeline
  does; the probe searched both queries (turn 2 as written and condensed), the hits' similarity is
  the condensed query's.
- **Time** (``--timed`` questions, the real embedder, no remembered vectors): retrieve + floor as
  `RAG.turn` runs them, new (hybrid search, `answerable`) and old (hybrid search, the probe),
  interleaved ABBA per question so load hits both alike; medians and their ratio. Beside it the
  time to embed the hits that carry no similarity (what a slim store would pay to compute their
  cosine exactly: its rows are recomputed from text).

Prints a summary and writes ``bench/results/floor.json``. Run timing under
``flock /tmp/slimrag-timing.lock``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

from bench.guards import UNANSWERABLE  # noqa: E402
from bench.qa_workload import INDEX, flat_index, passages_and_questions  # noqa: E402
from slimrag.embed.base import Embedder  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "floor.json"
SLIM_INDEX = INDEX.with_name("disfl_qa-slim.slimrag")


class Remembered(Embedder):
    """``inner``'s vectors of texts embedded ahead in batches (`remember`); any other text is
    embedded by ``inner`` when asked."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.model_id, self.dim, self.kind = inner.model_id, inner.dim, inner.kind
        self.known: dict[str, np.ndarray] = {}

    def remember(self, texts: Sequence[str]) -> None:
        """Embed ``texts`` in batches and keep their vectors."""
        self.known.update(zip(texts, self.inner.embed(list(texts)), strict=True))

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        missing = [t for t in texts if t not in self.known]
        if missing:
            self.remember(missing)
        return np.stack([self.known[t] for t in texts])

    def record(self) -> dict[str, Any]:
        return self.inner.record()


def questions(limit: int | None) -> list[tuple[list[str], bool]]:
    """([question], has a gold passage) for the disfl_qa questions (the first ``limit``) and the
    unanswerable set."""
    _, by_passage = passages_and_questions()
    qs = [qa.question for pid in sorted(by_passage) for qa in by_passage[pid] if qa.question.strip()][:limit]
    return [([q], True) for q in qs] + [([q], False) for q in UNANSWERABLE]


def followups(n: int) -> list[tuple[list[str], bool]]:
    """([turn 2 as written, its condensed query], True) for `bench.followups`' conversations: the
    queries `RAG.retrieve_in_context` makes (the hits are the condensed query's)."""
    from bench.followups import conversations
    from slimrag.rag.condense import with_words

    out = []
    for c in conversations(n, 0):
        query = with_words(c["turn2"], [c["turn1"]])
        out.append(([c["turn2"]] + ([query] if query != c["turn2"] else []), True))
    return out


def decisions(idx: Any, cases: list[tuple[list[str], bool]], k: int, floor: float) -> list[dict[str, Any]]:
    """Per case (its queries, the last retrieved with): the floor's decision read from the hits
    and the probe's (module header)."""
    from slimrag.rag.guards import FLOORS, answerable, best_similarity

    probe = FLOORS["keyword"]  # the one-hit vector search hybrid ran before issue 29
    rows = []
    for queries, gold in cases:
        q = queries[-1]
        hits = idx.search(q, k=k, mode="hybrid")
        qv = idx.embedder.embed([q])[0]
        exact = (idx.state.recompute(np.asarray([h.chunk_id for h in hits])) @ qv).tolist() if hits else []
        probes = [idx.search(x, 1, mode="vector") for x in queries]  # the last is q's
        tops = [t[0].score for t in probes if t]
        top = probes[-1]
        rows.append({"queries": queries, "gold": gold, "new": answerable(idx, "hybrid", queries, hits, floor),
                     "old": probe(idx, queries, hits, floor, None), "best_similarity": best_similarity(hits),
                     "hits_best": max((h.similarity for h in hits if h.similarity is not None), default=None),
                     "probe_cosine": max(tops, default=None), "best_exact": max(exact, default=None),
                     "keyword_only": sum(h.similarity is None for h in hits),
                     "probe_top_in_hits": bool(top) and top[0].chunk_id in {h.chunk_id for h in hits}})
    return rows


def timed(idx: Any, qs: list[str], k: int, floor: float) -> dict[str, Any]:
    """Retrieve + floor per question, new and old, ABBA-interleaved (module header)."""
    from slimrag.rag.guards import FLOORS, answerable

    probe = FLOORS["keyword"]

    def new(q: str) -> tuple[float, Any]:
        t = time.perf_counter()
        hits = idx.search(q, k=k, mode="hybrid")
        answerable(idx, "hybrid", [q], hits, floor)
        return time.perf_counter() - t, hits

    def old(q: str) -> float:
        t = time.perf_counter()
        probe(idx, [q], idx.search(q, k=k, mode="hybrid"), floor, None)
        return time.perf_counter() - t

    new(qs[0]), old(qs[0])  # the model's first call loads it
    t_new, t_old, t_fill = [], [], []
    for i, q in enumerate(qs):
        if i % 2:
            t_old.append(old(q))
            took, hits = new(q)
        else:
            took, hits = new(q)
            t_old.append(old(q))
        t_new.append(took)
        loose = [h.text for h in hits if h.similarity is None]
        if loose:
            t = time.perf_counter()
            idx.embedder.embed(loose)
            t_fill.append(time.perf_counter() - t)
    med_new, med_old = statistics.median(t_new), statistics.median(t_old)
    return {"questions": len(qs), "median_new_s": med_new, "median_old_s": med_old,
            "old_over_new": med_old / med_new, "mean_new_s": statistics.fmean(t_new),
            "mean_old_s": statistics.fmean(t_old), "with_keyword_only": len(t_fill),
            "median_embed_keyword_only_s": statistics.median(t_fill) if t_fill else None}


def summary(rows: list[dict[str, Any]], floor: float) -> dict[str, Any]:
    changed = [r for r in rows if r["new"] != r["old"]]
    if not rows:
        return {"questions": 0}
    exact_changed = [r for r in rows if (r["best_exact"] is not None and r["best_exact"] >= floor) != r["old"]]
    own_changed = [r for r in rows if (r["hits_best"] is not None and r["hits_best"] >= floor) != r["old"]]
    return {"questions": len(rows), "answerable_set": sum(r["gold"] for r in rows),
            "changed": len(changed), "changed_queries": [r["queries"] for r in changed],
            "changed_if_hits_only": len(own_changed), "changed_if_exact": len(exact_changed),
            "abstained_gold_new": sum(r["gold"] and not r["new"] for r in rows),
            "abstained_gold_old": sum(r["gold"] and not r["old"] for r in rows),
            "abstained_unanswerable_new": sum(not r["gold"] and not r["new"] for r in rows),
            "abstained_unanswerable_old": sum(not r["gold"] and not r["old"] for r in rows),
            "with_keyword_only_hit": sum(r["keyword_only"] > 0 for r in rows),
            "keyword_only_hits": sum(r["keyword_only"] for r in rows),
            "probe_top_not_in_hits": sum(not r["probe_top_in_hits"] for r in rows),
            "best_below_probe": sum(r["best_similarity"] is not None and r["probe_cosine"] is not None
                                    and r["best_similarity"] < r["probe_cosine"] - 1e-6 for r in rows),
            "hits_best_below_probe": sum(r["hits_best"] is not None and r["probe_cosine"] is not None
                                         and r["hits_best"] < r["probe_cosine"] - 1e-6 for r in rows)}


def slim_index(path: Path = SLIM_INDEX) -> Path:
    """A slim index of the disfl_qa passages (the flat one's texts and sources), built on first use."""
    flat_index(path, storage="slim").close()
    return path


def main() -> None:
    from slimrag.index.core import Index
    from slimrag.rag.guards import DEFAULT_FLOOR

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--questions", type=int, default=None, help="disfl_qa questions for the decisions (all)")
    ap.add_argument("--followups", type=int, default=200, help="bench.followups conversations (0: none)")
    ap.add_argument("--timed", type=int, default=100, help="questions timed (0: no timing)")
    ap.add_argument("--floor", type=float, default=DEFAULT_FLOOR)
    ap.add_argument("--storage", choices=("flat", "slim"), default="flat",
                    help="the index the decisions are taken on (slim: built on first use; timing stays flat)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    res: dict[str, Any] = {"args": vars(args), "machine": platform.platform()}
    qs, fus = questions(args.questions), followups(args.followups) if args.followups else []
    flat_index().close()  # built on first use
    path = INDEX if args.storage == "flat" else slim_index()
    with Index.open(path) as plain:
        base = plain.embedder  # the manifest's embedder, loaded once for the timing and the decisions
    if args.timed:
        with Index.open(INDEX, base if path == INDEX else None) as idx:
            res["time"] = timed(idx, [q[0] for q, _ in qs[: args.timed]], args.k, args.floor)
        print(json.dumps(res["time"], indent=1))
    embedder = Remembered(base)
    embedder.remember(list(dict.fromkeys(q for queries, _ in qs + fus for q in queries)))
    with Index.open(path, embedder) as idx:
        rows, fu_rows = decisions(idx, qs, args.k, args.floor), decisions(idx, fus, args.k, args.floor)
    res["summary"], res["followups"] = summary(rows, args.floor), summary(fu_rows, args.floor)
    res["rows"], res["followup_rows"] = rows, fu_rows
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1, default=str))
    print(json.dumps({"questions": res["summary"], "followups": res["followups"]}, indent=1))


if __name__ == "__main__":
    main()
