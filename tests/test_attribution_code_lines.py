"""Attribution of code in the Python docs (issue 29, fifth pass): a Sphinx role (":func:") is markup,
no claim, and the signature line just before a sentence (".. function:: getrecursionlimit()", too short
to be a candidate sentence) shows the code that sentence documents. The passage is the folder set's
(library/sys.rst), in a real index built by the real embedder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_verdict_question import built
from test_verdict_rules import supported

from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index

SYS = """.. function:: getrecursionlimit()

   Return the current value of the recursion limit, the maximum depth of the Python
   interpreter stack.  This limit prevents infinite recursion from causing an
   overflow of the C stack and crashing Python.  It can be set by
   :func:`setrecursionlimit`.

.. function:: getrefcount(object)

   Return the reference count of the *object*.  The count returned is generally one
   higher than you might expect, because it includes the (temporary) reference as
   an argument to :func:`getrefcount`.
"""


@pytest.fixture(scope="module")
def idx(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Index]:
    yield from built(tmp_path_factory, embedder, {"library/sys.rst.txt": SYS}, "codelines")


def test_a_role_and_a_signature_line_back_the_documented_function(idx: Index) -> None:
    q = "Which function returns the current recursion limit?"
    # the folder set's free answer: withheld before, its "func" a word no sentence held and its
    # function's name only on the signature line
    assert supported(idx, q, "The function :func:`getrecursionlimit` returns the current recursion limit.") == [True]
    assert supported(idx, q, "The function `getrecursionlimit` returns the current recursion limit.") == [True]


def test_code_the_passage_does_not_show_stays_unbacked(idx: Index) -> None:
    q = "Which function returns the current recursion limit?"
    assert supported(idx, q, "The function :func:`getstacklimit` returns the current recursion limit.") == [False]
    # the signature line shows the function to its own sentence, not to the next function's
    q = "Which function returns the reference count of an object?"
    assert supported(idx, q, "The function :func:`getrecursionlimit` returns the reference count of the object.") == [False]
