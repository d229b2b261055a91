"""Copy-constrained decoding (`slimrag.llm.engine.copying`): the rule on hand-made ids, then the
embedded engine under it: every word it writes is a source's or a connector, the same request gives
the same tokens cached or not, and the grounded mode passes its evidence to copy from."""

from __future__ import annotations

import re

import pytest

from slimrag.config import GenerationConfig
from slimrag.llm.engine.copying import CONNECTORS, CopyConstraint
from slimrag.prompt import Passage, Prompt

# ids: 1 " 19" 2 "7" 3 "4" 4 "3" 5 " the" 6 " Roman" 7 "." 9 EOS
SOURCES = [[1, 2, 3], [1, 4, 3], [5, 6, 7]]


def _constraint(spans: int | None = None) -> CopyConstraint:
    return CopyConstraint(SOURCES, starts={1, 5, 6, 7}, openers={1, 5}, ends={9}, vocab=12, spans=spans, stops={7})


def test_digits_only_in_a_source_order() -> None:
    c = _constraint()
    assert 2 not in c.allowed() and 4 not in c.allowed()  # a mid-number piece never opens
    c.advance(1)  # " 19" is in two numbers: both continue
    assert {2, 4} <= set(c.allowed())
    c.advance(2)  # " 197": only "4" continues it
    assert 3 in c.allowed() and 4 not in c.allowed()
    c.advance(3)
    assert 3 not in c.allowed() and {1, 5, 6, 7, 9} <= set(c.allowed())  # a new word, a mark or the end


def test_one_span_then_only_a_stop_or_the_end() -> None:
    c = _constraint(spans=1)
    c.advance(5)  # " the" opens the one span
    c.advance(6)  # " Roman" continues it
    assert c.allowed() == [7, 9]  # its next token (".") or the end; no new word
    c.advance(7)
    assert c.allowed() == [9]


def test_a_continued_copy_is_not_reopened_elsewhere() -> None:
    # " 19" "7" then "3": "193" is no source's continuation of "197", and "3" opens no word
    c = _constraint()
    c.advance(1)
    c.advance(2)
    assert 4 not in c.allowed()


def _ids(gen, text: str) -> list[int]:
    return gen.encode_texts([text])[0]


def _accepts(c: CopyConstraint, ids: list[int]) -> bool:
    for t in ids:
        if t not in c.allowed():
            return False
        c.advance(t)
    return True


@pytest.mark.parametrize(("text", "ok"), [
    ("Paris is the capital of France.", True),
    ("Paris is the capital of Germany.", False),  # two sources spliced at their shared words
    ("The tax was 3.99 percent.", False),  # digits of "3.5" and "2.99" spliced into a new number
    ("The earliest recorded incidents occurred during the Roman Empire.", True),
    ("The earliest recorded incidents occurred during the streets.", False),
])
def test_one_span_on_the_real_tokenizer(gen, text: str, ok: bool) -> None:
    sources = ["Paris is the capital of France.", "Berlin is the capital of Germany.", "The tax was 3.5 or 2.99 percent.",
               "The earliest recorded incidents occurred during the Roman Empire.", "They gathered in the streets."]
    assert _accepts(gen.copy_constraint(sources, spans=1), _ids(gen, text)) is ok


def test_bad_copy_from_is_refused() -> None:
    with pytest.raises(ValueError, match="copy_from"):
        GenerationConfig(copy_from=["not a tuple"])  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def gen():
    from slimrag.llm.local import LocalGenerator

    g = LocalGenerator()
    g.load()
    return g


EVIDENCE = ("The earliest recorded incidents of civil disobedience occurred during the Roman Empire.",
            "Unarmed Jews gathered in the streets to prevent the installation of pagan images in the Temple.")
QUESTION = "When did the earliest examples of civil disobedience occur?"


def _words(text: str) -> set[str]:
    return set(re.findall(r"[A-Za-z0-9]+", text.lower()))


def test_engine_writes_only_copied_words(gen) -> None:
    prompt = Prompt(QUESTION, (Passage("k", "a#0", " ".join(EVIDENCE)),), "Answer in one short sentence.")
    config = GenerationConfig(max_new_tokens=32, stop=("\n",), repetition_penalty=1.1, copy_from=(*EVIDENCE, QUESTION))
    first = gen.generate(prompt, config)
    allowed = _words(" ".join((*EVIDENCE, QUESTION, *CONNECTORS)))
    assert first.text.strip() and _words(first.text) <= allowed, first.text
    again = gen.generate(prompt, config)  # the passage's KV now comes from the cache
    assert again.usage.cached_tokens > 0
    assert again.text == first.text


def test_a_generator_that_does_not_copy_ignores_it(gen) -> None:
    prompt = Prompt(QUESTION, (Passage("k2", "a#0", " ".join(EVIDENCE)),), "Answer in one short sentence.")
    free = GenerationConfig(max_new_tokens=16, repetition_penalty=1.1)
    copying = GenerationConfig(max_new_tokens=16, repetition_penalty=1.1, copy_from=("zzz qqq",))
    gen.copies = False
    try:
        assert gen.generate(prompt, copying).text == gen.generate(prompt, free).text
    finally:
        del gen.copies  # back to the class's declaration
