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
from slimrag.rag.signatures import signature_names, signature_of
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


#: The text of a built HTML page (Sphinx), as `slimrag.ingest.readers.read_html` gives it: each
#: signature and heading ends in the permalink's pilcrow, the body is not indented.
HTML = """Note that for backward compatibility, the re.U flag still exists.

re.DEBUG¶

Display debug information about compiled expression. No corresponding inline flag.

re.I¶

re.IGNORECASE¶

Perform case-insensitive matching; expressions like [A-Z] will also match lowercase letters.

Example¶

Checking for a pair with a regular expression.

class uuid.UUID(hex=None, bytes=None)¶

Create a UUID from a string of 32 hexadecimal digits.
"""


def at(text: str, sentence: str, source: str = "") -> str:
    return signature_of(text, text.index(sentence), source)


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


def test_a_signature_without_its_pilcrow_ends_the_body_before_it() -> None:
    text = ("breakpoint(*args, **kws)¶\n\nDrops you into the debugger.\n\nclass bytearray(source=b'')\n\n"
            "Return a new array of bytes.")
    assert at(text, "Drops you into") == "breakpoint(*args, **kws)"
    assert at(text, "Return a new array") == ""


def test_a_built_html_page_signs_with_its_pilcrow() -> None:
    assert at(HTML, "Display debug information") == "re.DEBUG"
    assert at(HTML, "No corresponding inline flag.") == "re.DEBUG"
    # two signatures with nothing but blank lines between them document one body
    assert at(HTML, "Perform case-insensitive matching") == "re.I, re.IGNORECASE"
    assert at(HTML, "Checking for a pair") == ""  # a heading ends the body; it names no code
    assert at(HTML, "Create a UUID from a string") == "uuid.UUID(hex=None, bytes=None)"  # "class" is no name
    assert at(HTML, "Note that for backward") == ""
    assert at(HTML, "re.I¶") == ""


NESTED = """.. class:: dict(**kwargs)

   Return a new dictionary initialized from an optional positional argument.

   .. describe:: len(d)

      Return the number of items in the dictionary *d*.

   .. method:: clear()

      Remove all items from the dictionary.

      .. code-block:: python

         d.clear() empties the dictionary d in place.

      .. versionchanged:: 3.9
         Now much faster than before.

   Dictionaries compare equal if and only if they have the same pairs.

.. exception:: ExceptionGroup(msg, excs)
.. exception:: BaseExceptionGroup(msg, excs)

   Both of these exception types wrap the exceptions in the sequence *excs*.

.. function:: HTTPConnection(host, port=None, \\
                  blocksize=8192)

   An HTTPConnection instance represents one transaction with an HTTP server.
"""


def test_bodies_nest() -> None:
    assert at(NESTED, "Return a new dictionary") == "dict(**kwargs)"
    assert at(NESTED, "Return the number of items") == "len(d)"  # a describe directive signs too
    assert at(NESTED, "Remove all items") == "clear()"
    assert at(NESTED, "d.clear() empties") == ""  # a code block's body documents nothing named
    assert at(NESTED, "Now much faster") == "clear()"  # a note's body documents what is around it
    assert at(NESTED, "Dictionaries compare equal") == "dict(**kwargs)"  # the class again, after its method


def test_two_signature_lines_sign_one_body_and_a_backslash_continues_one() -> None:
    assert at(NESTED, "Both of these exception types") == "ExceptionGroup(msg, excs), BaseExceptionGroup(msg, excs)"
    assert at(NESTED, "An HTTPConnection instance") == "HTTPConnection(host, port=None, blocksize=8192)"


MARKDOWN = """# The shutil module

High-level operations on files.

## `shutil.rmtree(path, ignore_errors=False)`

Delete an entire directory tree; *path* must point to a directory.

### Example

```python
# shutil.copytree(src, dst) is no heading here
shutil.rmtree("build")
```

It removes the folder named build.

## `copyfile`

Copy the contents of the file named *src* to a file named *dst*.

## Notes

Both functions follow symbolic links.
"""


MD = "shutil.md"


def test_a_markdown_heading_that_names_code_signs_its_section() -> None:
    assert at(MARKDOWN, "High-level operations", MD) == ""  # a heading that names no code
    assert at(MARKDOWN, "Delete an entire directory tree", MD) == "shutil.rmtree(path, ignore_errors=False)"
    # a deeper heading that names no code is part of the section, and a comment in a fence is no heading
    assert at(MARKDOWN, "It removes the folder", MD) == "shutil.rmtree(path, ignore_errors=False)"
    assert at(MARKDOWN, "Copy the contents", MD) == "copyfile"
    assert at(MARKDOWN, "Both functions follow", MD) == ""  # a heading of the same level ends the section
    assert at(MARKDOWN, "## `copyfile`", MD) == ""


def test_only_markdown_has_headings() -> None:
    # a comment at the start of a line of code, or in a page's example, is no heading
    code = 'import os\n\n# os.getcwd()\nx = 1\n\ndef helper():\n    """Remove the tree."""\n'
    assert at(code, "Remove the tree", "tools/helper.py") == ""
    assert at(MARKDOWN, "Copy the contents", "guide.txt") == ""


def test_setext_headings_and_fence_kinds() -> None:
    text = "## `foo()`\n\nFoo prose.\n\nOther\n=====\n\nUnrelated prose here.\n"
    assert at(text, "Foo prose", MD) == "foo()"
    assert at(text, "Unrelated prose", MD) == ""  # a setext heading of level 1 ends the section
    text = "## `foo()`\n\n~~~\n```\n~~~\n\n## Bar\n\nBar prose.\n"
    assert at(text, "Bar prose", MD) == ""  # a ``` inside a ~~~ fence closes nothing


def test_an_offset_outside_the_text_has_no_signature() -> None:
    assert signature_of(UUID, len(UUID) + 10) == ""
    assert signature_of(UUID, -1) == ""


def test_the_names_of_a_signature_leave_its_arguments() -> None:
    assert signature_names("memoize(maxsize=256, typed=False)") == ["memoize"]
    assert signature_names("re.I, re.IGNORECASE") == ["re.I", "re.IGNORECASE"]
    assert signature_names("ExceptionGroup(msg, excs), BaseExceptionGroup(msg, excs)") == [
        "ExceptionGroup", "BaseExceptionGroup"]
    assert signature_names("@functools.lru_cache(maxsize=128)") == ["functools.lru_cache"]
    assert signature_names("str.removeprefix(prefix, /) → str") == ["str.removeprefix"]


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
