"""`Chat`: a multi-turn conversation over a `RAG`.

Each turn (see `RAG.turn`):

- Retrieval: the question condensed with the previous question's content words
  (`slimrag.rag.condense`), so a follow-up ("and on Windows?", "what is its default?") keeps the
  conversation's subject; a change of topic brings its own words, which dominate its query.
- Prompt: passages given in earlier turns stay in the prompt, in the order first given, and are not
  repeated when retrieved again; the ranking stated after the passages names them, so the model
  is pointed back at them. The system segment and the earlier passages are then a byte-identical
  prefix of the next turn, whose KV the engine (or a remote server's prefix cache) reuses.
- Context for the model, two ways (``replay``, off by default; the speed-up needs a generator
  whose `Generator.keep` caches turns: the embedded engine; a remote one gets the turns as
  messages):

  - ``replay=False``, the default: the earlier *questions* only, after the passages; never the
    earlier answers. A small model shown its previous answer repeats it word for word: measured
    on SmolLM2-135M, 6 of 16 follow-ups copied the previous answer with replay against 1 of 8
    without (docs/bench_generation.md, "Multi-turn chat"). The facts that answer came from are
    still in the prompt as passages, and the questions resolve "it" and "that". The earlier
    passages stay a cached prefix, which already gives most of replay's speed (turns 2 and 3:
    3.4x and 4.1x lower TTFT than no reuse, against 3.6x and 4.9x with replay, same run).
  - ``replay=True`` (issue 9, multi-turn; for a model that answers follow-ups rather than
    copying): every earlier turn is replayed whole, as
    ChatML user and assistant turns (`slimrag.prompt.Exchange`): its passages, its question
    segment exactly as it was rendered, and the answer. Turn n+1's prompt then *starts with
    exactly* turn n's prompt and answer, and after each answer the chat asks the generator to
    keep that prefix (`Generator.keep`: the embedded engine computes the question and answer
    segments in one forward each and stores them in its KV tree, before the next question
    arrives), so turn n+1 prefills only its new passages and question. Why the answer is
    computed again instead of keeping the decode's own KV: the decode computed it one token per
    forward, which differs from a segment forward by float rounding (exact mode promises tokens
    bitwise equal to no reuse), and the answer's text, re-tokenized, need not be the ids the
    model sampled. The cost is one forward of the answer's length, off both turns' first token.

  (`Chat.history` keeps the answers for the caller either way.)
- Sources of a turn: that turn's retrieved passages by relevance.

The last ``max_turns`` (4) turns are kept: their questions, passages and exchanges. Once a turn
falls out of the window the prompt no longer starts with the previous one, so that turn is
prefilled without the conversation's cache (the window trades reuse for a bounded prompt). A
turn below the relevance floor gets the fixed reply, adds no passages and no exchange, and its
question still counts as retrieval context.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from slimrag.llm.base import Generator
from slimrag.prompt import Exchange, Passage, Prompt, Segment
from slimrag.rag.stream import AnswerStream
from slimrag.rag.turn import Turn
from slimrag.types import Answer


class Conversant(Protocol):
    """What a conversation asks of the `RAG` it runs over (`slimrag.rag.pipeline.RAG`), named here
    so that this module does not import the pipeline, which imports it for `RAG.chat`."""

    system: str
    llm: Generator

    def turn(self, question: str, k: int = 4, *, earlier: Sequence[Passage] = (),
             questions: tuple[str, ...] = ()) -> Turn:
        """`RAG.turn`: retrieval and the prompt of one question."""
        ...

    def answer(self, turn: Turn) -> Iterator[str | Answer]:
        """`RAG.answer`: the answer's pieces, then the checked `Answer`."""
        ...


@dataclass
class Chat:
    """A multi-turn conversation (see the module header). history: (role, text) of every turn so
    far, answers included, for the caller; turn_passages: the passages each turn added;
    turn_exchanges: each turn as the next prompts replay it (None for an abstained turn, or
    without replay); replay: whether to replay earlier turns whole (module header)."""

    rag: Conversant
    history: list[tuple[str, str]] = field(default_factory=list)
    max_turns: int = 4
    turn_passages: list[list[Passage]] = field(default_factory=list)
    replay: bool = False
    turn_exchanges: list[Exchange | None] = field(default_factory=list)

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

    @property
    def replaying(self) -> bool:
        """Whether earlier turns are replayed whole (``replay``)."""
        return self.replay

    @property
    def exchanges(self) -> tuple[Exchange, ...]:
        """The kept turns as the next prompt replays them, oldest first."""
        return tuple(e for e in self.turn_exchanges[-self.max_turns:] if e is not None)

    def prefix(self) -> list[Segment]:
        """The segments the next turn's prompt starts with (system, then every kept exchange)."""
        return Prompt("", tuple(self.passages), self.rag.system, exchanges=self.exchanges).prefix_segments()

    def stream(self, question: str, k: int = 4) -> Iterator[str | Answer]:
        """Like `RAG.stream_answer`, in the conversation's context, remembering the turn (and,
        with ``replay``, keeping the next turn's prefix warm in the generator once the answer's
        text is out and before its `Answer` is yielded: a reader that stops at the last text piece
        leaves the prefix computed; the final item then waits for that prefill)."""
        earlier = self.passages
        turn = self.rag.turn(question, k, earlier=earlier, questions=self.questions)
        replayed = self.replaying and turn.prompt is not None
        if replayed and turn.prompt is not None:  # the questions steered retrieval; turns replace them
            turn = replace(turn, prompt=replace(turn.prompt, questions=(), exchanges=self.exchanges))
        answered = AnswerStream(self.rag.answer(turn))
        try:
            yield from answered
            answer = answered.answer
        finally:  # a reader that stops early stops the generation
            answered.close()
        self.history += [("user", question), ("assistant", answer.text)]
        added = list(turn.prompt.passages[len(earlier):]) if turn.prompt else []
        self.turn_passages.append(added)
        self.turn_exchanges.append(Exchange(len(added), turn.prompt.asked_text(), answer.text)
                                   if replayed and turn.prompt is not None else None)
        if replayed:
            self.rag.llm.keep(self.prefix())
        yield answer

    def respond(self, question: str, k: int = 4) -> AnswerStream:
        """`stream` as one object: iterate it for the text, then read its ``answer``."""
        return AnswerStream(self.stream(question, k))

    def ask(self, question: str, k: int = 4) -> Answer:
        """Answer a question in the context of the conversation so far."""
        return self.respond(question, k).answer
