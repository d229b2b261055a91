"""`RAG`: retrieve → plan → generate, returning an answer with the passages it used.

The pipeline is deliberately thin: retrieval is `Index.search`, ordering is `rag.plan`, rendering
is `rag.prompt.Prompt`, generation is any `Generator`. Passages are labelled ``source#ordinal``
(stable across requests, see `rag.prompt`), and the `Answer.sources` list is in prompt order with
each passage's retrieval score, so a caller can show "answer [1] [2]" with the files behind it.

Planning (DESIGN.md, "Warm generation"): the planner walks the generator's prefix cache
(``Generator.planning_cache``: the embedded engine's knowledge tree) and puts the passages whose
KV is cached after the system segment first, the rest by relevance, and the prompt states the
relevance ranking after the passages. A remote generator shows no cache, so the pipeline keeps a
:class:`~slimrag.rag.shadow.ShadowCache` of what it sent (``shadow=True``, the default) and plans
against that, which is what makes vLLM's or SGLang's prefix cache hit on repeated passages. With
neither, passages stay in relevance order.

Timings in `Answer.usage` are end to end: ``ttft_s`` runs from the call (retrieval and planning
included) to the first generated piece, ``total_s`` to the last.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from slimrag.config import GenerationConfig
from slimrag.llm.backends import make_generator
from slimrag.llm.base import Delta, Generator
from slimrag.prompt import DEFAULT_SYSTEM, Passage, Prompt
from slimrag.rag.plan import PlanningCache, plan_prompt
from slimrag.rag.shadow import ShadowCache
from slimrag.types import Answer, Hit, Usage

if TYPE_CHECKING:
    from slimrag.index.core import Index


def default_generation(llm: Generator, max_new_tokens: int = 256) -> GenerationConfig:
    """The sampling settings a `RAG` uses when given none: greedy, with the generator's
    ``default_repetition_penalty`` (1.1 for the embedded model, which loops without one)."""
    return GenerationConfig(max_new_tokens=max_new_tokens, repetition_penalty=llm.default_repetition_penalty)


def passage_of(hit: Hit) -> Passage:
    """The prompt passage of a search hit: keyed by chunk id, labelled by source and position."""
    return Passage(str(hit.chunk_id), f"{hit.source}#{hit.metadata.get('ordinal', 0)}", hit.text)


@dataclass
class _Turn:
    """Internal: the prompt of one turn, the hits behind its passages, and when it started."""

    prompt: Prompt
    hits: list[Hit]
    t0: float


class RAG:
    """Question answering over an `Index` with a `Generator`.

    llm: a generator or its spec (`slimrag.llm.backends`: None for the embedded model,
    ``http(s)://host:port/v1`` for an OpenAI-compatible server). shadow: plan for a remote generator's prefix cache by mirroring what was sent (see the
    module header); applies only to a generator whose ``shadows_prefix_cache`` is True.

    Thread-safety: `ask`/`stream` may be called from several threads when the generator's
    ``thread_safe`` is True (both built-in generators); the index should then be opened per thread.
    """

    def __init__(self, index: Index, llm: Generator | str | None = None, *, system: str = DEFAULT_SYSTEM,
                 generation: GenerationConfig | None = None, mode: str = "vector", shadow: bool = True) -> None:
        self.index = index
        self.llm = make_generator(llm)
        self.system = system
        self.generation = generation or default_generation(self.llm)
        self.mode = mode
        self.shadow = ShadowCache() if shadow and self.llm.shadows_prefix_cache else None

    def retrieve(self, question: str, k: int = 4, source: str | None = None) -> list[Hit]:
        """The passages a question will be answered from, best first."""
        return self.index.search(question, k=k, mode=self.mode, source=source)

    def planning_cache(self) -> PlanningCache | None:
        """The cache the planner walks: the generator's own, else the shadow, else None."""
        return self.llm.planning_cache() or self.shadow

    def prompt(self, question: str, hits: Sequence[Hit], history: tuple[tuple[str, str], ...] = (),
               earlier: Sequence[Passage] = ()) -> Prompt:
        """The planned prompt for ``question`` over ``hits`` (relevance order) after ``earlier``
        conversation passages."""
        prompt, _ = plan_prompt(question, [passage_of(h) for h in hits], self.planning_cache(),
                                system=self.system, history=history, earlier=earlier)
        return prompt

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
        if self.shadow is not None:
            self.shadow.record(turn.prompt)

    def _answer(self, turn: _Turn, config: GenerationConfig | None) -> Iterator[str | Answer]:
        parts, usage, reason = [], Usage(), "stop"
        for delta in self._run(turn, config):
            if delta.text:
                parts.append(delta.text)
                yield delta.text
            usage = delta.usage or usage
            reason = delta.finish_reason or reason
        yield Answer("".join(parts).strip(), turn.hits, usage, reason)

    def ask(self, question: str, k: int = 4, *, source: str | None = None,
            config: GenerationConfig | None = None) -> Answer:
        """Answer ``question`` from the top-``k`` passages; returns text, sources, usage and the
        finish reason."""
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
        """Yield text pieces, then one final `Answer` (text, sources in prompt order, usage, and the
        finish reason of the generator's last piece)."""
        t0 = time.perf_counter()
        hits = self.retrieve(question, k, source)
        prompt = self.prompt(question, hits, history)
        yield from self._answer(_Turn(prompt, in_prompt_order(prompt, hits), t0), config)

    def chat(self) -> Chat:
        """Start a multi-turn conversation."""
        return Chat(self)


def in_prompt_order(prompt: Prompt, hits: Sequence[Hit]) -> list[Hit]:
    """``hits`` whose passages are in ``prompt``, in prompt order."""
    by_key = {str(h.chunk_id): h for h in hits}
    return [by_key[p.key] for p in prompt.passages if p.key in by_key]


@dataclass
class Chat:
    """A multi-turn conversation.

    Retrieval for a follow-up question also sees the previous question (so "and on Windows?"
    still finds install passages). Passages given in earlier turns stay in the prompt, in the
    order first given, and are not repeated when retrieved again; the ranking stated after the
    passages names them, so the model is pointed back at them. The prompt's system segment and
    earlier passages are then a byte-identical prefix of the next turn, whose KV the engine
    reuses. The last ``max_turns`` turns (their questions, answers and passages) are kept.
    """

    rag: RAG
    history: list[tuple[str, str]] = field(default_factory=list)
    max_turns: int = 4
    turn_passages: list[list[Passage]] = field(default_factory=list)

    @property
    def passages(self) -> list[Passage]:
        """The passages the conversation holds, in prompt order."""
        return [p for turn in self.turn_passages[-self.max_turns:] for p in turn]

    def stream(self, question: str, k: int = 4) -> Iterator[str | Answer]:
        """Like `RAG.stream_answer`, remembering the turn."""
        t0 = time.perf_counter()
        prev = [q for role, q in self.history if role == "user"][-1:]
        hits = self.rag.retrieve(" ".join([*prev, question]), k)
        earlier = self.passages
        prompt = self.rag.prompt(question, hits, tuple(self.history[-2 * self.max_turns:]), earlier)
        answer: Answer | None = None
        for piece in self.rag._answer(_Turn(prompt, in_prompt_order(prompt, hits), t0), None):
            if isinstance(piece, Answer):
                answer = piece
            yield piece
        assert answer is not None
        self.history += [("user", question), ("assistant", answer.text)]
        self.turn_passages.append(list(prompt.passages[len(earlier):]))

    def ask(self, question: str, k: int = 4) -> Answer:
        """Answer a question in the context of the conversation so far."""
        *_, answer = self.stream(question, k)
        assert isinstance(answer, Answer)
        return answer
