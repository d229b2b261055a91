"""The `Generator` interface: turn a `Prompt` into a stream of text pieces.

One required method, :meth:`Generator.stream`; :meth:`Generator.generate` is derived from it.
The last `Delta` of a stream carries the `Usage` (prompt, cached and completion tokens, timings),
so callers never need transport details.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from slimrag.config import GenerationConfig
from slimrag.prompt import Prompt
from slimrag.types import Usage

if TYPE_CHECKING:
    from slimrag.prompt import PlanningCache


@dataclass(frozen=True, slots=True)
class Delta:
    """A piece of generated text. The final delta of a stream has ``usage`` and ``finish_reason`` set
    (its text may be empty)."""

    text: str
    usage: Usage | None = None
    finish_reason: str | None = None


@dataclass(frozen=True, slots=True)
class Completion:
    """A whole generation, collected from a stream."""

    text: str
    usage: Usage
    finish_reason: str


class Generator(ABC):
    """A language model behind one method. Implementations: `LocalGenerator` (transformers on this
    machine) and `RemoteGenerator` (any OpenAI-compatible ``/v1/chat/completions`` endpoint)."""

    #: A short name for logs and ``slimrag info``.
    name: str = "generator"

    def planning_cache(self) -> PlanningCache | None:
        """The prefix cache the passage planner should walk (``rag.plan``), or None when this
        generator keeps none it can show (remote backends; the pipeline then keeps a shadow)."""
        return None

    @abstractmethod
    def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
        """Yield text pieces as they are produced; the last one carries usage and finish reason."""

    def generate(self, prompt: Prompt, config: GenerationConfig | None = None) -> Completion:
        """Run :meth:`stream` to the end and return the whole text."""
        parts: list[str] = []
        usage, reason = Usage(), "stop"
        for delta in self.stream(prompt, config):
            parts.append(delta.text)
            if delta.usage is not None:
                usage = delta.usage
            if delta.finish_reason is not None:
                reason = delta.finish_reason
        return Completion("".join(parts), usage, reason)
