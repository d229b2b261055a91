"""Search results carry their vector similarity (`Hit.similarity`, and the search's best,
`Hits.similarity`), and the relevance floor reads it instead of searching again (`slimrag.rag.guards`, issue 29 item 5). Against a real index of the test
corpus with the real MiniLM embedder: the floor's decision equals the one-hit probe's that hybrid
ran before on twelve answerable and twelve unrelated questions; each hit's similarity is the exact
cosine where the search computed one; one turn embeds the question once."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
from test_progressive import FailingEmbedder

from bench.crash import HashEmbedder, docs
from slimrag.config import GenerationConfig, SearchConfig
from slimrag.embed.base import Embedder
from slimrag.embed.local import LocalEmbedder
from slimrag.index import writer
from slimrag.index.core import Index
from slimrag.llm.base import Delta, Generator
from slimrag.mcp.results import PassageHit
from slimrag.prompt import Prompt
from slimrag.rag.guards import DEFAULT_FLOOR, FLOORS, answerable, best_similarity
from slimrag.rag.pipeline import RAG
from slimrag.rag.wire import hit_json
from slimrag.types import Hits, Usage

#: Questions the test corpus answers (best cosine 0.51-0.82 with MiniLM)
ANSWERABLE = ("What is the office cat called?", "Where does Whiskers sleep?", "How do I install slimrag?",
              "Can I use slimrag on Windows?", "Which day will it rain?", "What is the weather on Friday?",
              "How long do I bake bread?", "How long should lentil soup simmer?",
              "How do I compute Fibonacci numbers?", "How many moons does Mars have?",
              "Which is the largest planet?", "When does the lighthouse keeper light the lamp?")
#: Questions it does not (best cosine 0.11-0.22)
UNRELATED = ("What is the capital of France?", "Who won the 1998 World Cup?", "hello", "a", "x", "q",
             "What is the stock price of Apple today?", "How do I change a car tyre?", "Who painted the Mona Lisa?",
             "How many players are on a basketball team?", "Translate good morning into Japanese",
             "Who won the Tour de France in 2003?")


class Counting(Embedder):
    """The real embedder, counting the texts it is asked to embed."""

    def __init__(self, inner: Embedder) -> None:
        self.inner, self.model_id, self.dim, self.kind = inner, inner.model_id, inner.dim, inner.kind
        self.texts = 0

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        self.texts += len(texts)
        return self.inner.embed_batch(texts)


class Silent(Generator):
    """A generator that answers "ok" (the floor's test never reaches it for unrelated questions)."""

    def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
        yield Delta("ok", usage=Usage(prompt_tokens=1, completion_tokens=1), finish_reason="stop")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Path]:
    from conftest import DOCS, write_tree

    root = tmp_path_factory.mktemp("floor")
    Index.build(write_tree(root / "docs", DOCS), root / "f.slimrag", embedder=embedder).close()
    yield root / "f.slimrag"


@pytest.fixture(scope="module")
def index(built: Path, embedder: LocalEmbedder) -> Iterator[Index]:
    with Index.open(built, embedder) as idx:
        yield idx


def cosines(index: Index, query: str) -> dict[int, float]:
    """chunk id -> exact cosine with ``query``, every live chunk (a flat vector search of all)."""
    return {h.chunk_id: h.score for h in index.search(query, k=1000, mode="vector")}


@pytest.mark.parametrize("mode", ["hybrid", "vector"])
def test_the_floor_decides_as_the_probe_did(index: Index, mode: str) -> None:
    probe = FLOORS["keyword"]  # the one-hit vector search hybrid ran before
    for question in ANSWERABLE + UNRELATED:
        hits = index.search(question, k=4, mode=mode)
        decided = answerable(index, mode, [question], hits, DEFAULT_FLOOR)
        assert decided == probe(index, [question], hits, DEFAULT_FLOOR, None) == (question in ANSWERABLE), question
        # the best similarity carried is the index's best cosine (the probe's) on this corpus
        assert best_similarity(hits) == pytest.approx(max(cosines(index, question).values()), abs=1e-6)


def test_a_search_carries_its_best_cosine_even_when_the_cut_drops_that_chunk(index: Index) -> None:
    dropped = 0
    for question in ANSWERABLE + UNRELATED:
        exact = cosines(index, question)
        for k in (1, 2):
            hits = index.search(question, k=k)  # hybrid, the default
            assert isinstance(hits, Hits) and hits.similarity == pytest.approx(max(exact.values()), abs=1e-6)
            dropped += max(exact, key=exact.__getitem__) not in {h.chunk_id for h in hits}
        assert index.search(question, k=2, mode="keyword").similarity is None
    assert dropped >= 1  # a fused cut without the best vector candidate happened
    assert best_similarity(list(index.search(ANSWERABLE[0], k=2))) is not None  # a plain list: the hits' own


def test_similarity_is_the_exact_cosine_of_each_vector_candidate(index: Index) -> None:
    loose = 0
    for question in ANSWERABLE + UNRELATED[:3]:
        exact = cosines(index, question)
        vector = index.search(question, k=4, mode="vector")
        assert [h.similarity for h in vector] == [h.score for h in vector]
        assert all(h.similarity is None for h in index.search(question, k=4, mode="keyword"))
        # two vector candidates: the other fused hits were found by keyword search alone
        cfg = SearchConfig(k=4, candidates=2)
        candidates = {h.chunk_id for h in index.search(question, mode="vector", config=cfg)}
        for h in index.search(question, config=cfg):
            if h.chunk_id in candidates:
                assert h.similarity == pytest.approx(exact[h.chunk_id], abs=1e-6)
            else:
                assert h.similarity is None
                loose += 1
    assert loose >= 3  # the rule for keyword-only hits was exercised
    for hits in index.search_batch(ANSWERABLE[:3], k=3):
        assert [h.similarity for h in hits] == [h.score for h in hits] and len(hits) == 3


def test_a_turn_embeds_the_question_once(built: Path, embedder: LocalEmbedder) -> None:
    counting = Counting(embedder)
    with Index.open(built, counting) as idx:
        for mode, texts in (("hybrid", 1), ("vector", 1), ("keyword", 1)):  # keyword: the probe's only
            rag = RAG(idx, Silent(), mode=mode)
            for question in (ANSWERABLE[0], UNRELATED[0]):
                counting.texts = 0
                turn = rag.turn(question)
                assert (turn.prompt is not None) == (question in ANSWERABLE)
                assert counting.texts == texts, (mode, question)


def test_hits_on_the_wire_carry_similarity(index: Index) -> None:
    hybrid = index.search(ANSWERABLE[0], config=SearchConfig(k=4, candidates=2))
    for h in hybrid + index.search(ANSWERABLE[0], k=2, mode="keyword"):
        assert hit_json(h)["similarity"] == h.similarity
        sim = PassageHit.from_hit(h).similarity
        assert sim is None if h.similarity is None else sim == pytest.approx(h.similarity, abs=1e-6)
    assert any(h.similarity is None for h in hybrid) and any(h.similarity is not None for h in hybrid)


def test_a_chunk_awaiting_its_vector_gets_the_similarity_the_search_computed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer, "COMMIT_CHUNKS", 16)
    monkeypatch.setattr(writer, "EMBED_PART_CHUNKS", 16)
    with pytest.raises(KeyboardInterrupt):  # 48 of 120 chunks embedded, the rest await theirs
        Index.build(docs("doc", 120, 7), tmp_path / "cut", embedder=FailingEmbedder(fail_at=4))
    emb = HashEmbedder()
    with Index.open(tmp_path / "cut", embedder=emb) as idx:
        awaiting = set(idx.state.awaiting().tolist())
        query = "uniq110 doc110"
        hits = idx.search(query, k=3)
        assert idx._query.last_coverage.filled > 0 and hits[0].chunk_id in awaiting
        want = float(idx.state.recompute(np.asarray([hits[0].chunk_id]))[0] @ emb.embed([query])[0])
        assert hits[0].similarity == pytest.approx(want, abs=1e-5)
