"""QA sets with gold passages and gold answer strings, each with its flat index: what `bench.answers`
and `bench.followups` measure on.

- ``disfl_qa``: the 1,204 disfl_qa passages (`bench.qa_workload.flat_index`) and their disfluent
  SQuAD questions ("What part the composition of the Earth's biosphere is comprised of oxygen no
  sorry the Earth's atmosphere?"). Only the answerable ones: 34.5% of disfl_qa's answers are
  "unknown" (SQuAD 2.0's unanswerable questions) or otherwise not in the passage, and no sentence
  can contain them; the items kept have their gold answer (SQuAD-normalised) in their passage.
- ``nq_conflicts``: BIG-bench's ``contextual_parametric_knowledge_conflicts`` task (same
  ``bigbench==1.0.0`` archive, `bench.datasets.bigbench_archive`): real Natural Questions queries
  ("who does candace like in phineas and ferb?") with a Wikipedia passage in which the answer
  entity was replaced by another name, so the answer is in the passage and a model that answers
  from memory is wrong. 17,528 examples, one passage each; a seeded sample of ``NQ_PASSAGES``
  (1,500) forms the corpus (one source per passage), its questions are the queries.

`load` returns the index and the `Item`s (question, gold answer, gold source); a seeded sample of
``n`` of them when ``n`` is given.
"""

from __future__ import annotations

import json
import random
import tarfile
from dataclasses import dataclass
from typing import Any

from bench.datasets import DATA, bigbench_archive, saved_index
from bench.qa_workload import flat_index, normalize, passages_and_questions

NQ_MEMBER = "bigbench-1.0.0/bigbench/benchmark_tasks/contextual_parametric_knowledge_conflicts/task.json"
#: Passages of the nq_conflicts corpus.
NQ_PASSAGES = 1500


@dataclass(frozen=True)
class Item:
    """One question with its gold answer string and the source of its gold passage."""

    question: str
    answer: str
    source: str


def nq_conflicts_rows() -> list[dict[str, str]]:
    """All examples of the task as {question, context, answer}, extracted once into bench/data/."""
    cache = DATA / "nq_conflicts.json"
    if not cache.is_file():
        with tarfile.open(bigbench_archive()) as t:
            member = t.extractfile(NQ_MEMBER)
            assert member is not None
            task = json.load(member)
        rows = []
        for ex in task["examples"]:
            q, _, ctx = ex["input"].partition("Context:")
            rows.append({"question": " ".join(q.replace("Question:", "").split()),
                         "context": " ".join(ctx.split()), "answer": ex["target"]})
        cache.write_text(json.dumps(rows))
    return json.loads(cache.read_text())


def nq_conflicts() -> tuple[Any, list[Item]]:
    """The nq_conflicts flat index (built on first use) and its items."""
    rows = random.Random(0).sample(nq_conflicts_rows(), NQ_PASSAGES)
    path = DATA / f"nq_conflicts-{NQ_PASSAGES}.slimrag"
    pairs = [(f"nq/{i:04d}.txt", r["context"]) for i, r in enumerate(rows)]
    idx = saved_index(path, lambda: pairs, storage="flat", overwrite=True)
    return idx, [Item(r["question"], r["answer"], src) for (src, _), r in zip(pairs, rows, strict=True)]


def disfl_qa() -> tuple[Any, list[Item]]:
    """The disfl_qa flat index and its answerable questions."""
    _, by_passage = passages_and_questions()
    items = [Item(qa.question, qa.answer, f"disfl_qa/{pid:04d}.txt") for pid, qas in by_passage.items() for qa in qas
             if normalize(qa.answer) in normalize(qa.context)]
    return flat_index(), items


SETS = {"disfl_qa": disfl_qa, "nq_conflicts": nq_conflicts}


def load(name: str, n: int | None = None, seed: int = 0) -> tuple[Any, list[Item]]:
    """The index of QA set ``name`` and ``n`` of its items (a seeded sample; all when None)."""
    idx, items = SETS[name]()
    if n is not None and n < len(items):
        items = random.Random(seed).sample(items, n)
    return idx, items
