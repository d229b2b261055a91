"""The question-answering workload of ``bench.generation``: disfl_qa over a flat index.

- Corpus: the 1,204 distinct disfl_qa passages (``bigbench==1.0.0``, see ``bench.datasets``),
  indexed once with ``Index.build(..., storage="flat")`` into ``bench/data/disfl_qa.slimrag``
  (reruns open it; nothing is re-embedded). Long passages are chunked by the index as usual.
- Skewed workload (:func:`grouped`): ``passages`` passages drawn at random, *all* of their
  questions (disfl_qa has 6.6 per passage on average), in one shuffled arrival order: several
  questions per passage, interleaved with other passages' questions.
- Zipf workload (:func:`zipf`): each arrival picks a passage with probability ∝ 1/rank^s over a
  random ranking of ``passages`` passages, then one of its questions at random.
- Scores (:func:`exact_match`, :func:`f1`): SQuAD's normalisation (lowercase, punctuation and
  the articles a/an/the dropped, whitespace collapsed), against the gold answer.

Everything is seeded; the same arguments give the same questions in the same order.
"""

from __future__ import annotations

import collections
import random
import re
import string
from dataclasses import dataclass
from pathlib import Path

from bench.datasets import DATA, QA, disfl_qa

INDEX = DATA / "disfl_qa.slimrag"


@dataclass(frozen=True)
class Question:
    """One arrival: the question, its gold answer and the id of its gold passage."""

    text: str
    answer: str
    passage: int


def passages_and_questions() -> tuple[list[str], dict[int, list[QA]]]:
    """The distinct passages (first-seen order) and each passage's questions."""
    rows = disfl_qa()
    ids: dict[str, int] = {}
    by_passage: dict[int, list[QA]] = collections.defaultdict(list)
    for qa in rows:
        pid = ids.setdefault(qa.context, len(ids))
        by_passage[pid].append(qa)
    return list(ids), dict(by_passage)


def flat_index(path: Path = INDEX):  # noqa: ANN201  (slimrag.index.core.Index; imported lazily)
    """The flat index of all disfl_qa passages, built on first use (a few minutes on 2 cores)."""
    from slimrag.index.core import Index

    if (path / "manifest.json").is_file():
        return Index.open(path)
    texts, _ = passages_and_questions()
    pairs = [(f"disfl_qa/{i:04d}.txt", t) for i, t in enumerate(texts)]
    return Index.build(pairs, path, storage="flat", overwrite=True)


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
