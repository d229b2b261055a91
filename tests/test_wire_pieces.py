"""A chat's worker reads the answer as one `AnswerStream` (`slimrag.serve.chat.wire_pieces`, issue 29
item 5): the queue to the response carries its text pieces, then exactly one `WireAnswer` whose text
is those pieces; closing it early (the client left) closes the generation at once; the answer a
completion is built from is the last item (`final_answer`). A real RAG over the test corpus."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from asgi_server import Endless
from test_serve_load import OnCue, index  # noqa: F401 (index: the module's fixture)

from slimrag.config import GenerationConfig
from slimrag.index.core import Index
from slimrag.rag.guards import Guards
from slimrag.rag.pipeline import RAG
from slimrag.serve.chat import WireAnswer, final_answer, wire_pieces

QUESTION = "What is the office cat called?"


def test_the_text_then_one_wire_answer(index: Index) -> None:  # noqa: F811
    gen = OnCue()
    gen.release.set()
    items = list(wire_pieces(RAG(index, gen, guards=Guards(floor=None)).respond(QUESTION, 2, answer="free")))
    *texts, last = items
    assert texts and all(type(t) is str for t in texts)
    answer = final_answer(last)
    assert isinstance(answer, WireAnswer) and answer.finish_reason == "stop"
    assert "".join(texts) == "Whiskers is the cat." and answer.sources and gen.closed.is_set()


def test_closing_early_stops_the_generation(index: Index) -> None:  # noqa: F811
    gen = Endless()
    pieces: Iterator[str | WireAnswer] = wire_pieces(RAG(index, gen, guards=Guards(floor=None)).respond(
        QUESTION, 2, config=GenerationConfig(max_new_tokens=1000), answer="free"))
    first = next(pieces)
    assert isinstance(first, str) and not gen.closed.is_set()
    pieces.close()  # type: ignore[attr-defined]
    assert gen.closed.is_set() and gen.pieces < 10


def test_pieces_without_their_answer_are_an_error() -> None:
    with pytest.raises(RuntimeError, match="without their answer"):
        final_answer("a text piece")
