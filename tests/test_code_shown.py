"""A bare code name is shown only as code (`slimrag.rag.code.shown`): the HTML folder set's grounded
answer "you can use the `random` module" was backed because "Generate a random UUID." holds the word."""

from __future__ import annotations

from slimrag.rag.code import shown


def test_a_word_in_prose_shows_no_code() -> None:
    assert not shown("random", "uuid.uuid4()\nGenerate a random UUID.")
    assert not shown("maxlen", "If maxlen is not specified, deques may grow to an arbitrary length.")


def test_a_name_as_code_is_shown() -> None:
    assert shown("random", "import random\nrandom.shuffle(x)")
    assert shown("rmtree", "shutil.rmtree(path, ignore_errors=False)")
    assert shown("store_true", "parser.add_argument('--foo', action='store_true')")
    assert shown("maxlen", "If *maxlen* is not specified or is ``None``, deques may grow.")
    assert shown("maxlen", "class collections.deque([iterable[, maxlen]])")
    assert shown("deepcopy", "Return a deep copy of *x*: :func:`deepcopy` recurses.")
    assert shown("distutils", "distutils/apiref.html\nCopy an entire directory tree.")  # a source's path
    assert shown("json.loads", "json.loads(s) parses s.")
