"""Deterministic prompt rendering, in segments that can be cached one by one.

A prompt is ``[system segment][passage segment]...[question segment]``. Each segment is rendered
to text on its own and (for the local engine) tokenized on its own, then the token ids are joined.
That way a passage's tokens never depend on its neighbours, so the key/value states of a passage
computed after a given prefix can be reused by any later request with the same prefix
(DESIGN.md, "Warm generation"). Passages are labelled by their source, never by their rank
number: a rank label would change the text of a passage whenever the order changes and defeat
every prefix cache, ours and vLLM's alike. The relevance ranking is stated once, after the
passages, in the question segment.

Cache keys (:attr:`Segment.key`) are content-addressed: the system segment's key is a digest of its
text, a passage's key is its chunk id plus a digest of its rendered text. Two different texts
never share a key (two indexes both have a chunk 0; a chunk id is reused after a rebuild), so a KV
tree keyed by them can never serve the states of one text for another. The digest is BLAKE2b
over the rendered text (about a microsecond per passage); text determines token ids for a given
tokenizer, and the engine folds its model name into the root key.

Chat context never goes into the system segment: the system segment and everything of earlier
turns then stay a byte-identical prefix from turn to turn, so a follow-up question reuses their
KV. Three kinds:

- ``exchanges``: what `slimrag.rag.chat.Chat` sends with ``replay`` on: each earlier turn replayed whole
  (an :class:`Exchange`): its new passages, its question segment exactly as it was rendered
  then, and the model's answer, as ChatML user and assistant turns. A prompt with exchanges is
  ``[system][turn 1 passages...][turn 1 question][turn 1 answer][turn 2 passages...]...[new
  passages...][question]``, so turn n+1 starts with exactly turn n's segments plus its answer's,
  every one of them cacheable (keys ``asked@digest`` and ``answer@digest``), and prefills only
  its new passages and question (issue 9, multi-turn). The answer segment ends with the opening
  of the next user turn, so nothing between the answer and the next passages depends on them.
  In `messages` each exchange is a user message (its passages and question) and an assistant
  message (the answer).
- ``questions``: what a `Chat` sends otherwise (``replay=False``, remote generators): the
  earlier *questions* only (``Earlier
  questions in this conversation: ...``). The model is not shown its own earlier answers: a
  small model copies a visible earlier answer word for word, and the facts those answers came
  from are still in the prompt (the earlier turns' passages stay in it). The questions are enough
  to resolve "it" or "and on Windows?". In `messages` they are part of the last user message too,
  so a remote server's prefix cache sees the same passage prefix as the local engine.
- ``history``: (role, content) turns a caller supplies (the OpenAI-compatible server forwards its
  client's messages): rendered as ``Earlier in this conversation: ...`` for the local engine and
  kept as separate OpenAI messages for a remote one (what chat servers expect).

The chat markup is ChatML (``<|im_start|>role ... <|im_end|>``), which SmolLM2, Qwen and many
others use. Remote backends receive the same text as OpenAI messages: one system message and one
user message whose content is the concatenation of the passage and question segments (earlier
history and exchanges as messages before it), so their prefix caches see identical bytes for
identical passage orders.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

DEFAULT_SYSTEM = (
    "You are a helpful assistant. Answer the question using only the passages given. "
    "Be brief. If the passages do not contain the answer, say you do not know."
)


@dataclass(frozen=True, slots=True)
class Passage:
    """One retrieved passage. ``key`` identifies it in caches (the chunk id), ``label`` is what the
    model sees (source path and chunk position)."""

    key: str
    label: str
    text: str


def digest(text: str) -> str:
    """A short content digest (16 hex digits of BLAKE2b) used in segment cache keys."""
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


#: What closes a user turn and opens the assistant's (ends every question segment).
ASSISTANT_TURN = "<|im_end|>\n<|im_start|>assistant\n"
#: What closes an answer and opens the next user turn (ends every replayed answer segment).
USER_TURN = "<|im_end|>\n<|im_start|>user\n"


@dataclass(frozen=True, slots=True)
class Exchange:
    """An earlier chat turn replayed in a prompt (see the module header). ``passages``: how many
    of the prompt's passages this turn added (they come right before it, after the earlier
    exchanges' ones); ``asked``: its question segment as it was rendered then, without the chat
    markup (:meth:`Prompt.asked_text`); ``answer``: what the model answered."""

    passages: int
    asked: str
    answer: str

    def __post_init__(self) -> None:
        if self.passages < 0:
            raise ValueError(f"an exchange adds passages >= 0, got {self.passages}")

    def segments(self) -> list[Segment]:
        """Its question and answer segments (its passages are the prompt's)."""
        asked = self.asked + ASSISTANT_TURN
        answer = self.answer.strip() + USER_TURN
        return [Segment("asked@" + digest(asked), asked), Segment("answer@" + digest(answer), answer)]


@dataclass(frozen=True, slots=True)
class Segment:
    """A piece of the prompt that is tokenized on its own. ``key`` identifies its text (see the
    module header); it is None for the question segment, which is never cached."""

    key: str | None
    text: str


@dataclass(frozen=True, slots=True)
class Prompt:
    """Everything the model is given for one turn.

    passages: in prompt order (chosen by the planner). ranking: the passage keys in relevance
    order, stated after the passages when it differs from prompt order (it may name only some of
    the passages: in a chat, earlier turns' passages stay in the prompt). history: earlier
    (role, content) turns of a chat, rendered after the passages; questions: earlier questions
    of a `Chat`, rendered after the passages too; exchanges: earlier turns replayed whole, which
    own the first ``sum(e.passages)`` passages (see the module header for the three).
    """

    question: str
    passages: tuple[Passage, ...] = ()
    system: str = DEFAULT_SYSTEM
    ranking: tuple[str, ...] = ()
    history: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    questions: tuple[str, ...] = ()
    exchanges: tuple[Exchange, ...] = ()

    def __post_init__(self) -> None:
        owned = sum(e.passages for e in self.exchanges)
        if owned > len(self.passages):
            raise ValueError(f"the exchanges add {owned} passages but the prompt has {len(self.passages)}")

    def system_text(self) -> str:
        """The system prompt (plain text, no markup)."""
        return self.system

    def passage_text(self, p: Passage) -> str:
        """The text of one passage segment, without chat markup."""
        return f"[{p.label}]\n{p.text.strip()}\n\n"

    def system_key(self) -> str:
        """Cache key of the system segment (``segments()[0].key``)."""
        return "system@" + digest(self._head())

    def passage_key(self, p: Passage) -> str:
        """Cache key of ``p``'s segment: its chunk key and a digest of its rendered text."""
        return f"{p.key}@{digest(self.passage_text(p))}"

    def history_text(self) -> str:
        """Earlier chat turns as plain text for the question segment ("" without history)."""
        if not self.history:
            return ""
        turns = "\n".join(f"{role.capitalize()}: {content.strip()}" for role, content in self.history)
        return f"Earlier in this conversation:\n{turns}\n\n"

    def questions_text(self) -> str:
        """Earlier questions of a chat as plain text for the question segment ("" without any)."""
        if not self.questions:
            return ""
        lines = "\n".join(f"- {q.strip()}" for q in self.questions)
        return f"Earlier questions in this conversation:\n{lines}\n\n"

    def question_text(self) -> str:
        """The question segment, with the relevance ranking when passages were reordered."""
        lines: list[str] = []
        order = [p.key for p in self.passages]
        if self.ranking and list(self.ranking) != order:
            labels = {p.key: p.label for p in self.passages}
            ranked = [labels[k] for k in self.ranking if k in labels]
            lines.append("Most relevant first: " + ", ".join(ranked) + ".")
        lines.append(f"Question: {self.question.strip()}")
        return "\n".join(lines)

    def asked_text(self) -> str:
        """The question segment without chat markup: history, earlier questions, ranking and
        question (what an :class:`Exchange` keeps of this turn)."""
        return self.history_text() + self.questions_text() + self.question_text()

    def _head(self) -> str:
        head = f"<|im_start|>system\n{self.system_text()}<|im_end|>\n<|im_start|>user\n"
        return head + ("Passages:\n" if self.passages else "")

    def prefix_segments(self) -> list[Segment]:
        """The segments before this turn's own passages: the system segment, then each exchange's
        passages, question and answer. Every one is cacheable; after an answer, the next turn's
        prompt starts with exactly these (``Chat`` asks the engine to keep them)."""
        head = self._head()
        segs = [Segment("system@" + digest(head), head)]
        at = 0
        for exchange in self.exchanges:
            segs += [self._passage_segment(p) for p in self.passages[at : at + exchange.passages]]
            segs += exchange.segments()
            at += exchange.passages
        return segs

    def _passage_segment(self, p: Passage) -> Segment:
        return Segment(self.passage_key(p), self.passage_text(p))

    def segments(self) -> list[Segment]:
        """ChatML segments for a local engine: system, earlier exchanges, this turn's passages,
        then history and question."""
        owned = sum(e.passages for e in self.exchanges)
        segs = self.prefix_segments() + [self._passage_segment(p) for p in self.passages[owned:]]
        segs.append(Segment(None, self.asked_text() + ASSISTANT_TURN))
        return segs

    def messages(self) -> list[dict[str, str]]:
        """OpenAI chat messages carrying the same passages and question as :meth:`segments`; earlier
        chat turns (history, exchanges) are separate messages before the last user message."""
        msgs = [{"role": "system", "content": self.system_text()}]
        msgs += [{"role": r, "content": c} for r, c in self.history]
        body = "Passages:\n" if self.passages else ""
        at = 0
        for exchange in self.exchanges:
            body += "".join(self.passage_text(p) for p in self.passages[at : at + exchange.passages])
            msgs += [{"role": "user", "content": body + exchange.asked},
                     {"role": "assistant", "content": exchange.answer.strip()}]
            body, at = "", at + exchange.passages
        body += "".join(self.passage_text(p) for p in self.passages[at:])
        msgs.append({"role": "user", "content": body + self.questions_text() + self.question_text()})
        return msgs


def root_key(namespace: str, system_key: str) -> str:
    """The tree root of a system segment under a cache namespace (a model name, or ``remote``):
    one rule for the engine that files KV under it and the planner that walks it."""
    return f"{namespace}|{system_key}"


# -- what the planner reads of a prefix cache (the engine's tree, or the remote shadow) -----------
class CachedSegment(Protocol):
    """What the planner reads of a cached node: its token count."""

    @property
    def tokens(self) -> int: ...


class PrefixCache(Protocol):
    """A tree the planner can walk (``KVTree.walk``): ``choose`` is given the current node's
    children and returns the key to descend to, or None to stop; returns (keys, cached tokens)."""

    def walk(self, root_key: str, choose: Callable[[Mapping[str, CachedSegment]], str | None],
             ) -> tuple[list[str], int]: ...


class PlanningCache(PrefixCache, Protocol):
    """A prefix cache as a generator exposes it to the planner (``Generator.planning_cache``):
    the walk plus the root key under which it files a prompt (its system segment, namespaced by
    the model)."""

    def root_key(self, prompt: Prompt) -> str: ...
