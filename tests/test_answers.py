"""Answers held to their passages (`slimrag.rag.guards`): the relevance floor, citation checks and
the loop stop, against a real index of the test corpus and real `Generator` subclasses that
record what they were asked (no mock library)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from slimrag.config import GenerationConfig
from slimrag.embed.local import LocalEmbedder
from slimrag.errors import RequestError
from slimrag.index.core import Index
from slimrag.llm.backends import make_generator
from slimrag.llm.base import Delta, Generator
from slimrag.llm.engine.decoding import LoopGuard
from slimrag.prompt import Prompt
from slimrag.rag.guards import NO_ANSWER, CitationCheck, Guards
from slimrag.rag.pipeline import RAG
from slimrag.types import Answer, Usage


class Scripted(Generator):
    """Streams ``reply`` in pieces of ``piece`` characters and records every prompt it is given,
    how many pieces it produced and whether its stream was closed early."""

    def __init__(self, reply: str = "Whiskers [guide/cats.md#0].", piece: int = 3, finish: str = "stop") -> None:
        self.reply, self.piece, self.finish = reply, piece, finish
        self.prompts: list[Prompt] = []
        self.pieces = 0
        self.closed_early = False

    def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
        self.prompts.append(prompt)
        done = False
        try:
            for i in range(0, len(self.reply), self.piece):
                self.pieces += 1
                yield Delta(self.reply[i : i + self.piece])
            done = True
            yield Delta("", usage=Usage(prompt_tokens=10, completion_tokens=self.pieces), finish_reason=self.finish)
        finally:
            self.closed_early = not done


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Index]:
    from conftest import DOCS, write_tree

    root = tmp_path_factory.mktemp("answers")
    idx = Index.build(write_tree(root / "docs", DOCS), root / "a.slimrag", embedder=embedder)
    yield idx
    idx.close()


def test_empty_index_gets_the_fixed_reply_without_the_model(tmp_path: Path, embedder: LocalEmbedder) -> None:
    gen = Scripted()
    with Index.create(tmp_path / "empty.slimrag", embedder=embedder) as idx:
        for mode in ("vector", "keyword", "hybrid"):
            rag = RAG(idx, gen, mode=mode)
            answer = rag.ask("How do I bake bread?")
            assert (answer.text, answer.sources, answer.abstained) == (NO_ANSWER, [], True)
            assert "".join(rag.stream("How do I bake bread?")) == NO_ANSWER
    assert gen.prompts == []


@pytest.mark.parametrize("mode", ["vector", "keyword", "hybrid"])
def test_unrelated_question_never_reaches_the_model(index: Index, mode: str) -> None:
    gen = Scripted()
    rag = RAG(index, gen, mode=mode)
    for question in ("What is the capital of France?", "Who won the 1998 World Cup?", "hello"):
        assert rag.ask(question).abstained
    assert gen.prompts == []
    answer = rag.ask("What is the office cat called?")
    assert not answer.abstained and len(gen.prompts) == 1 and answer.text == "Whiskers [guide/cats.md#0]."
    # without a floor the model is asked whatever was retrieved
    assert not RAG(index, gen, mode=mode, guards=Guards(floor=None)).ask("What is the capital of France?").abstained


def test_sources_are_listed_by_relevance(index: Index) -> None:
    rag = RAG(index, Scripted())
    hits = index.search("Where does the office cat sleep?", k=4)
    rag.retrieve = lambda q, k=4, source=None: list(reversed(hits))  # type: ignore[method-assign]
    answer = rag.ask("Where does the office cat sleep?")
    assert [h.chunk_id for h in answer.sources] == [h.chunk_id for h in hits]
    assert [h.score for h in answer.sources] == sorted((h.score for h in hits), reverse=True)


@pytest.mark.parametrize("piece", [1, 4, 100])
def test_unknown_citation_is_flagged_and_marked(index: Index, piece: int) -> None:
    reply = ("Whiskers sleeps on the radiator [guide/cats.md#0] (see [guide/cats.md#0, openssl/HOWTO/keys.txt#5]). "
             "Keys live in [openssl/HOWTO/keys.txt#5]; [a note] and [x#y] are no citations.")
    rag = RAG(index, Scripted(reply, piece))
    pieces = list(rag.stream_answer("Where does Whiskers sleep?", k=2))
    answer = pieces[-1]
    assert isinstance(answer, Answer)
    assert answer.unknown_citations == ("openssl/HOWTO/keys.txt#5",)
    assert answer.text == "".join(p for p in pieces[:-1] if isinstance(p, str)).strip()
    assert answer.text == (
        "Whiskers sleeps on the radiator [guide/cats.md#0] (see [guide/cats.md#0, openssl/HOWTO/keys.txt#5 "
        "(not among the sources)]). Keys live in [openssl/HOWTO/keys.txt#5 (not among the sources)]; "
        "[a note] and [x#y] are no citations.")


def test_unknown_citation_removed_or_kept_by_policy() -> None:
    known = {"guide/cats.md#0"}
    text = "A [guide/cats.md#0; b.md#3] B [b.md#3]. C [unclosed b.md#3"
    removed = CitationCheck(known, "remove")
    assert removed.feed(text) + removed.flush() == "A [guide/cats.md#0] B . C [unclosed b.md#3"
    assert removed.unknown == ["b.md#3"]
    kept = CitationCheck(known, "keep")
    assert kept.feed(text) + kept.flush() == text and kept.unknown == ["b.md#3"]
    with pytest.raises(ValueError, match="citations must be one of"):
        Guards(citations="drop")


def test_a_degenerate_loop_stops_generation(index: Index) -> None:
    gen = Scripted("".join(f"{i}.\n" for i in range(1, 400)), piece=2, finish="length")
    answer = RAG(index, gen).ask("How do I bake bread?")
    assert answer.finish_reason == "loop" and gen.closed_early
    assert gen.pieces < 80 and answer.text.startswith("1.\n2.\n3.")
    assert answer.notice is not None and "repeating" in answer.notice
    assert answer.usage.total_s >= answer.usage.ttft_s > 0


def test_normal_answers_pass_the_loop_guard_unchanged(index: Index) -> None:
    reply = ("1. Mix flour, water, salt and yeast.\n2. Knead the dough for ten minutes.\n"
             "3. Let it rise for an hour.\n4. Bake at 230 degrees for forty minutes.\n5. Let it cool.\n")
    gen = Scripted(reply, piece=1)
    answer = RAG(index, gen).ask("How do I bake bread?")
    assert (answer.text, answer.finish_reason, gen.closed_early) == (reply.strip(), "stop", False)
    assert answer.notice is None and answer.usage.completion_tokens == gen.pieces


def test_loop_guard_rule() -> None:
    def fires(text: str) -> bool:
        guard = LoopGuard()
        return any(guard.feed(c) for c in text)

    assert fires("Whiskers sleeps on the radiator. " * 5)
    assert fires("-" * 80) and not fires("-" * 79)
    assert not fires("The office cat is named Whiskers. Whiskers sleeps on the radiator all winter. " * 1)
    assert not fires("| a | b |\n| - | - |\n| 1 | 2 |\n| 3 | 4 |\n")
    with pytest.raises(ValueError, match="window"):
        LoopGuard(window=10)


def test_a_length_cut_answer_says_so(index: Index) -> None:
    answer = RAG(index, Scripted("Bake at 230 degr", finish="length")).ask("How do I bake bread?")
    assert answer.finish_reason == "length" and answer.text == "Bake at 230 degr"
    assert answer.notice is not None and "cut off at the token limit" in answer.notice


def test_llm_spec_that_is_not_a_url_is_a_request_error() -> None:
    with pytest.raises(RequestError, match="got 'notaurl'"):
        make_generator("notaurl")
    with pytest.raises(RequestError, match="remote model only"):
        make_generator(None, model="llama3")
