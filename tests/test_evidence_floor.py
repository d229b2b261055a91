"""The evidence-only answer (``slimrag ask --no-llm``, `slimrag.rag.evidence.evidence_answer`) applies
the relevance floor to the search's own result, as `RAG` does (issue 29 item 5): its `Hits.similarity`
is the best vector candidate's cosine, cut from the shown hits or not, where a sorted copy of the
hits would fall back to the shown hits' own similarity and refuse a question `RAG` answers. On a
real index of the test corpus with the real MiniLM embedder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_floor import ANSWERABLE, UNRELATED, Silent

from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.rag.evidence import evidence_answer
from slimrag.rag.guards import DEFAULT_FLOOR, NO_ANSWER, best_similarity
from slimrag.rag.pipeline import RAG

#: Four subjects of four documents: hybrid's fused top 2 are keyword matches whose own cosines are
#: below the floor (0.27, 0.24), while the best vector candidate, cut by the fusion, reaches it (0.36).
CUT = "cat lighthouse soup planets"


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Index]:
    from conftest import DOCS, write_tree

    root = tmp_path_factory.mktemp("evidence-floor")
    Index.build(write_tree(root / "docs", DOCS), root / "f.slimrag", embedder=embedder).close()
    with Index.open(root / "f.slimrag", embedder) as idx:
        yield idx


def test_the_question_s_best_chunk_is_cut_from_the_shown_hits(index: Index) -> None:
    hits = index.search(CUT, k=2, mode="hybrid")
    assert hits.similarity is not None and hits.similarity >= DEFAULT_FLOOR
    shown = best_similarity(sorted(hits, key=lambda h: -h.score))  # a plain list: the shown hits' own
    assert shown is not None and shown < DEFAULT_FLOOR


@pytest.mark.parametrize("mode", ["hybrid", "vector", "keyword"])
def test_no_llm_refuses_exactly_what_rag_refuses(index: Index, mode: str) -> None:
    rag = RAG(index, Silent(), mode=mode)
    for question in (CUT, *ANSWERABLE, *UNRELATED):
        for k in (2, 4):
            answered = rag.turn(question, k).prompt is not None
            ans = evidence_answer(index, question, k, mode=mode, floor=DEFAULT_FLOOR)
            assert ans.abstained is not answered, (mode, question, k)
            assert (ans.text == NO_ANSWER) is not answered
            assert ans.abstained is rag.evidence_answer(question, k).abstained


def test_no_llm_answers_the_cut_question_with_its_evidence(index: Index) -> None:
    ans = evidence_answer(index, CUT, 2, mode="hybrid")
    assert not ans.abstained and ans.evidence and ans.used
    assert [h.score for h in ans.sources] == sorted((h.score for h in ans.sources), reverse=True)
