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


def test_a_main_clause_may_open_with_a_name() -> None:
    q = "How do I copy a directory tree?"
    assert answers(q, "To copy a directory tree, shutil provides copytree.")
    assert answers(q, "To copy a directory tree, the shutil module provides copytree.")
    # a purpose clause alone, or with a list after its comma, restates the goal
    assert not answers(q, "To copy an entire directory tree rooted at src to a new location dst.")
    assert not answers(q, "To copy a directory tree, its files and links.")
