"""Deterministic prompt rendering, in segments that can be cached one by one.

A prompt is ``[system segment][passage segment]...[question segment]``. Each segment is rendered
to text on its own and (for the local engine) tokenized on its own, then the token ids are joined.
That way a passage's tokens never depend on its neighbours, so the key/value states of a passage
computed after a given prefix can be reused by any later request with the same prefix
(DESIGN.md, "Warm generation"). Passages are labelled by their source, never by their rank
number: a rank label would change the text of a passage whenever the order changes and defeat
every prefix cache, ours and vLLM's alike. The relevance ranking is stated once, after the
passages, in the question segment.

The chat markup is ChatML (``<|im_start|>role ... <|im_end|>``), which SmolLM2, Qwen and many
others use. Remote backends receive the same text as OpenAI messages: one system message and one
user message whose content is the concatenation of the passage and question segments, so their
prefix caches see identical bytes for identical passage orders.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


@dataclass(frozen=True, slots=True)
class Segment:
    """A piece of the prompt that is tokenized on its own. ``key`` is None for the question segment,
    which is never cached."""

    key: str | None
    text: str


@dataclass(frozen=True, slots=True)
class Prompt:
    """Everything the model is given for one turn.

    passages: in prompt order (chosen by the planner). ranking: the passage keys in relevance
    order, stated after the passages when it differs from prompt order. history: earlier
    (role, content) turns of a chat, rendered into the system segment.
    """

    question: str
    passages: tuple[Passage, ...] = ()
    system: str = DEFAULT_SYSTEM
    ranking: tuple[str, ...] = ()
    history: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def system_text(self) -> str:
        """The system prompt plus earlier chat turns (plain text, no markup)."""
        return self.system

    def passage_text(self, p: Passage) -> str:
        """The text of one passage segment, without chat markup."""
        return f"[{p.label}]\n{p.text.strip()}\n\n"

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

    def segments(self) -> list[Segment]:
        """ChatML segments for a local engine: system (key ``"system"``), passages, question."""
        head = f"<|im_start|>system\n{self.system_text()}<|im_end|>\n"
        for role, content in self.history:
            head += f"<|im_start|>{role}\n{content}<|im_end|>\n"
        head += "<|im_start|>user\n"
        if self.passages:
            head += "Passages:\n"
        segs = [Segment("system", head)]
        segs += [Segment(p.key, self.passage_text(p)) for p in self.passages]
        segs.append(Segment(None, self.question_text() + "<|im_end|>\n<|im_start|>assistant\n"))
        return segs

    def messages(self) -> list[dict[str, str]]:
        """OpenAI chat messages carrying the same text as :meth:`segments`."""
        msgs = [{"role": "system", "content": self.system_text()}]
        msgs += [{"role": r, "content": c} for r, c in self.history]
        body = "Passages:\n" if self.passages else ""
        body += "".join(self.passage_text(p) for p in self.passages)
        msgs.append({"role": "user", "content": body + self.question_text()})
        return msgs
