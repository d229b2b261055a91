"""Mends after review of the check's fifth pass (issue 29): a period named at a sentence's start or by a
ruler's reign answers "when"; only an answer's last sentence may be cut off at a stop word (a list item
earlier is whole); "first" and "last" qualify only after a determiner, and qualifiers meet by stem; a
shell command in a code span names code for "How do I ...?"; a title ends no sentence before a name
only. Examples are the shapes the review found, checked in a real index built by the real embedder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_verdict_question import built, verdict

from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.rag.attribution import attribute
from slimrag.rag.question import asked_qualifiers
from slimrag.rag.sentences import split_sentences
from slimrag.rag.verdict import answers, judge, kind_of, unfinished

DOCS = {
    "docs/battery.md": ("The battery lasts about 10 hours on a single charge. It charges fully in two hours "
                        "from a USB-C port."),
    "docs/history.md": ("Django was released in 2005 by the Lawrence Journal-World. Flask was released in 2010 "
                        "by Armin Ronacher as an April Fools' joke that grew into a framework."),
    "docs/install.md": ("slimrag runs on Python 3.10 and above. Telemetry is off unless you set "
                        "SLIMRAG_TELEMETRY=1; set SLIMRAG_TELEMETRY=0 to turn it off again."),
}


@pytest.fixture(scope="module")
def idx(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Index]:
    yield from built(tmp_path_factory, embedder, DOCS, "review")


def test_a_period_answers_when_at_a_sentence_start_and_as_a_reign() -> None:
    q = "When was the aqueduct built?"
    assert answers(q, "During the Roman Empire.")
    assert answers(q, "It was built during the Roman Empire.")
    assert answers(q, "It was built during the reign of Augustus.")
    # no named period: construction, an unnamed king
    assert not answers(q, "During construction, workers used concrete.")
    assert not answers(q, "It was built during the reign of the king.")


def test_only_the_last_sentence_is_cut_off_at_a_stop_word() -> None:
    assert not unfinished("- Python 3.10 and above", last_sentence=False)
    assert not unfinished("Set SLIMRAG_TELEMETRY=0 to turn it off", last_sentence=False)
    assert answers("Which Python versions does slimrag support?", "- Python 3.10 and above", last_sentence=False)
    # the answer's last sentence still reads as cut at the token limit; an unclosed code span anywhere
    assert unfinished("This means it will not be able to access any other handlers defined by")
    assert not answers("Which Python versions does slimrag support?", "- Python 3.10 and above")
    assert unfinished("Use the `copy", last_sentence=False)


def test_a_list_item_before_the_end_answers(idx: Index) -> None:
    q = "Which Python versions does slimrag support?"
    # the lead-in claims nothing; the backed item answers though it ends on a stop word, the invented one is marked
    assert verdict(idx, q, "slimrag supports:\n\n- Python 3.10 and above\n\n- nothing older.") == ("partial", [True, False])


def test_last_as_a_verb_is_no_qualifier(idx: Index) -> None:
    q = "How long does the battery last?"
    assert asked_qualifiers(q) == ()
    assert verdict(idx, q, "The battery lasts about 10 hours.") == ("supported", [True])


def test_first_in_a_comparison_is_no_qualifier(idx: Index) -> None:
    q = "Which was released first, Django or Flask?"
    assert asked_qualifiers(q) == ()
    assert verdict(idx, q, "Django was released in 2005.") == ("supported", [True])


def test_qualifiers_after_a_determiner_and_by_stem() -> None:
    assert asked_qualifiers("What was the first version of Django?") == (frozenset({"oldest", "earliest", "first"}),)
    assert asked_qualifiers("What is its last release?") == (frozenset({"latest", "newest", "last"}),)
    assert asked_qualifiers("Which settings does the server use by defaults?") == (frozenset({"default"}),)


def test_a_shell_command_names_code_for_a_way() -> None:
    assert answers("How do I install slimrag?", "Run `make demo`.")
    assert answers("How do I upgrade the index?", "Run `slimrag build` again.")
    # a span the question already names, and no span at all, name nothing new
    assert not answers("How do I install slimrag?", "It is `slimrag`.")
    assert not answers("How do I install slimrag?", "The package is small and fast.")


def test_a_title_ends_no_sentence_only_before_a_name() -> None:
    def cut(text: str) -> list[str]:
        return [s.text for s in split_sentences(text)]

    assert cut("The tower is 300 ft. It was built in 1900.") == ["The tower is 300 ft.", "It was built in 1900."]
    assert cut("It is the next gen. It ships in May.") == ["It is the next gen.", "It ships in May."]
    assert cut("He wrote to Rep. Smith. Then he left.") == ["He wrote to Rep. Smith.", "Then he left."]
    assert cut("She met Gov. Brown and Sen. Kennedy.") == ["She met Gov. Brown and Sen. Kennedy."]


def test_an_answer_that_ended_by_itself_keeps_its_last_list_item(idx: Index) -> None:
    """The answer's last sentence is read as cut off on a stop word only when the generation may
    have hit its token limit: an answer that ended by itself (finish reason ``stop``) is whole."""
    q = "Which Python versions does slimrag support?"
    said = "slimrag supports:\n\n- Python 3.10 and above"
    hits = idx.search(q, k=3)
    check = attribute(q, said, hits, idx.embedder)  # type: ignore[arg-type]
    assert [s.supported for s in check.support][-1]
    assert kind_of(q, check.support, hits) == "not_backed"  # unknown ending: it may be cut at the limit
    assert kind_of(q, check.support, hits, ended=True) != "not_backed"
    assert judge(q, said, check, (), hits, ended=True).kind == kind_of(q, check.support, hits, ended=True)
