"""The question-answering workload of the ``bench.gen*`` scripts: disfl_qa over a flat index.

``bench.generation`` (model run), ``bench.gen_sim`` (simulated trees) and ``bench.gen_bound``
(ceilings) replay the same arrivals: they take their options from :func:`add_workload_args` and
their requests from :func:`requests`.

- Corpus: the 1,204 distinct disfl_qa passages (``bigbench==1.0.0``, see ``bench.datasets``),
  indexed once with ``Index.build(..., storage="flat")`` into ``bench/data/disfl_qa.slimrag``
  (reruns open it; nothing is re-embedded). Long passages are chunked by the index as usual.
- Skewed workload (:func:`grouped`, ``--workloads grouped``): ``--passages`` (30) passages drawn
  at random, *all* of their questions (disfl_qa has 6.6 per passage on average), in one shuffled
  arrival order: several questions per passage, interleaved with other passages' questions.
- Zipf workload (:func:`zipf`, ``--workloads zipf``): each of ``--zipf-n`` (200) arrivals picks a
  passage with probability ∝ 1/rank^s (``--zipf-s``, 1.0) over a random ranking of
  ``--zipf-passages`` (200) passages, then one of its questions at random.
- Requests (:func:`requests`): each question with its top-``--k`` (4) passages from the flat index,
  in relevance order (a question asked twice is searched once). :func:`dump_requests` writes them
  to a JSON file that :func:`requests` reads back with ``--requests-file``, so a GPU machine needs
  neither the index nor the embedder.
- Prompt lengths (:func:`token_counter`): SmolLM2 tokens per segment text, memoized.
- Scores (:func:`exact_match`, :func:`f1`): SQuAD's normalisation (lowercase, punctuation and
  the articles a/an/the dropped, whitespace collapsed), against the gold answer.

Everything is seeded (``--seed``, 0); the same arguments give the same questions in the same order.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import random
import re
import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.datasets import DATA, QA, disfl_qa, saved_index
from slimrag.prompt import Passage

INDEX = DATA / "disfl_qa.slimrag"


@dataclass(frozen=True)
class Question:
    """One arrival: the question, its gold answer and the id of its gold passage."""

    text: str
    answer: str
    passage: int


@dataclass(frozen=True)
class Request:
    """One arrival as the serving modes see it: its position in the workload, question and
    passages in relevance order."""

    index: int
    question: str
    ranked: tuple[Passage, ...]


def passages_and_questions() -> tuple[list[str], dict[int, list[QA]]]:
    """The distinct passages (first-seen order) and each passage's questions."""
    rows = disfl_qa()
    ids: dict[str, int] = {}
    by_passage: dict[int, list[QA]] = collections.defaultdict(list)
    for qa in rows:
        pid = ids.setdefault(qa.context, len(ids))
        by_passage[pid].append(qa)
    return list(ids), dict(by_passage)


def flat_index(path: Path = INDEX, storage: str = "flat"):  # noqa: ANN201  (slimrag.index.core.Index; imported lazily)
    """The index of all disfl_qa passages, built on first use (a few minutes on 2 cores); flat
    unless ``storage`` says otherwise (`bench.floor` builds a slim one)."""
    def pairs() -> list[tuple[str, str]]:
        texts, _ = passages_and_questions()
        return [(f"disfl_qa/{i:04d}.txt", t) for i, t in enumerate(texts)]

    return saved_index(path, pairs, storage=storage, overwrite=True)


def grouped(passages: int, seed: int = 0) -> list[Question]:
    """All questions of ``passages`` random passages, shuffled together."""
    _, by_passage = passages_and_questions()
    rng = random.Random(seed)
    chosen = rng.sample(sorted(by_passage), passages)
    out = [Question(qa.question, qa.answer, pid) for pid in chosen for qa in by_passage[pid]]
    rng.shuffle(out)
    return out


def zipf(n: int, passages: int = 200, s: float = 1.0, seed: int = 0) -> list[Question]:
    """``n`` arrivals over ``passages`` passages with Zipf(``s``) popularity."""
    _, by_passage = passages_and_questions()
    rng = random.Random(seed)
    chosen = rng.sample(sorted(by_passage), passages)
    weights = [1.0 / (r + 1) ** s for r in range(passages)]
    out = []
    for pid in rng.choices(chosen, weights=weights, k=n):
        qa = rng.choice(by_passage[pid])
        out.append(Question(qa.question, qa.answer, pid))
    return out


def add_workload_args(ap: argparse.ArgumentParser) -> None:
    """The options that define the workloads (every ``bench.gen*`` script takes them, so all
    replay the same arrivals)."""
    ap.add_argument("--workloads", default="grouped,zipf")
    ap.add_argument("--passages", type=int, default=30)
    ap.add_argument("--zipf-n", type=int, default=200)
    ap.add_argument("--zipf-passages", type=int, default=200)
    ap.add_argument("--zipf-s", type=float, default=1.0)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)


def requests(args: argparse.Namespace, workload: str) -> list[tuple[Request, str]]:
    """The workload's arrivals with their retrieved passages (relevance order) and gold answers.
    With ``--requests-file`` they are read from a file :func:`dump_requests` wrote."""
    from slimrag.rag.pipeline import passage_of

    if getattr(args, "requests_file", None):
        saved = json.loads(Path(args.requests_file).read_text())[workload]
        return [(Request(r["i"], r["question"], tuple(Passage(**p) for p in r["ranked"])), r["answer"])
                for r in saved]

    qs = grouped(args.passages, args.seed) if workload == "grouped" else zipf(
        args.zipf_n, args.zipf_passages, args.zipf_s, args.seed)
    idx = flat_index()
    cache: dict[str, tuple[Passage, ...]] = {}
    out = []
    for i, q in enumerate(qs):
        if q.text not in cache:
            cache[q.text] = tuple(passage_of(h) for h in idx.search(q.text, k=args.k))
        out.append((Request(i, q.text, cache[q.text]), q.answer))
    idx.close()
    return out


def dump_requests(args: argparse.Namespace, path: Path) -> None:
    """Write the arrivals of every workload in ``--workloads`` to ``path`` (read back by
    :func:`requests` with ``--requests-file``)."""
    dump = {w: [{"i": r.index, "question": r.question, "answer": a,
                 "ranked": [dataclasses.asdict(p) for p in r.ranked]} for r, a in requests(args, w)]
            for w in args.workloads.split(",")}
    Path(path).write_text(json.dumps(dump))


def token_counter() -> Callable[[str], int]:
    """``count(text)``: SmolLM2 tokens of a segment text, memoized (segments recur across prompts)."""
    from slimrag.llm.weights import load_model

    tok = load_model(device="cpu").tokenizer
    memo: dict[str, int] = {}

    def count(text: str) -> int:
        if text not in memo:
            memo[text] = len(tok.encode(text, add_special_tokens=False))
        return memo[text]

    return count


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize(text: str) -> str:
    """SQuAD answer normalisation."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised texts are equal."""
    return float(normalize(prediction) == normalize(gold))


def f1(prediction: str, gold: str) -> float:
    """Token-overlap F1 of the normalised texts (SQuAD)."""
    pred, ref = normalize(prediction).split(), normalize(gold).split()
    common = sum((collections.Counter(pred) & collections.Counter(ref)).values())
    if not pred or not ref:
        return float(pred == ref)
    if common == 0:
        return 0.0
    p, r = common / len(pred), common / len(ref)
    return 2 * p * r / (p + r)
