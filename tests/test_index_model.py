"""Property-based, stateful: a model of the index (a dict source -> text) and the real index, flat
and slim, driven by the same random add / update / remove / compact / reopen steps, must agree
after every step (Chroma's ``test_embeddings.py`` approach).

After each step: the stored documents are the model's keys; each document's chunks are its text
(tiny texts: one chunk each, an exact slice); keyword search for a document's own word finds that
document first; vector search for a document's exact text finds it first (score 1 against itself);
`Index.check` is clean (one vector per live chunk, none without a chunk, SQLite sound).

The default suite runs 25 derandomized examples of 8 steps per storage kind (a fixed sequence of
cases); the slow suite 200 random ones of 12 steps. The embedder is `bench.crash.HashEmbedder`
(character trigrams hashed to 64 dims, deterministic): what is tested is the agreement of catalog,
vectors and model through every step, and the real MiniLM costs 10-170 ms a call here (1.3 s
with its two threads on a loaded 2-core machine), which made 25 examples take minutes. The real
model's search quality is tested against brute force in ``test_index.py``.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from bench.crash import HashEmbedder
from slimrag.config import IndexConfig
from slimrag.embed.base import Embedder
from slimrag.index.core import Index

SOURCES = [f"notes/n{i}.txt" for i in range(6)]
WORDS = "apple river stone cloud violin garden copper lantern harbor orbit meadow signal".split()
_texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join)


def _own_word(source: str) -> str:
    """A word only this source's text contains (keyword search must find it there and only there)."""
    return "kiwi" + source.split("/n")[1].split(".")[0] + "x"


def machine(embedder: Embedder, root: Path, storage: str) -> type[RuleBasedStateMachine]:
    """The state machine class for one test (its index folders go under ``root``)."""
    counter = itertools.count()

    class IndexVsModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.path = root / f"{storage}-{next(counter)}.slimrag"
            self.config = IndexConfig(storage=storage, embed_batch=8)
            self.index = Index.create(self.path, embedder=embedder, config=self.config)
            self.model: dict[str, str] = {}

        def teardown(self) -> None:
            self.index.close()

        @rule(source=st.sampled_from(SOURCES), words=_texts)
        def add_or_update(self, source: str, words: str) -> None:
            text = f"{_own_word(source)} {words}"
            rep = self.index.add([(source, text)])
            old = self.model.get(source)
            assert (rep.added, rep.updated, rep.unchanged) == (
                int(old is None), int(old is not None and old != text), int(old == text))
            self.model[source] = text

        @rule(batch=st.dictionaries(st.sampled_from(SOURCES), _texts, min_size=2, max_size=4))
        def add_many(self, batch: dict[str, str]) -> None:
            pairs = [(s, f"{_own_word(s)} {w}") for s, w in batch.items()]
            self.index.add(pairs)
            self.model.update(pairs)

        @precondition(lambda self: bool(self.model))
        @rule(data=st.data())
        def remove(self, data: st.DataObject) -> None:
            source = data.draw(st.sampled_from(sorted(self.model)))
            assert self.index.remove([source]) == 1
            del self.model[source]

        @rule(source=st.sampled_from(SOURCES))
        def remove_maybe_absent(self, source: str) -> None:
            assert self.index.remove([source]) == int(source in self.model)
            self.model.pop(source, None)

        @rule()
        def compact(self) -> None:
            self.index.compact()

        @rule()
        def reopen(self) -> None:
            self.index.close()
            self.index = Index.open(self.path, embedder=embedder)

        @invariant()
        def agrees_with_model(self) -> None:
            idx = self.index
            assert [d.source for d in idx.documents()] == sorted(self.model)
            chunks = idx.catalog.chunks(idx.catalog.live_ids())
            assert sorted((c.source, c.text) for c in chunks.values()) == sorted(self.model.items())
            for source in self.model:
                assert idx.search(_own_word(source), k=1, mode="keyword")[0].source == source
            if self.model:  # one vector search per step keeps the suite fast; the text finds itself
                source = min(self.model)
                top = idx.search(self.model[source], k=1, mode="vector")[0]
                assert top.source == source and top.score > 0.999, (top, self.model)
            rep = idx.check()
            assert rep.ok and rep.chunks == len(self.model), rep.problems()

    return IndexVsModel


FAST = settings(max_examples=25, stateful_step_count=8, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
SLOW = settings(FAST, max_examples=200, stateful_step_count=12, derandomize=False)


@pytest.mark.parametrize("storage", ["flat", "slim"])
def test_index_agrees_with_a_dict_model(storage: str, tmp_path: Path) -> None:
    run_state_machine_as_test(machine(HashEmbedder(), tmp_path, storage), settings=FAST)
    assert len(list(tmp_path.glob(f"{storage}-*.slimrag"))) >= 25  # one index per example ran


@pytest.mark.slow
@pytest.mark.parametrize("storage", ["flat", "slim"])
def test_index_agrees_with_a_dict_model_many_examples(storage: str, tmp_path: Path) -> None:
    run_state_machine_as_test(machine(HashEmbedder(), tmp_path, storage), settings=SLOW)
