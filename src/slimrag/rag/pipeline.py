"""`RAG`: retrieve → plan → generate, returning an answer with the passages it used.

The pipeline is deliberately thin: retrieval is `Index.search`, rendering is `rag.prompt.Prompt`,
generation is any `Generator`. Passages are labelled ``source#ordinal`` (stable across requests,
see `rag.prompt`), and the `Answer.sources` list is in prompt order with each passage's retrieval
score, so a caller can show "answer [1] [2]" with the files behind it.

Timings in `Answer.usage` are end to end: ``ttft_s`` runs from the call (retrieval included) to
the first generated piece, ``total_s`` to the last.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from slimrag.config import GenerationConfig
from slimrag.llm.base import Delta, Generator
from slimrag.rag.prompt import DEFAULT_SYSTEM, Passage, Prompt
from slimrag.types import Answer, Hit, Usage

if TYPE_CHECKING:
    from slimrag.index.core import Index


def make_generator(llm: Generator | str | None) -> Generator:
    """A generator from a spec: None → the embedded SmolLM2 model; ``http(s)://…`` → a remote
    OpenAI-compatible endpoint; a `Generator` → itself."""
    if isinstance(llm, Generator):
        return llm
    if llm is None:
        from slimrag.llm.local import LocalGenerator

        return LocalGenerator()
    if isinstance(llm, str) and llm.startswith(("http://", "https://")):
        from slimrag.llm.remote import RemoteGenerator

        return RemoteGenerator(llm)
    raise ValueError(f"llm must be None, an http(s) URL or a Generator, got {llm!r}")


def passage_of(hit: Hit) -> Passage:
    """The prompt passage of a search hit: keyed by chunk id, labelled by source and position."""
    return Passage(str(hit.chunk_id), f"{hit.source}#{hit.metadata.get('ordinal', 0)}", hit.text)


@dataclass
class _Turn:
    """Internal: the prompt of one turn and what it was built from."""

    prompt: Prompt
    hits: list[Hit]
    t0: float


class RAG:
    """Question answering over an `Index` with a `Generator`.

    Thread-safety: `ask`/`stream` may be called from several threads when the generator is
    thread-safe (both built-in generators are); the index should then be opened per thread.
    """

    def __init__(self, index: Index, llm: Generator | str | None = None, *, system: str = DEFAULT_SYSTEM,
                 generation: GenerationConfig | None = None, mode: str = "vector") -> None:
        self.index = index
        self.llm = make_generator(llm)
        self.system = system
        self.generation = generation or GenerationConfig()
        self.mode = mode

    def retrieve(self, question: str, k: int = 4, source: str | None = None) -> list[Hit]:
        """The passages a question will be answered from, best first."""
        return self.index.search(question, k=k, mode=self.mode, source=source)

    def prompt(self, question: str, hits: list[Hit], history: tuple[tuple[str, str], ...] = ()) -> Prompt:
        """Render the prompt for ``question`` over ``hits`` (in the order given)."""
        passages = tuple(passage_of(h) for h in hits)
        return Prompt(question=question, passages=passages, system=self.system,
                      ranking=tuple(p.key for p in passages), history=history)

    def _turn(self, question: str, k: int, source: str | None, history: tuple[tuple[str, str], ...]) -> _Turn:
        t0 = time.perf_counter()
        hits = self.retrieve(question, k, source)
        return _Turn(self.prompt(question, hits, history), hits, t0)

    def _run(self, turn: _Turn, config: GenerationConfig | None) -> Iterator[Delta]:
        first: float | None = None
        for delta in self.llm.stream(turn.prompt, config or self.generation):
            if first is None and delta.text:
                first = time.perf_counter()
            if delta.usage is not None:
                end = time.perf_counter()
                delta = replace(delta, usage=replace(delta.usage, ttft_s=(first or end) - turn.t0,
                                                     total_s=end - turn.t0))
            yield delta

    def ask(self, question: str, k: int = 4, *, source: str | None = None,
            config: GenerationConfig | None = None) -> Answer:
        """Answer ``question`` from the top-``k`` passages; returns text, sources and usage."""
        *_, answer = self.stream_answer(question, k, source=source, config=config)
        assert isinstance(answer, Answer)
        return answer

    def stream(self, question: str, k: int = 4, *, source: str | None = None,
               config: GenerationConfig | None = None) -> Iterator[str]:
        """Yield the answer's text as it is generated (use `stream_answer` for sources and usage)."""
        for delta in self.stream_answer(question, k, source=source, config=config):
            if isinstance(delta, str):
                yield delta

    def stream_answer(self, question: str, k: int = 4, *, source: str | None = None,
                      config: GenerationConfig | None = None,
                      history: tuple[tuple[str, str], ...] = ()) -> Iterator[str | Answer]:
        """Yield text pieces, then one final `Answer` (text, sources, usage)."""
        turn = self._turn(question, k, source, history)
        parts, usage = [], Usage()
        for delta in self._run(turn, config):
            if delta.text:
                parts.append(delta.text)
                yield delta.text
            usage = delta.usage or usage
        yield Answer("".join(parts).strip(), turn.hits, usage)

    def chat(self) -> Chat:
        """Start a multi-turn conversation."""
        return Chat(self)


@dataclass
class Chat:
    """A multi-turn conversation: earlier questions and answers go into the prompt, and retrieval
    for a follow-up question also sees the previous question (so "and on Windows?" still finds
    install passages)."""

    rag: RAG
    history: list[tuple[str, str]] = field(default_factory=list)
    max_turns: int = 4

    def stream(self, question: str, k: int = 4) -> Iterator[str | Answer]:
        """Like `RAG.stream_answer`, remembering the turn."""
        prev = [q for role, q in self.history if role == "user"][-1:]
        query = " ".join([*prev, question])
        history = tuple(self.history[-2 * self.max_turns:])
        hits = self.rag.retrieve(query, k)
        turn = _Turn(self.rag.prompt(question, hits, history), hits, time.perf_counter())
        parts, usage = [], Usage()
        for delta in self.rag._run(turn, None):
            if delta.text:
                parts.append(delta.text)
                yield delta.text
            usage = delta.usage or usage
        text = "".join(parts).strip()
        self.history += [("user", question), ("assistant", text)]
        yield Answer(text, hits, usage)

    def ask(self, question: str, k: int = 4) -> Answer:
        """Answer a question in the context of the conversation so far."""
        *_, answer = self.stream(question, k)
        assert isinstance(answer, Answer)
        return answer
