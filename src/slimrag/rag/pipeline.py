"""`RAG`: retrieve → guard → plan → generate, returning an answer with the passages it used.

The pipeline is deliberately thin: retrieval is `Index.search`, ordering is `rag.plan`, rendering
is `slimrag.prompt.Prompt`, generation is any `Generator`, and the checks that hold an answer to
its passages are `rag.guards` (relevance floor, citation check, loop stop: configured by
`Guards`). Passages are labelled ``source#ordinal`` (stable across requests, see
`slimrag.prompt`), and `Answer.sources` lists them by relevance (score), best first, so a caller
can show "answer [1] [2]" with the files behind it.

Answer modes (``answer``, `slimrag.config.ANSWER_MODES`; default: the generator's
``default_answer_mode``): ``"free"`` streams the model's answer over the planned passages;
``"grounded"`` (`slimrag.rag.grounded`) streams the best evidence sentences with their labels at
once, then the model's one sentence over those sentences alone. Either way the answer is checked
before the `Answer` is yielded (`slimrag.rag.attribution`, then `slimrag.rag.verdict`):
``Answer.verdict`` says whether it is presented as an answer, and ``Answer.shown`` is what a shell
presents once it is complete (cited and marked, or the not-backed notice and the passages quoted).
`RAG.respond` returns the stream as one object (`slimrag.rag.stream.AnswerStream`): the CLI, the
server, MCP and `Chat` read that; `RAG.stream_answer` is the ``str | Answer`` pieces it wraps.

Planning (DESIGN.md, "Warm generation"): the planner walks the generator's prefix cache
(``Generator.planning_cache``: the embedded engine's knowledge tree) and puts the passages whose
KV is cached after the system segment first, the rest by relevance, and the prompt states the
relevance ranking after the passages. A remote generator shows no cache, so the pipeline keeps a
:class:`~slimrag.rag.shadow.ShadowCache` of what it sent (``shadow=True``, the default) and plans
against that, which is what makes vLLM's or SGLang's prefix cache hit on repeated passages. With
neither, passages stay in relevance order.

Follow-ups (a `stream_answer` with ``history``, and every turn of `slimrag.rag.chat.Chat`) are
retrieved with a condensed query that carries the conversation's subject (`slimrag.rag.condense`,
``condense``: by default the follow-up plus the previous question's content words), so "what is
its default value?" after a question about autovacuum searches for autovacuum's default. On
`bench.followups` (200 two-turn conversations whose second turn names its subject only by a
pronoun) the gold passage is in the top 5 for 0.88 of follow-ups alone, 0.975 for the earlier
merge of the follow-up's hits with those of "previous question + follow-up" (:func:`merge_hits`),
and 0.98 condensed (top 1: 0.71, 0.935, 0.95). The evidence of a follow-up is ranked against the
follow-up as asked, among the passages its condensed query found.

Progress: ``RAG.progress``, when set, is called with each stage before it starts (``"retrieving"``,
then ``"prefilling"``: the model reads the prompt until its first token), so a caller can show a
status line while nothing streams yet.

Timings in `Answer.usage` are end to end: ``ttft_s`` runs from the call (retrieval and planning
included) to the first generated piece, ``total_s`` to the last. An answer stopped by the loop
guard has no token counts (the generator's final piece never came), only the timings.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from slimrag.config import ANSWER_MODES, GenerationConfig, SearchConfig
from slimrag.llm.backends import make_generator
from slimrag.llm.base import Delta, Generator
from slimrag.llm.engine.decoding import LoopGuard
from slimrag.prompt import DEFAULT_SYSTEM, Passage, Prompt
from slimrag.rag import grounded
from slimrag.rag.attribution import attribute, with_markers
from slimrag.rag.condense import CONDENSERS
from slimrag.rag.evidence import EvidenceConfig, Memo, evidence_answer, rank_sentences
from slimrag.rag.grounded import (
    CONTEXT,
    IN_SHORT,
    LEAD,
    MAX_TOKENS,
    context_prompt,
    copy_texts,
    grounded_tail,
)
from slimrag.rag.guards import NO_ANSWER, CitationCheck, Guards, answerable
from slimrag.rag.plan import PlanningCache, plan_prompt
from slimrag.rag.shadow import ShadowCache
from slimrag.rag.stream import AnswerStream
from slimrag.rag.turn import Turn
from slimrag.rag.verdict import judge, off_question
from slimrag.rag.vocabulary import Vocabulary
from slimrag.types import Answer, Hit, Hits, Usage

if TYPE_CHECKING:
    from slimrag.index.core import Index
    from slimrag.rag.chat import Chat

#: Called with the name of each stage before it starts (see the module header).
Progress = Callable[[str], None]


def default_generation(llm: Generator, max_new_tokens: int = 256) -> GenerationConfig:
    """The sampling settings a `RAG` uses when given none: greedy, with the generator's
    ``default_repetition_penalty`` (1.1 for the embedded model, which loops without one)."""
    return GenerationConfig(max_new_tokens=max_new_tokens, repetition_penalty=llm.default_repetition_penalty)


def passage_of(hit: Hit) -> Passage:
    """The prompt passage of a search hit: keyed by chunk id, labelled by source and position."""
    return Passage(str(hit.chunk_id), hit.label, hit.text)


def merge_hits(*lists: Sequence[Hit], k: int) -> list[Hit]:
    """The ``k`` best of several hit lists for one question: each chunk once, with its best score,
    by score (ties: lower chunk id). Scores must be comparable: cosines (vector) and RRF scores
    (hybrid) are; BM25 scores (keyword) favour the longer query, so there a follow-up's context
    query tends to win."""
    best: dict[int, Hit] = {}
    for hits in lists:
        for h in hits:
            if h.chunk_id not in best or h.score > best[h.chunk_id].score:
                best[h.chunk_id] = h
    return sorted(best.values(), key=lambda h: (-h.score, h.chunk_id))[:k]


def by_relevance(hits: Sequence[Hit]) -> list[Hit]:
    """``hits`` best first (the order `Answer.sources` uses)."""
    return sorted(hits, key=lambda h: (-h.score, h.chunk_id))


class RAG:
    """Question answering over an `Index` with a `Generator`.

    llm: a generator or its spec (`slimrag.llm.backends`: None for the embedded model,
    ``http(s)://host:port/v1`` for an OpenAI-compatible server). shadow: plan for a remote
    generator's prefix cache by mirroring what was sent (see the module header); applies only to
    a generator whose ``shadows_prefix_cache`` is True; a `ShadowCache` given here is shared (one
    mirror for every RAG over the same remote server, as the server's workers are). mode: the search mode (default: `SearchConfig`'s,
    the one `slimrag search` uses too). guards: the relevance floor, citation
    check and loop stop (`slimrag.rag.guards`); ``Guards(floor=None)`` answers whatever is
    retrieved. progress: see the module header. evidence: how evidence sentences are chosen
    (`slimrag.rag.evidence`); attribution: check each answer sentence against the passages after
    generation (`slimrag.rag.attribution`; False leaves ``support``, ``used`` and ``marked`` empty).
    condense: how a follow-up's retrieval query is made (`slimrag.rag.condense.CONDENSERS`:
    ``"words"``, the default, ``"rewrite"`` by the generator, or ``"off"``). answer: how answers
    are made, ``"free"`` or ``"grounded"`` (`slimrag.config.ANSWER_MODES`, `slimrag.rag.grounded`);
    None takes the generator's ``default_answer_mode`` (the embedded model: grounded).

    Thread-safety: `ask`/`stream` may be called from several threads when the generator's
    ``thread_safe`` is True (both built-in generators); the index should then be opened per thread.
    """

    def __init__(self, index: Index, llm: Generator | str | None = None, *, system: str = DEFAULT_SYSTEM,
                 generation: GenerationConfig | None = None, mode: str | None = None,
                 shadow: bool | ShadowCache = True,
                 guards: Guards | None = None, progress: Progress | None = None,
                 evidence: EvidenceConfig | None = None, attribution: bool = True,
                 condense: str = "words", answer: str | None = None) -> None:
        self.index = index
        self.llm = make_generator(llm)
        self.system = system
        self.generation = generation or default_generation(self.llm)
        self.mode = mode or SearchConfig().mode  # one default for the CLI, the library and the server
        self.shadow = ((shadow if isinstance(shadow, ShadowCache) else ShadowCache())
                       if shadow and self.llm.shadows_prefix_cache else None)
        self.guards = guards or Guards()
        self.progress = progress
        self.evidence = evidence or EvidenceConfig()
        self.attribution = attribution
        if condense not in CONDENSERS:
            raise ValueError(f"condense must be one of {sorted(CONDENSERS)}, got {condense!r}")
        self.condense = condense
        #: the index's common words, which the check does not hold an answer to (`slimrag.rag.vocabulary`)
        self.vocabulary = Vocabulary(index)
        self.answer_mode = answer or self.llm.default_answer_mode
        if self.answer_mode not in ANSWER_MODES:
            raise ValueError(f"answer must be one of {ANSWER_MODES}, got {self.answer_mode!r}")

    def _stage(self, name: str) -> None:
        if self.progress is not None:
            self.progress(name)

    def retrieve(self, question: str, k: int = 4, source: str | None = None) -> Hits:
        """The passages a question will be answered from, best first, with the search's best
        vector similarity (`Hits.similarity`, which the relevance floor reads in vector and hybrid
        mode)."""
        return self.index.search(question, k=k, mode=self.mode, source=source)

    def retrieve_in_context(self, question: str, k: int = 4, source: str | None = None,
                            context: Sequence[str] = ()) -> tuple[Hits, list[str]]:
        """The passages for a follow-up: retrieved for the query that ``condense`` makes of
        ``question`` and the ``context`` (earlier questions, oldest first); ``question`` alone
        without context. Returns the hits and the queries that were run (the last is the one
        retrieved with; in keyword mode the relevance floor probes each of them, in vector and
        hybrid mode it reads the retrieved query's `Hits.similarity`: `slimrag.rag.guards`)."""
        query = CONDENSERS[self.condense](question, list(context), self.llm) if context else question
        queries = [question] + ([query] if query != question else [])
        return self.retrieve(query, k, source), queries

    def planning_cache(self) -> PlanningCache | None:
        """The cache the planner walks: the generator's own, else the shadow, else None."""
        return self.llm.planning_cache() or self.shadow

    def plans(self, answer: str | None = None) -> bool:
        """Whether a turn answered in mode ``answer`` (None: this RAG's) is planned against the
        generator's cache. A grounded answer's model reads the evidence sentences, not the planned
        passages, so its turn keeps relevance order and does not wait for the model's load."""
        return (answer or self.answer_mode) != "grounded"

    def prompt(self, question: str, hits: Sequence[Hit], history: tuple[tuple[str, str], ...] = (),
               earlier: Sequence[Passage] = (), questions: tuple[str, ...] = (), answer: str | None = None) -> Prompt:
        """The planned prompt for ``question`` over ``hits`` (relevance order) after ``earlier``
        conversation passages; ``history``/``questions``: the chat context (`Prompt`); ``answer``:
        the mode it will be answered in (`plans`)."""
        prompt, _ = plan_prompt(question, [passage_of(h) for h in hits], self.planning_cache() if self.plans(answer) else None,
                                system=self.system, history=history, earlier=earlier, questions=questions)
        return prompt

    def turn(self, question: str, k: int = 4, *, source: str | None = None,
             history: tuple[tuple[str, str], ...] = (), earlier: Sequence[Passage] = (),
             questions: tuple[str, ...] = (), answer: str | None = None) -> Turn:
        """Retrieve for ``question`` (in the context of the last earlier question, from
        ``questions`` or else ``history``), apply the relevance floor, and plan the prompt
        (``answer``: see `prompt`)."""
        t0 = time.perf_counter()
        self._stage("retrieving")
        context = list(questions) or [c for role, c in history if role == "user"]
        hits, queries = self.retrieve_in_context(question, k, source, context)
        if not answerable(self.index, self.mode, queries, hits, self.guards.floor, source):
            return Turn(None, [], t0, question)
        return Turn(self.prompt(question, hits, history, earlier, questions, answer), by_relevance(hits), t0, question)

    def _run(self, prompt: Prompt, t0: float, config: GenerationConfig | None) -> Iterator[Delta]:
        first: float | None = None
        sent = False
        stream = self.llm.stream(prompt, config or self.generation)
        try:
            for delta in stream:
                sent = True
                if first is None and delta.text:
                    first = time.perf_counter()
                if delta.usage is not None:
                    end = time.perf_counter()
                    delta = replace(delta, usage=replace(delta.usage, ttft_s=(first or end) - t0,
                                                         total_s=end - t0))
                yield delta
        finally:
            close = getattr(stream, "close", None)  # a generator function's iterator has one
            if close is not None:
                close()  # stops the engine or drops the HTTP stream when we stop early
            if self.shadow is not None and sent:
                self.shadow.record(prompt)

    def answer(self, turn: Turn, config: GenerationConfig | None = None,
               mode: str | None = None) -> Iterator[str | Answer]:
        """Generate the answer of a planned `Turn` in this RAG's answer mode: text pieces, then the
        checked `Answer` (module header). A turn below the relevance floor yields the fixed reply
        without calling the model."""
        if turn.prompt is None:
            elapsed = time.perf_counter() - turn.t0
            yield NO_ANSWER
            yield Answer(NO_ANSWER, [], Usage(ttft_s=elapsed, total_s=elapsed), "stop", abstained=True)
            return
        chosen = mode or self.answer_mode
        if chosen not in ANSWERERS:
            raise ValueError(f"answer must be one of {ANSWER_MODES}, got {chosen!r}")
        yield from ANSWERERS[chosen](self, turn, config)

    def _free(self, turn: Turn, config: GenerationConfig | None = None) -> Iterator[str | Answer]:
        """The free-form answer: the model over the planned passages, streamed, then checked."""
        assert turn.prompt is not None
        self._stage("prefilling")
        check = CitationCheck({p.label for p in turn.prompt.passages}, self.guards.citations)
        loop = LoopGuard() if self.guards.stop_loops else None
        parts: list[str] = []
        usage, reason, first = Usage(), "stop", None
        stream = self._run(turn.prompt, turn.t0, config)
        try:
            for delta in stream:
                if delta.text:
                    first = first or time.perf_counter()
                    shown = check.feed(delta.text)
                    if shown:
                        parts.append(shown)
                        yield shown
                    if loop is not None and loop.feed(delta.text):
                        end = time.perf_counter()
                        usage, reason = Usage(ttft_s=first - turn.t0, total_s=end - turn.t0), "loop"
                        break
                usage = delta.usage or usage
                reason = delta.finish_reason or reason
        finally:
            stream.close()
        rest = check.flush()
        if rest:
            parts.append(rest)
            yield rest
        yield self.checked(Answer("".join(parts).strip(), turn.hits, usage, reason, tuple(check.unknown)),
                           turn.question)

    def _grounded(self, turn: Turn, config: GenerationConfig | None = None) -> Iterator[str | Answer]:
        """The grounded answer (`slimrag.rag.grounded`): the best evidence sentences streamed at
        once with their labels, then the model's one sentence over them, then its citation or
        its mark; checked like a free answer, the lead being the passages' own words."""
        embedder = Memo(self.index.embedder)
        evidence = rank_sentences(turn.question, turn.hits, embedder,
                                  replace(self.evidence, top=max(self.evidence.top, CONTEXT, LEAD)))
        leading = grounded.lead_of(evidence, turn.hits)
        lead = grounded.lead_text(leading)
        first = time.perf_counter()
        yield lead
        self._stage("prefilling")
        base = config or self.generation
        short = replace(base, max_new_tokens=min(base.max_new_tokens, MAX_TOKENS), stop=(*base.stop, "\n"),
                        copy_from=copy_texts(turn.question, evidence))
        prompt = context_prompt(turn.question, evidence)
        check = CitationCheck({h.label for h in turn.hits}, self.guards.citations)
        parts: list[str] = []
        usage, reason = Usage(), "stop"
        stream = self._run(prompt, turn.t0, short)
        try:
            for delta in stream:
                shown = check.feed(delta.text) if delta.text else ""
                if shown:
                    if not parts:
                        yield IN_SHORT
                    parts.append(shown)
                    yield shown
                usage = delta.usage or usage
                reason = delta.finish_reason or reason
        finally:
            stream.close()
        rest = check.flush()
        if rest:
            parts.append(rest)
            yield rest
        said = "".join(parts).strip()
        ranked = tuple(evidence[: self.evidence.top])
        quoted = [e.label for e in leading]
        if not self.attribution:
            text = lead + (IN_SHORT + said if said else "")
            end = time.perf_counter()
            yield Answer(text.strip(), turn.hits, replace(usage, ttft_s=first - turn.t0, total_s=end - turn.t0),
                         reason, tuple(check.unknown), evidence=ranked, used=tuple(dict.fromkeys(quoted)),
                         mode="grounded")
            return
        attribution = attribute(turn.question, said, turn.hits, embedder, common=self.vocabulary.common)
        verdict = judge(turn.question, said, attribution, evidence, turn.hits, ended=reason == "stop")
        tail = grounded_tail(said, attribution, verdict.kind)
        if said:
            yield tail
        text = (lead + (IN_SHORT + said + tail if said else "")).strip()
        shown = (lead + IN_SHORT + with_markers(said, attribution)).strip() if verdict.kind != "not_backed" else verdict.shown
        # withheld, only the lead is the passages' answer (and the model's sentence when labelled: `off_question`)
        cited = verdict.kind != "not_backed" or off_question(attribution.support, verdict.kind)
        used = tuple(dict.fromkeys([*quoted, *(attribution.used if cited else ())]))
        end = time.perf_counter()
        yield Answer(text, turn.hits, replace(usage, ttft_s=first - turn.t0, total_s=end - turn.t0), reason,
                     tuple(check.unknown), evidence=ranked, support=attribution.support, used=used, marked=text,
                     mode="grounded", verdict=verdict.kind, shown=shown)

    def checked(self, answer: Answer, question: str) -> Answer:
        """``answer`` with its evidence (the passage sentences that best answer ``question``) and,
        with ``attribution``, each sentence's support, the sources used, the marked text and the
        verdict with what to show (`slimrag.rag.verdict`)."""
        if answer.abstained or not answer.sources:
            return answer
        embedder = Memo(self.index.embedder)  # the passage sentences are embedded once for both
        evidence = tuple(rank_sentences(question, answer.sources, embedder, self.evidence))
        if not self.attribution:
            return replace(answer, evidence=evidence)
        check = attribute(question, answer.text, answer.sources, embedder, common=self.vocabulary.common)
        verdict = judge(question, answer.text, check, evidence, answer.sources, ended=answer.finish_reason == "stop")
        # withheld, the answer shown is the quoted evidence: its sources are the ones used
        used = check.used if verdict.kind != "not_backed" else verdict.quoted
        return replace(answer, evidence=evidence, support=check.support, used=used,
                       marked=with_markers(answer.text, check), verdict=verdict.kind, shown=verdict.shown)

    def evidence_answer(self, question: str, k: int = 4, *, source: str | None = None) -> Answer:
        """Answer with evidence alone, without calling the model (`slimrag.rag.evidence.evidence_answer`,
        this RAG's mode, relevance floor and evidence config)."""
        return evidence_answer(self.index, question, k, mode=self.mode, source=source, floor=self.guards.floor,
                               config=self.evidence)

    def ask(self, question: str, k: int = 4, *, source: str | None = None,
            config: GenerationConfig | None = None, answer: str | None = None) -> Answer:
        """Answer ``question`` from the top-``k`` passages (in answer mode ``answer``, None for
        this RAG's); returns the checked `Answer`."""
        return self.respond(question, k, source=source, config=config, answer=answer).answer

    def stream(self, question: str, k: int = 4, *, source: str | None = None,
               config: GenerationConfig | None = None) -> Iterator[str]:
        """Yield the answer's text as it is generated (use `respond` for sources and usage)."""
        yield from self.respond(question, k, source=source, config=config)

    def stream_answer(self, question: str, k: int = 4, *, source: str | None = None,
                      config: GenerationConfig | None = None,
                      history: tuple[tuple[str, str], ...] = (), answer: str | None = None,
                      ) -> Iterator[str | Answer]:
        """Yield text pieces, then one final `Answer` (text, sources by relevance, usage, finish
        reason, unknown citations): the pieces an `AnswerStream` wraps; a shell reads `respond`. ``history``: earlier (role, content) turns from a caller (the
        OpenAI-compatible server's messages), shown to the model and used for retrieval. ``answer``:
        this request's answer mode (``"free"`` or ``"grounded"``), None for the RAG's."""
        yield from self.answer(self.turn(question, k, source=source, history=history, answer=answer), config, answer)

    def respond(self, question: str, k: int = 4, *, source: str | None = None,
                config: GenerationConfig | None = None,
                history: tuple[tuple[str, str], ...] = (), answer: str | None = None) -> AnswerStream:
        """`stream_answer` as one object: iterate it for the text, then read its ``answer``
        (`slimrag.rag.stream.AnswerStream`)."""
        return AnswerStream(self.stream_answer(question, k, source=source, config=config, history=history,
                                               answer=answer))

    def chat(self, *, replay: bool = False) -> Chat:
        """Start a multi-turn conversation; ``replay`` shows the model its earlier answers (see
        `slimrag.rag.chat`: faster follow-ups, but a small model copies them)."""
        from slimrag.rag.chat import Chat

        return Chat(self, replay=replay)


#: answer mode (`slimrag.config.ANSWER_MODES`) -> how a `RAG` answers a planned turn in it.
ANSWERERS: dict[str, Callable[[RAG, Turn, GenerationConfig | None], Iterator[str | Answer]]] = {
    "free": RAG._free,
    "grounded": RAG._grounded,
}
