"""Three readings of what a backed sentence answers (issue 29, `slimrag.rag.verdict`), found on the
built HTML folder set's free answers, each confidently wrong there:

- a value stated in a version note that a later note restates is no longer the value (`current`):
  "The default pickle protocol is 3." was backed by "Changed in version 3.0: The default protocol is
  3.", above "Changed in version 3.8: The default protocol is 4.";
- a number inside a name counts nothing (`_NAMED_NUMBER`): "... recommended by the PEP 8 standard"
  answered "How much indentation ...?";
- a way asked with a light verb ("How do I make a deep copy ...?") is answered by a means, code or a
  word that says one ("use", "call", "by"), not by a description of what a copy is.

The passages here are written for this test, in a real index built by the real embedder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_verdict_question import built, verdict

from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.rag.verdict import _NAMED_NUMBER, answers

DOCS = {
    "library/squash.rst.txt": (
        "Module Interface\n\n"
        ".. data:: DEFAULT_LEVEL\n\n"
        "   An integer, the default compression level used by squash.  Currently the default\n"
        "   compression level is 6.\n\n"
        "   .. versionchanged:: 2.0\n\n"
        "      The default compression level is 3.\n\n"
        "   .. versionchanged:: 2.4\n\n"
        "      The default compression level is 6.\n"),
    "library/tarpit.html": (
        "tarpit.BLOCK_SIZE¶\n\n"
        "The block size tarpit writes archives in.\n\n"
        "Changed in version 1.5: The default block size of tarpit is 512.\n"),
    "tutorial/style.html": (
        "Coding style¶\n\n"
        "Use 4 spaces per indentation level and no tabs, as the PEP 8 style guide recommends.\n"),
    "library/records.html": (
        "records — record copies¶\n\n"
        "A shallow copy of a record constructs a new record that refers to the original record's fields. "
        "To make a deep copy of a record, call records.clone(record, deep=True).\n"),
}


@pytest.fixture(scope="module")
def idx(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Index]:
    yield from built(tmp_path_factory, embedder, DOCS, "superseded")


def test_a_value_a_later_version_note_restates_is_no_longer_the_value(idx: Index) -> None:
    q = "What is the default compression level of squash?"
    assert verdict(idx, q, "The default compression level of squash is 3.") == ("not_backed", [True])
    assert verdict(idx, q, "The default compression level of squash is 6.") == ("supported", [True])


def test_a_version_note_no_later_note_restates_still_holds(idx: Index) -> None:
    q = "What is the default block size of tarpit?"
    assert verdict(idx, q, "The default block size of tarpit is 512.") == ("supported", [True])


def test_a_number_in_a_name_counts_nothing(idx: Index) -> None:
    q = "How many spaces per indentation level does the coding style use?"
    assert verdict(idx, q, "The coding style uses indentation as the PEP 8 style guide recommends.") == (
        "not_backed", [True])
    assert verdict(idx, q, "The coding style uses 4 spaces per indentation level.") == ("supported", [True])


def test_which_numbers_name() -> None:
    assert _NAMED_NUMBER.sub(r"\g<name>", "as the PEP 8 guide says, 4 spaces") == "as the PEP guide says, 4 spaces"
    assert _NAMED_NUMBER.sub(r"\g<name>", "the guide (PEP 8) says 4") == "the guide (PEP) says 4"
    assert _NAMED_NUMBER.sub(r"\g<name>", "since Python 3.8 it is 4") == "since Python it is 4"
    # a capital that opens the sentence is no name, and a number after a lower-case word counts
    assert _NAMED_NUMBER.sub(r"\g<name>", "The 2010 census counted 5") == "The 2010 census counted 5"
    assert _NAMED_NUMBER.sub(r"\g<name>", "He won 8 Grammy Awards") == "He won 8 Grammy Awards"


def test_a_way_asked_with_a_light_verb_is_answered_by_a_means(idx: Index) -> None:
    q = "How do I make a deep copy of a record?"
    described = "A shallow copy of a record constructs a new record that refers to the original record's fields."
    assert verdict(idx, q, described) == ("not_backed", [True])
    assert verdict(idx, q, "Call `records.clone(record, deep=True)`.") == ("supported", [True])
    # a means said in words answers too; a way asked with a full verb keeps its own rule (the verb said)
    assert answers(q, "Call the clone function of records with deep set to true.")
    assert not answers("How do I copy a record?", "A shallow record refers to the original fields.")
