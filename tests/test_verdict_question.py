"""The check's fourth pass (issue 29): a backed sentence answers only when it and its backing sentence
hold enough of the question (`slimrag.rag.verdict.on_question`), "when" is a question word only where
it asks, and the stemmer meets doubled consonants and ``-ies``. The passages and answers are the
tuning slices' (nq_conflicts, `bench.answers --recheck`), in a real index built by the real embedder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.rag.attribution import Attribution, attribute
from slimrag.rag.question import answer_type
from slimrag.rag.sentences import content_words, stem
from slimrag.rag.verdict import answers, kind_of, on_question
from slimrag.types import Hit

DOCS = {
    "nq/0649.txt": "The Fugitive is an American drama series created by Roy Huggins . It was produced by QM "
                   "Productions and United Artists Television . It aired on ABC from 1963 to 1967 . Dan Finnerty "
                   "starred as Dr. Richard Kimble , a physician who is wrongfully convicted of his wife 's murder "
                   "and sentenced to receive the death penalty .",
    "nq/1200.txt": "`` It Is Well With My Soul '' is a hymn penned by hymnist Clarence Thomas and composed by "
                   "Philip Bliss . First published in Gospel Songs No. 2 by Ira Sankey and Bliss ( 1876 ) , it is "
                   "possibly the most influential and enduring in the Bliss repertoire and is often taken as a "
                   "choral model , appearing in hymnals of a wide variety of Christian fellowships .",
    "nq/0966.txt": "Austin Reed is a fictional character from the soap opera Days of Our Lives . The role was "
                   "played by actor Ali Campbell from 1992 to 1995 , and again from 2011 to 2012 .",
}


def built(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder, docs: dict[str, str],
          name: str) -> Iterator[Index]:
    """A flat index of ``docs`` built by the real embedder, closed after the module's tests (fixtures
    of this module and of the check's other test modules)."""
    root: Path = tmp_path_factory.mktemp(name)
    index = Index.build(list(docs.items()), root / f"{name}.slimrag", embedder=embedder, storage="flat")
    yield index
    index.close()


@pytest.fixture(scope="module")
def idx(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Index]:
    yield from built(tmp_path_factory, embedder, DOCS, "question")


def verdict(idx: Index, question: str, answer: str) -> tuple[str, list[bool]]:
    return checked(idx, question, answer)[:2]  # type: ignore[return-value]


def checked(idx: Index, question: str, answer: str) -> tuple[str, list[bool], Attribution, list[Hit]]:
    """The verdict, which sentences are backed, the attribution and the hits it was checked against."""
    hits = idx.search(question, k=3)
    check = attribute(question, answer, hits, idx.embedder)  # type: ignore[arg-type]
    return kind_of(question, check.support, hits), [s.supported for s in check.support], check, hits


def test_a_backed_sentence_off_the_question_answers_nothing(idx: Index) -> None:
    q = "who played the fugitive in the tv show?"
    # the grounded answer of the tuning slice: copied from the right page, and says who created it
    kind, backed = verdict(idx, q, "The Fugitive is an American drama series created by Roy Huggins .")
    assert backed == [True] and kind == "not_backed"


def test_a_partial_answer_whose_backed_part_does_not_answer_is_withheld(idx: Index) -> None:
    q = "who wrote it is well with my soul hymn?"
    # the free answer of the tuning slice: an invented writer, then a backed sentence on publishing
    said = ('The hymn "It Is Well With My Soul" is a well-known Christian hymn written by Marlo Thomas and '
            "composed by Philip Bliss. It was first published in Gospel Songs No. 2 by Ira Sankey and Bliss "
            "(1876) and later taken as a choral model for many Christian")
    kind, backed, check, hits = checked(idx, q, said)
    assert backed == [False, True] and kind == "not_backed"
    assert not on_question(q, check.support[1], hits)


def test_a_backed_answer_on_the_question_stays_supported(idx: Index) -> None:
    q = "who played austin reed on days of our lives?"
    assert verdict(idx, q, "The character Austin Reed was played by actor Ali Campbell .") == ("supported", [True])


def test_when_is_a_question_word_only_where_it_asks() -> None:
    assert answer_type("Which argparse action stores True when a flag is given?") == "name"
    assert answer_type("What occurs when Pauli repulsion no electron clouds overlap from different atoms ?") is None
    assert answer_type("when did the spanish and portuguese colonies gain their independence") == "when"
    assert answer_type("How many projects a year does no wait the Warsaw Gallery Weekend is held when ?") == "when"
    # a question that takes back its start is typed by what follows
    assert answer_type("Where did Kublai um oh no rather when did he move the Mongol capital ?") == "when"
    assert answer_type("When was the treaty signed no sorry who signed the treaty ?") == "name"


def test_doubled_consonants_and_ies_meet_their_stems() -> None:
    assert [stem(w) for w in ("starring", "stopped", "running", "called", "stories", "studied", "passed")] == [
        "star", "stop", "run", "call", "story", "study", "pass"]
    assert "star" in content_words("Marlon Jackson and Carl Anderson starring as Jesus and Judas")


def test_a_lower_case_question_still_names_its_names() -> None:
    q = "who played mrs wolowitz on the big bang theory?"
    # the tuning slice's answer: the passage's sentence, whose names are all the question's
    assert not answers(q, "She was known for providing the voice of recurring unseen character Mrs. Wolowitz on "
                          "the television series The Big Bang Theory .")
    assert answers(q, "Saru Batu Savcı Bey provided the voice of Mrs. Wolowitz on The Big Bang Theory.")


def test_a_sentence_introducing_what_follows_answers_by_its_code_only() -> None:
    # the folder set's free answer (pydocs #0): backed, and introduces code it does not show
    q = "How do I parse a JSON string into a Python object?"
    assert not answers(q, "You can view its JSON string representation with a simple line of code:")
    assert not answers("How do I shuffle a list in place?", "Here's how you can use it:\n```python")
    # the grounded answer of pydocs #29 names the code before its colon
    assert answers("How do I make a deep copy of an object?",
                   "To make a deep copy of an object, you can use the `copy.deepcopy` function from Python's `copy` module:")


def test_a_number_word_is_no_name() -> None:
    # disfl_qa tuning slice #31 (grounded): "two" answered the "which" the question asks
    q = "Which or no make that when forces are at right angles to each other what can they be broken down to ?"
    assert not answers(q, "When forces are at right angles to each other, they can be broken down into two components.")
    assert answers("Which environment variable adds directories to the module search path?",
                   "The PYTHONPATH environment variable adds directories to the module search path.")
    assert not answers("Which environment variable adds directories to the module search path?",
                       "The first entry in the module search path is the directory that contains the input script.")
