"""The check's rules added for its precision and for free answers (issue 29): what an answer adds to the
question must be in its backing sentence, a subject may be named just before that sentence, code is
looked up where it is documented, hyphenated names meet tokenized text, and the corpus's own
vocabulary (`slimrag.rag.vocabulary`) is no claim. A real index built by the real embedder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.rag.attribution import attribute
from slimrag.rag.sentences import content_words, stem
from slimrag.rag.verdict import answers
from slimrag.rag.vocabulary import Vocabulary

DOCS = {
    "notes/recipes.rst": "Soup\n====\n\nSimmer lentils with onion and cumin for half an hour.\n",
    "tv/reed.md": "Austin Reed is a fictional character from the soap opera Days of Our Lives. "
                  "The role was played by actor Ali Campbell from 1992 to 1995.\n",
    "history/victoria.md": "The first settlement in Victoria was at Sullivan Bay under Lieutenant - Governor "
                           "David Collins .\n",
    **{f"py/mod{i}.txt": f"Python Library Documentation: module mod{i}\n\nmod{i}.run(x) Run the task {i}.\n"
       for i in range(5)},
    "py/statistics.txt": "median(data) Return the median (middle value) of numeric data.\n",
}


@pytest.fixture(scope="module")
def idx(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Index]:
    root: Path = tmp_path_factory.mktemp("rules")
    index = Index.build(list(DOCS.items()), root / "r.slimrag", embedder=embedder, storage="flat")
    yield index
    index.close()


def supported(idx: Index, question: str, answer: str, **kw: object) -> list[bool]:
    check = attribute(question, answer, idx.search(question, k=4), idx.embedder, **kw)  # type: ignore[arg-type]
    return [s.supported for s in check.support]


def test_what_the_answer_adds_must_be_in_its_backing_sentence(idx: Index) -> None:
    q = "How long should lentil soup simmer?"
    assert supported(idx, q, "Lentil soup simmers for half an hour.") == [True]
    # restating the question lifts the match; the added cooker, garlic and rice are in no sentence
    assert supported(idx, q, "Lentil soup simmers for half an hour in a pressure cooker with garlic and rice.") == [False]


def test_the_subject_may_be_named_just_before_the_backing_sentence(idx: Index) -> None:
    q = "who played austin reed on days of our lives?"
    assert supported(idx, q, "Austin Reed was played by actor Ali Campbell.") == [True]
    assert supported(idx, q, "Austin Reed was played by actor Ali Campbell in 2017.") == [False]


def test_a_hyphenated_name_meets_tokenized_text(idx: Index) -> None:
    q = "where was the first settlement in victoria?"
    assert supported(idx, q, "The first settlement in Victoria was at Sullivan Bay under Lieutenant-Governor "
                             "David Collins.") == [True]


def test_code_is_looked_up_where_it_is_documented(idx: Index) -> None:
    q = "How can I compute the median of a list of numbers?"
    assert supported(idx, q, "Use `median`, which returns the middle value.") == [True]
    assert supported(idx, q, "Use `mean`, which returns the middle value.") == [False]  # a backticked name is code too


def test_the_corpus_vocabulary_is_no_claim(idx: Index) -> None:
    vocab = Vocabulary(idx)
    assert vocab.common(["Python", "median", "Campbell", "1992"]) == {"python"}  # 5 of 8 documents hold it
    q = "How can I compute the median of a list of numbers?"
    answer = "The median function returns the middle value in Python."
    assert supported(idx, q, answer) == [False]  # "Python" is in no passage retrieved
    assert supported(idx, q, answer, common=vocab.common) == [True]


def test_list_numbers_and_lead_ins_claim_nothing(idx: Index) -> None:
    q = "How can I compute the median of a list of numbers?"
    answer = ("Here's a simple example:\n\n1. Use `median`, which returns the middle value.\n"
              "2. Use `fmean` for the middle value.")
    check = attribute(q, answer, idx.search(q, k=4), idx.embedder)
    assert [(s.sentence, s.supported) for s in check.support] == [
        ("Use `median`, which returns the middle value.", True), ("Use `fmean` for the middle value.", False)]
    # a sentence ending in ":" that names something is a claim all the same
    named = attribute(q, "The median of 2, 3 and 9 is 3:", idx.search(q, k=4), idx.embedder)
    assert len(named.support) == 1


def test_short_plurals_meet_their_singular() -> None:
    assert [stem(w) for w in ("kids", "cats", "defaults", "bus", "this", "plus", "class")] == [
        "kid", "cat", "default", "bus", "this", "plus", "class"]
    assert content_words("the Kids ' Choice Awards") >= {"kid", "choice", "award"}


def test_which_may_be_answered_by_code_or_a_number_who_not_by_a_number() -> None:
    assert answers("Which function returns the current recursion limit?",
                   "The function `getrecursionlimit()` returns the current recursion limit.")
    assert not answers("Which function returns the current recursion limit?",
                       "The function returns the current recursion limit.")
    assert answers("Which port does python -m http.server listen on by default?", "It listens on port 8000.")
    assert not answers("Who won the race in 1990?", "The race was won in 1991.")
    assert answers("Who won the race in 1990?", "Ann Lee won the race.")
