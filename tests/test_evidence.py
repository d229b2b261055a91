"""Evidence and attribution (`slimrag.rag.evidence`, `slimrag.rag.attribution`, `slimrag.rag.sentences`)
against a real index of the test corpus and the real embedder: the sentence that answers is found,
its offsets point into its passage, an answer with a swapped number or an invented name is flagged,
and "used" sources are always among the retrieved ones."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import DOCS

from slimrag.config import GenerationConfig
from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.llm.base import Delta, Generator
from slimrag.prompt import Prompt
from slimrag.rag.attribution import attribute, with_markers
from slimrag.rag.evidence import EvidenceConfig, Memo, Weights, evidence_answer, rank_sentences
from slimrag.rag.guards import NO_ANSWER
from slimrag.rag.pipeline import RAG
from slimrag.rag.question import answer_type
from slimrag.rag.sentences import content_words, key_terms, split_sentences
from slimrag.types import Usage


@pytest.fixture(scope="module")
def idx(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Index]:
    root: Path = tmp_path_factory.mktemp("evidence")
    index = Index.build(list(DOCS.items()), root / "e.slimrag", embedder=embedder, storage="flat")
    yield index
    index.close()


def test_sentences_keep_offsets_and_skip_abbreviations() -> None:
    text = ("# Settings\n\nThe default of shared_buffers is 128MB. It is set in postgresql.conf, e.g. by "
            "Dr. Smith in the U.S. office. Version 1.5 added it!\n- max_connections defaults to 100.\n\nWhy? Yes.")
    got = split_sentences(text)
    assert [s.text for s in got] == [
        "# Settings", "The default of shared_buffers is 128MB.",
        "It is set in postgresql.conf, e.g. by Dr. Smith in the U.S. office.", "Version 1.5 added it!",
        "- max_connections defaults to 100.", "Why?", "Yes."]
    assert all(text[s.start:s.end] == s.text for s in got)


def test_long_runs_are_cut_into_windows() -> None:
    text = " ".join(f"w{i}" for i in range(150))
    got = split_sentences(text)
    assert [len(s.text.split()) for s in got] == [60, 60, 30]
    assert all(text[s.start:s.end] == s.text for s in got)


def test_terms_and_words() -> None:
    assert key_terms("The limit is 1,000 rows, set by Tom Lane in 2005 for two hours.") == {
        "1000", "tom", "lane", "2005", "two"}
    assert content_words("What are the defaults of the settings?") == {"default", "setting"}
    assert answer_type("When did it open?") == "when"
    assert answer_type("How many moons does Mars have?") == "number"
    assert answer_type("Who wrote the first program?") == "name"
    assert answer_type("Explain the design") is None


@pytest.mark.parametrize(("question", "label", "words"), [
    ("Where does Whiskers sleep?", "guide/cats.md#0", "radiator"),
    ("How long should lentil soup simmer?", "notes/recipes.rst#0", "half an hour"),
    ("What is the office cat called?", "guide/cats.md#0", "Whiskers"),
    ("When will it rain?", "notes/weather.txt#0", "Tuesday"),
])
def test_evidence_finds_the_answering_sentence(idx: Index, question: str, label: str, words: str) -> None:
    hits = idx.search(question, k=4)
    ev = rank_sentences(question, hits, idx.embedder)
    assert ev[0].label == label and words in ev[0].text
    by_id = {h.chunk_id: h for h in hits}
    for e in ev:  # offsets point into the passage: what the web page highlights
        assert by_id[e.chunk_id].text[e.start:e.end] == e.text
    assert [e.score for e in ev] == sorted((e.score for e in ev), reverse=True)


def test_weights_are_checked() -> None:
    with pytest.raises(ValueError, match="overlap"):
        Weights(overlap=-1.0)
    with pytest.raises(ValueError, match="top"):
        EvidenceConfig(top=0)


def test_evidence_answer_needs_no_model(idx: Index) -> None:
    ans = evidence_answer(idx, "How long should lentil soup simmer?", 4)
    assert "[notes/recipes.rst#0]" in ans.text.splitlines()[0] and "half an hour" in ans.text.splitlines()[0]
    assert ans.evidence and set(ans.used) <= {h.label for h in ans.sources}
    assert ans.usage.completion_tokens == 0
    off = evidence_answer(idx, "What is the capital of France?", 4)
    assert off.abstained and off.text == NO_ANSWER and not off.evidence


QUESTION = "How long should lentil soup simmer?"


@pytest.mark.parametrize(("answer", "supported", "unknown"), [
    ("Simmer the lentils with onion and cumin for half an hour.", True, ()),
    ("The lentils simmer for half an hour with onion and cumin [notes/recipes.rst#0].", True, ()),
    ("Simmer the lentils for two hours.", False, ("two",)),  # a number no passage holds
    ("Bake the bread at 230 degrees for half an hour.", False, ()),  # two sentences' numbers, one claim
    ("Simmer the lentils with onion and cumin for 45 minutes.", False, ("45",)),
    ("Chef Ramsay simmers the lentils with cumin for half an hour.", False, ("ramsay",)),
])
def test_attribution_flags_swapped_facts(idx: Index, answer: str, supported: bool, unknown: tuple[str, ...]) -> None:
    hits = idx.search(QUESTION, k=4)
    check = attribute(QUESTION, answer, hits, idx.embedder)
    assert len(check.support) == 1
    s = check.support[0]
    assert s.supported is supported and s.unknown_terms == unknown
    assert set(check.used) <= {h.label for h in hits}
    assert (check.used == ("notes/recipes.rst#0",)) is supported


def test_chatter_claims_nothing_and_markers_go_where_none_are(idx: Index) -> None:
    hits = idx.search(QUESTION, k=4)
    text = "Sure! Simmer the lentils with onion and cumin for half an hour. Chef Ramsay says so."
    check = attribute(QUESTION, text, hits, idx.embedder)
    assert [s.supported for s in check.support] == [True, False]
    assert with_markers(text, check) == ("Sure! Simmer the lentils with onion and cumin for half an hour "
                                         "[notes/recipes.rst#0]. Chef Ramsay says so [not in the passages].")
    cited = "Simmer the lentils for half an hour with cumin [notes/recipes.rst#0]."
    assert with_markers(cited, attribute(QUESTION, cited, hits, idx.embedder)) == cited


class Fixed(Generator):
    """Streams a fixed reply: a real `Generator` subclass, no model."""

    thread_safe = True

    def __init__(self, reply: str) -> None:
        self.reply = reply

    def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
        yield Delta(self.reply)
        yield Delta("", finish_reason="stop", usage=Usage(prompt_tokens=10, completion_tokens=5))


def test_answers_carry_evidence_and_attribution(idx: Index) -> None:
    rag = RAG(idx, Fixed("Simmer them for half an hour. Bake bread at 230 degrees."))
    pieces = list(rag.stream_answer(QUESTION, 4))
    ans = pieces[-1]
    assert ans.text == "".join(p for p in pieces[:-1] if isinstance(p, str)).strip()  # text is what streamed
    assert ans.evidence[0].label == "notes/recipes.rst#0" and "half an hour" in ans.evidence[0].text
    assert [s.supported for s in ans.support] == [True, True]
    assert ans.used == ("notes/recipes.rst#0",)
    assert {h.label for h in ans.also_retrieved} == {h.label for h in ans.sources} - {"notes/recipes.rst#0"}
    assert ans.marked.count("[notes/recipes.rst#0]") == 2
    plain = RAG(idx, Fixed("Half an hour."), attribution=False).ask(QUESTION)
    assert plain.evidence and not plain.support and not plain.used and plain.marked == ""
    assert RAG(idx, Fixed("x")).evidence_answer(QUESTION).evidence[0].label == "notes/recipes.rst#0"


class Counting:
    """The real embedder, counting the texts it is asked to embed."""

    def __init__(self, embedder: LocalEmbedder) -> None:
        self.embedder, self.texts = embedder, 0

    def embed(self, texts: list[str]) -> object:
        self.texts += len(texts)
        return self.embedder.embed(texts)


def test_memo_embeds_each_text_once(idx: Index) -> None:
    counting = Counting(idx.embedder)
    memo = Memo(counting)
    hits = idx.search(QUESTION, k=4)
    first = rank_sentences(QUESTION, hits, memo)
    n = counting.texts
    assert rank_sentences(QUESTION, hits, memo) == first and counting.texts == n  # all remembered
    attribute(QUESTION, "Simmer them for half an hour.", hits, memo)
    assert counting.texts == n + 1  # only the answer's one sentence is new
    direct = rank_sentences(QUESTION, hits, idx.embedder)  # same vectors (to float rounding), same ranking
    assert [(e.label, e.text) for e in first] == [(e.label, e.text) for e in direct]
