"""`Chat`: a multi-turn conversation over a `RAG`.

Each turn (see `RAG.turn`):

- Retrieval: the question alone and the question after the previous one, merged by score, so a
  follow-up ("and on Windows?") finds its passages through the context while a change of topic
  keeps the new topic's best passage (the context query alone would mix both topics).
- Prompt: passages given in earlier turns stay in the prompt, in the order first given, and are not
  repeated when retrieved again; the ranking stated after the passages names them, so the model
  is pointed back at them. The system segment and the earlier passages are then a byte-identical
  prefix of the next turn, whose KV the engine (or a remote server's prefix cache) reuses.
- Context for the model: the earlier *questions*, after the passages; never the earlier answers.
  A small model shown its previous answer repeats it word for word; the facts that answer came
  from are still in the prompt as passages, and the questions resolve "it" and "that". (`Chat.history`
  keeps the answers for the caller.)
- Sources of a turn: that turn's retrieved passages by relevance.

The last ``max_turns`` (4) turns are kept: their questions and passages. A turn below the relevance
floor gets the fixed reply, adds no passages, and its question still counts as context.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from slimrag.prompt import Passage
from slimrag.rag.pipeline import RAG
from slimrag.types import Answer


@dataclass
class Chat:
    """A multi-turn conversation (see the module header). history: (role, text) of every turn so
    far, answers included, for the caller; turn_passages: the passages each turn added."""

    rag: RAG
    history: list[tuple[str, str]] = field(default_factory=list)
    max_turns: int = 4
    turn_passages: list[list[Passage]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")

    @property
    def passages(self) -> list[Passage]:
        """The passages the conversation holds, in prompt order."""
        return [p for turn in self.turn_passages[-self.max_turns:] for p in turn]

    @property
    def questions(self) -> tuple[str, ...]:
        """The questions of the kept turns, oldest first."""
        asked = [text for role, text in self.history if role == "user"]
        return tuple(asked[-self.max_turns:])

    def stream(self, question: str, k: int = 4) -> Iterator[str | Answer]:
        """Like `RAG.stream_answer`, in the conversation's context, remembering the turn."""
        earlier = self.passages
        turn = self.rag.turn(question, k, earlier=earlier, questions=self.questions)
        answer: Answer | None = None
        for piece in self.rag.answer(turn):
            if isinstance(piece, Answer):
                answer = piece
            yield piece
        assert answer is not None
        self.history += [("user", question), ("assistant", answer.text)]
        self.turn_passages.append(list(turn.prompt.passages[len(earlier):]) if turn.prompt else [])

    def ask(self, question: str, k: int = 4) -> Answer:
        """Answer a question in the context of the conversation so far."""
        *_, answer = self.stream(question, k)
        assert isinstance(answer, Answer)
        return answer
