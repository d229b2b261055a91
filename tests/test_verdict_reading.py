"""The question's reading (`slimrag.rag.question.Question`): each reading has one regex and one name,
and a reading handed to the verdict's rules judges as the question's text does."""

from __future__ import annotations

from slimrag.rag.question import QUALIFIERS, Question, asks_a_way, has_type
from slimrag.rag.sentences import content_words, key_terms, stem
from slimrag.rag.verdict import answers


def test_a_question_is_read_once_for_every_rule() -> None:
    q = Question.read("How do I parse the default ISO 8601 date string in Python?")
    assert q.words == content_words(q.text) and q.terms == key_terms(q.text)
    assert q.way and q.way_verb == stem("parse") and q.code_verb is None
    assert q.qualifiers == (QUALIFIERS[0],) and q.kind is None and not q.person
    assert Question.read(q) is q


def test_light_verbs_ask_for_no_verb() -> None:
    q = Question.read("How do I make a copy of a list?")
    assert q.way and q.way_verb is None
    assert Question.read("Which function returns the current recursion limit?").code_verb == stem("returns")
    assert Question.read("Which function sets the default timeout?").code_verb == stem("sets")
    assert Question.read("Which flag makes the output quiet?").code_verb is None


def test_a_person_is_asked_by_who_and_where() -> None:
    assert Question.read("who played the fugitive in the tv show?").person
    assert not Question.read("which port does the server listen on?").person


def test_a_bare_how_to_asks_a_way_for_decoding_and_the_verdict_alike() -> None:
    assert asks_a_way("How to parse an ISO date?") and asks_a_way("How does one parse an ISO date?")
    assert asks_a_way("How can I parse an ISO date?")
    assert not asks_a_way("How many moons does Mars have?")
    bare, subject = Question.read("How to copy a directory tree?"), Question.read("How do I copy a directory tree?")
    assert bare.way and bare.way_verb == subject.way_verb == stem("copy")
    # the purpose clause restates the goal of either, and the asked verb is asked of either
    for q in (bare, subject):
        assert not answers(q, "To copy an entire directory tree rooted at src to a new location dst.")
        assert not answers(q, "The shutil module offers high-level file operations.")
        assert answers(q, "To copy a directory tree, shutil provides copytree.")


def test_a_reading_judges_as_the_question_does() -> None:
    for question, sentence, answered in [
        ("How do I parse an ISO 8601 date string?", "The `date` class in Python is a built-in datetime object.", False),
        ("How do I parse an ISO 8601 date string?", "Use `date.fromisoformat` to parse it.", True),
        ("How do I copy a directory tree?", "To copy an entire directory tree rooted at src.", False),
        ("which port does the server listen on?", "The server listens on port 8000.", True),
        ("who played mrs wolowitz on the big bang theory?", "Mrs. Wolowitz was on The Big Bang Theory.", False),
    ]:
        assert answers(Question.read(question), sentence) is answers(question, sentence) is answered, question


def test_a_period_is_a_when_value_for_evidence_and_the_verdict_alike() -> None:
    # evidence's "answer" feature and the verdict's typed answers read the same has_type
    assert has_type("when", "It was built during the reign of Augustus.", set()) == 1.0
    assert has_type("when", "During World War II the plant made tanks.", set()) == 1.0
    assert has_type("when", "The road was closed during construction.", set()) == 0.0
    assert answers("When was the aqueduct built?", "It was built during the reign of Augustus.")
    assert not answers("When was the aqueduct built?", "It was built during construction.")
