"""`AnswerStream`: one answer as one object, iterated for its text and holding the checked `Answer`.

simonw/llm's ``Response`` is iterated for text and asked afterwards for ``text()`` and ``usage()``.
An answer here is the same: a shell iterates the stream and prints each piece as it comes, then
reads `AnswerStream.answer` (the `Answer` with its verdict, evidence, support and sources), with no
``isinstance`` on the pieces. Every shell reads it: the CLI (``ask``, ``chat``, ``demo``), the
server (`slimrag.serve.chat.wire_pieces` puts its text and then its answer on the queue to the
response), MCP, and `RAG.ask` / `Chat.ask` themselves. `RAG.respond` and `Chat.respond` return it;
the ``str | Answer`` pieces it wraps (`RAG.stream_answer`, `RAG.answer`) are the producers' form,
and this class is the one place that tells a piece from the answer.

Thread-safety: one consumer per stream, like the iterator it wraps.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from slimrag.types import Answer


class AnswerStream:
    """The text pieces of one answer, then its checked `Answer` (module header)."""

    def __init__(self, pieces: Iterable[str | Answer]) -> None:
        self._pieces = iter(pieces)
        self._answer: Answer | None = None
        self._parts: list[str] = []

    def __iter__(self) -> Iterator[str]:
        """The answer's text pieces as they are produced; the `Answer` is kept, not yielded."""
        for piece in self._pieces:
            if isinstance(piece, Answer):
                self._answer = piece
            else:
                self._parts.append(piece)
                yield piece

    @property
    def answer(self) -> Answer:
        """The checked `Answer`, reading the rest of the stream first if it is not exhausted."""
        if self._answer is None:
            for _ in self:
                pass
        if self._answer is None:
            raise RuntimeError("the answer stream ended without its Answer; the generator stopped early")
        return self._answer

    def text(self) -> str:
        """All the text streamed (the stream is read to its end first)."""
        self.answer  # noqa: B018 (drains the stream)
        return "".join(self._parts)

    def close(self) -> None:
        """Stop the answer early (closes the generation under it)."""
        close = getattr(self._pieces, "close", None)
        if close is not None:
            close()
