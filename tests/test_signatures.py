"""What a sentence of API documentation documents (`slimrag.rag.signatures`), and evidence that
carries it (issue 29): "Generate a random UUID." quoted alone does not name ``uuid4()``. Passages are
reStructuredText as the Python docs write it; the index is real, built by the real embedder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_verdict_question import built

from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.rag.evidence import EvidenceConfig, evidence_text, rank_sentences
from slimrag.rag.grounded import lead_text
from slimrag.rag.signatures import signature_of
from slimrag.rag.wire import evidence_json

UUID = """The module defines these functions.


.. function:: uuid3(namespace, name)

   Generate a UUID based on the MD5 hash of a namespace identifier (which is a
   UUID) and a name (which is a string).

.. index:: single: uuid3


.. function:: uuid4()

   Generate a random UUID.

.. index:: single: uuid4

The :mod:`uuid` module defines the following namespace identifiers for use with
:func:`uuid3` or :func:`uuid5`.
"""

FLAGS = """.. data:: I
          IGNORECASE

   Perform case-insensitive matching; expressions like ``[A-Z]`` will also
   match lowercase letters.  Corresponds to the inline flag ``(?i)``.

   .. versionchanged:: 3.7
      Flags may now be combined.

An example usage of the module:

   >>> import re
"""


def at(text: str, sentence: str) -> str:
    return signature_of(text, text.index(sentence))


def test_a_sentence_under_a_signature_documents_it() -> None:
    assert at(UUID, "Generate a random UUID.") == "uuid4()"
    assert at(UUID, "Generate a UUID based on the MD5") == "uuid3(namespace, name)"
    assert at(UUID, "UUID) and a name") == "uuid3(namespace, name)"  # a later line of the same body


def test_a_line_as_little_indented_ends_the_body() -> None:
    assert at(UUID, "The module defines") == ""
    assert at(UUID, "The :mod:`uuid` module defines the following") == ""  # after an index directive
    assert at(FLAGS, "An example usage") == ""
    assert at(FLAGS, ">>> import re") == ""


def test_a_continued_signature_names_each_and_a_note_names_nothing() -> None:
    assert at(FLAGS, "Perform case-insensitive matching") == "I, IGNORECASE"
    assert at(FLAGS, "Corresponds to the inline flag") == "I, IGNORECASE"
    # a note inside the body is no signature: its sentences still document the flag
    assert at(FLAGS, "Flags may now be combined.") == "I, IGNORECASE"


def test_a_signature_documents_nothing_itself() -> None:
    assert at(UUID, ".. function:: uuid4()") == ""


@pytest.fixture(scope="module")
def idx(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Index]:
    yield from built(tmp_path_factory, embedder, {"library/uuid.rst.txt": UUID, "library/re.rst.txt": FLAGS},
                     "signatures")


def test_evidence_shows_what_it_documents(idx: Index) -> None:
    q = "How do I generate a random UUID?"
    hits = idx.search(q, k=2)
    ev = rank_sentences(q, hits, idx.embedder, EvidenceConfig(top=3))  # type: ignore[arg-type]
    best = next(e for e in ev if e.text == "Generate a random UUID.")
    assert best.signature == "uuid4()"
    assert best.quoted == "`uuid4()`: Generate a random UUID."
    assert "`uuid4()`: Generate a random UUID. [library/uuid.rst.txt#0]" in evidence_text(ev).splitlines()
    assert "`uuid4()`: Generate a random UUID. [library/uuid.rst.txt#0]\n" in lead_text(ev)
    assert evidence_json(best)["signature"] == "uuid4()"
