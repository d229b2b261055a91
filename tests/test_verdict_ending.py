"""Where an answer ends, and a purpose clause's main clause (issue 29's check): the cut-off rule reads the
unit that ends the answer text, not the last of attribution's list (its sentences, then its code blocks);
"To copy a directory tree, shutil provides copytree." tells a way. Checked in a real index built by the
real embedder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_verdict_question import built

from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.rag.attribution import attribute
from slimrag.rag.verdict import answers, judge, kind_of

DOCS = {
    "library/json.txt": ("json.loads(s, *, cls=None, object_hook=None) Deserialize s (a str, bytes or bytearray "
                         "instance containing a JSON document) to a Python object using this conversion table. "
                         "data = json.loads(s)  # parse it"),
    "library/shutil.txt": ("shutil.copytree(src, dst, symlinks=False) Recursively copy an entire directory tree "
                           "rooted at src to a directory named dst and return the destination directory."),
}


@pytest.fixture(scope="module")
def idx(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Index]:
    yield from built(tmp_path_factory, embedder, DOCS, "ending")


def _judged(idx: Index, q: str, said: str) -> tuple[list[bool], str, str]:
    """Which units attribution backs, in its order, and the verdict with and without the answer text."""
    hits = idx.search(q, k=2)
    check = attribute(q, said, hits, idx.embedder)  # type: ignore[arg-type]
    return [s.supported for s in check.support], judge(q, said, check, (), hits).kind, kind_of(q, check.support, hits)


def test_prose_after_a_code_block_is_the_answers_end(idx: Index) -> None:
    q = "How do I parse a JSON string into a Python object?"
    # an invented call in the block, then the backed sentence, cut off at the token limit ("... this")
    said = ("```python\nobj = json.parse_string(s)\n```\n"
            "Use json.loads(s) to deserialize s to a Python object using this")
    backed, kind, by_list = _judged(idx, q, said)
    assert backed == [True, False]  # attribution lists the sentence first, the block after it
    assert kind == "not_backed"  # the cut-off sentence ends the text: it answers nothing
    assert by_list == "partial"  # read by the list's order, the block ended the answer and the sentence answered


def test_a_closed_code_block_at_the_end_is_whole(idx: Index) -> None:
    q = "How do I parse a JSON string into a Python object?"
    said = "Here is how:\n```python\ndata = json.loads(s)  # parse it\n```"
    backed, kind, by_list = _judged(idx, q, said)
    assert backed == [True]
    assert kind == "supported"  # its fence closed it: "# parse it" is no phrase cut off
    assert by_list == "not_backed"


def test_chatter_after_a_closed_block_cuts_nothing(idx: Index) -> None:
    # attribution drops "Hope this helps!" (it claims nothing): the sentence before the block, which
    # ends on a stop word, was read as the answer's cut-off end and answered nothing
    q = "How do I parse a JSON string into a Python object?"
    said = ("You can parse it with json.loads(s) to deserialize s to a Python object like this\n"
            "```python\nobj = json.parse_string(s)\n```\nHope this helps!")
    backed, kind, _ = _judged(idx, q, said)
    assert backed == [True, False]  # the sentence, then the invented block
    assert kind == "partial"  # the sentence is whole and answers; the block is marked


def test_a_main_clause_may_open_with_a_name() -> None:
    q = "How do I copy a directory tree?"
    assert answers(q, "To copy a directory tree, shutil provides copytree.")
    assert answers(q, "To copy a directory tree, the shutil module provides copytree.")
    # a purpose clause alone, or with a list after its comma, restates the goal
    assert not answers(q, "To copy an entire directory tree rooted at src to a new location dst.")
    assert not answers(q, "To copy a directory tree, its files and links.")
    # a noun phrase after the comma is no clause, though a plural noun ends in "s" as a verb does
    assert not answers(q, "To copy a directory tree rooted at src, class attributes.")
    assert not answers("How do I parse a date?", "To parse a date, ISO 8601 strings.")


def test_a_verb_ending_in_ly_is_the_way_asked() -> None:
    from slimrag.rag.question import Question

    assert Question.read("How can I multiply two matrices?").way_verb == "multiply"
    assert Question.read("How do I quickly sort a list?").way_verb == "sort"  # an adverb is skipped
    assert answers("How can I multiply two matrices?", "You multiply matrices with the @ operator in Python.")
