"""A default is not a value an example sets (issue 29, `slimrag.rag.stated.only_set`): the folder
set's free answer "The default precision of the decimal module is 9." was backed by the example
``>>> decimal.getcontext().prec = 9``, which changes the default of 28. The passages here are written
for this test (a client's timeout, a cache's signature), in a real index built by the real embedder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_verdict_question import built, verdict

from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.rag.stated import without_set

DOCS = {
    "library/netclient.rst.txt": (
        "Each client has a default timeout that applies to every request it makes.  The following "
        "example shows the effect of changing the timeout of the default client::\n\n"
        "   >>> netclient.default_client().timeout\n   30\n"
        "   >>> netclient.default_client().timeout = 5\n"
        "   >>> netclient.default_client().timeout\n   5\n"),
    "library/memo.rst.txt": (
        "The memoize decorator takes its default settings from its signature.\n\n"
        ".. decorator:: memoize(maxsize=256, typed=False)\n\n"
        "   Wrap a function with a memoizing callable that saves up to the *maxsize* most recent calls."),
}


@pytest.fixture(scope="module")
def idx(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Index]:
    yield from built(tmp_path_factory, embedder, DOCS, "default")


def test_a_value_an_example_sets_is_no_default(idx: Index) -> None:
    q = "What is the default timeout of the default netclient client?"
    assert verdict(idx, q, "The default timeout of the default netclient client is 5.") == ("not_backed", [True])
    assert verdict(idx, q, "The default timeout of the default netclient client is 30.") == ("supported", [True])


def test_a_keyword_argument_in_a_signature_states_its_default(idx: Index) -> None:
    q = "What is the default maxsize of memoize?"
    assert verdict(idx, q, "The default maxsize of memoize is 256.") == ("supported", [True])


def test_what_statements_set() -> None:
    assert without_set(">>> ctx.prec = 9\n9") == ">>> ctx.prec "
    assert without_set("memoize(maxsize=256, typed=False)") == "memoize(maxsize=256, typed=False)"
    assert without_set(">>> x == 9\n>>> y <= 9 and z != 9 and w >= 9") == ">>> x == 9\n>>> y <= 9 and z != 9 and w >= 9"
    # only a doctest statement sets: a configuration file, prose and a continued signature state values
    assert without_set("d = {'a': 1}\nn += 2") == "d = {'a': 1}\nn += 2"
    prose = "When created with ``maxidle=16`` (the default), a pool keeps at most 16 idle workers."
    assert without_set(prose) == prose
    continued = ".. decorator:: memoize(typed=False, \\\n                   maxsize=256)"
    assert without_set(continued) == continued
    # an example ends at a blank line: what follows is stated again
    assert without_set(">>> pool.size = 9\n9\n\n>>> pool.workers\n4") == ">>> pool.size \n\n>>> pool.workers\n4"
    # what the example prints after it sets a value is the state it set
    assert without_set(">>> ctx.prec\n28\n>>> ctx.prec = 9\n>>> ctx.prec\n9") == ">>> ctx.prec\n28\n>>> ctx.prec "
