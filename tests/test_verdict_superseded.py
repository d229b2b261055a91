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
        "Changed in version 1.5: The default block size of tarpit is 512.\n\n"
        "tarpit.BLOCK_COUNT¶\n\n"
        "The block count of an archive.\n\n"
        "Changed in version 1.5: Accepts a negative count. The default block count of tarpit is 8.\n\n"
        "Changed in version 2.0: The default block count of tarpit is 20.\n"),
    "library/squish.rst.txt": (
        ".. data:: DEFAULT_WINDOW\n\n"
        "   An integer, the default window size of squish.\n\n"
        "   .. versionchanged:: 2.0\n"
        "      The default window size of squish is 9.\n\n"
        "   .. versionchanged:: 2.4 The default window size of squish is 15.\n\n"
        ".. data:: DEFAULT_MEMORY\n\n"
        "   An integer, the default memory level of squish.\n\n"
        "   .. versionchanged:: 2.0\n"
        "      The default memory level of squish is 8.\n"),
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
    # another object's later note restates nothing of this one: DEFAULT_WINDOW's 2.4 note is not memory's
    q = "What is the default memory level of squish?"
    assert verdict(idx, q, "The default memory level of squish is 8.") == ("supported", [True])


def test_every_form_of_a_note_is_read(idx: Index) -> None:
    # the body on the line under the directive, the body on the directive's line
    q = "What is the default window size of squish?"
    assert verdict(idx, q, "The default window size of squish is 9.") == ("not_backed", [True])
    assert verdict(idx, q, "The default window size of squish is 15.") == ("supported", [True])
    # a built page's note of two sentences: the second is of that version too
    q = "What is the default block count of tarpit?"
    assert verdict(idx, q, "The default block count of tarpit is 8.") == ("not_backed", [True])
    assert verdict(idx, q, "The default block count of tarpit is 20.") == ("supported", [True])


def test_a_question_for_a_version_or_a_date_is_answered_by_its_note() -> None:
    """The rule reads the passages' notes directly (no retrieval): the 3.0 note is no longer the
    default, and it is what answers "in which version" and "when"."""
    from slimrag.rag.verdict import kind_of
    from slimrag.types import Evidence, Hit, Support

    page = ("pickled.DEFAULT_FORMAT¶\n\nThe default format of pickled.\n\n"
            "Changed in version 3.0: The default format of pickled is 3.\n\n"
            "Changed in version 3.8: The default format of pickled is 4.\n")
    hit = Hit(1, 1.0, page, "library/pickled.html", {"ordinal": 0})
    note = page.index("Changed in version 3.0")
    said = Evidence(page[note:page.index("\n", note)], hit.label, 1, note, page.index("\n", note), 1.0)
    for question, answer, kind in [
            ("What is the default format of pickled?", "The default format of pickled is 3.", "not_backed"),
            ("In which version was the default format of pickled 3?", "It was 3 in version 3.0.", "supported"),
            ("When was the default format of pickled 3?", "The default format was 3 in 2008.", "supported")]:
        support = Support(answer, (hit.label,), (said,), True)
        assert kind_of(question, [support], [hit]) == kind, question


def test_version_notes_are_dated_where_they_stand() -> None:
    from slimrag.rag.stated import version_of

    rst = ".. data:: HAS_NPN\n\n   .. versionadded:: 3.3\n\n.. data:: HAS_ALPN\n\n   Whether it has ALPN.\n"
    assert version_of(rst, rst.index(".. data:: HAS_ALPN")) is None  # a bare note dates nothing after it
    assert version_of(rst, rst.index("Whether")) is None
    body = "   .. versionchanged:: 3.10\n      Accepts bytes.  And paths.\n"
    assert version_of(body, body.index("Accepts")) == version_of(body, body.index("And")) == (3, 10)
    page = "Changed in version 3.8: The default is 4. It was 3.\n\nThe next paragraph."
    assert version_of(page, page.index("It was")) == (3, 8) and version_of(page, page.index("The next")) is None


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
    # a list bullet or a bold heading is no name, nor is one letter ("O 2"), and a share stays a count
    assert _NAMED_NUMBER.sub(r"\g<name>", "* Use 4-space indentation") == "* Use 4-space indentation"
    assert _NAMED_NUMBER.sub(r"\g<name>", "**Indentation:** Use 4 spaces") == "**Indentation:** Use 4 spaces"
    assert _NAMED_NUMBER.sub(r"\g<name>", "pure O 2 in space") == "pure O 2 in space"
    assert _NAMED_NUMBER.sub(r"\g<name>", "in the United States 90 % of it") == "in the United States 90 % of it"


def test_a_number_after_a_name_counts_what_the_question_counts() -> None:
    assert answers("How many times did plague occur in Venice?", "Plague occurred in Venice 22 times.")
    assert answers("How many apples did he give Alice?", "He gave Alice 3 apples.")
    # "what number" asks for the number in a name, which only how-many and how-much questions set aside
    assert answers("What number did Michael Jordan wear?", "Jordan wore No. 23 for the Bulls.")


def test_a_way_asked_with_a_light_verb_is_answered_by_a_means(idx: Index) -> None:
    q = "How do I make a deep copy of a record?"
    described = "A shallow copy of a record constructs a new record that refers to the original record's fields."
    assert verdict(idx, q, described) == ("not_backed", [True])
    assert verdict(idx, q, "Call `records.clone(record, deep=True)`.") == ("supported", [True])
    # a means said in words answers too, and so does an instruction; a description does not
    assert answers(q, "Call the clone function of records with deep set to true.")
    assert answers(q, "The records module's clone function returns a deep copy.")
    assert answers(q, "Clone the record with deep set to true.")
    assert not answers(q, "The difference between shallow and deep copies is only relevant for nested records.")
    # a way asked with a full verb keeps its own rule (the verb said)
    assert not answers("How do I copy a record?", "A shallow record refers to the original fields.")
