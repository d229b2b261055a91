"""The `Generator` interface: turn a `Prompt` into a stream of text pieces.

One required method, :meth:`Generator.stream`; :meth:`Generator.generate` is derived from it.
The last `Delta` of a stream carries the `Usage` (prompt, cached and completion tokens, timings),
so callers never need transport details.

Capabilities
    Callers ask a generator what it can do instead of checking its class (simonw/llm's
    ``model.can_stream``). The defaults suit an unknown generator; the built-in ones override them:

    ============================== ======= ================= ==================
    attribute                      default `LocalGenerator`  `RemoteGenerator`
    ============================== ======= ================= ==================
    ``thread_safe``                False   True              True
    ``default_repetition_penalty`` 1.0     1.1               1.0
    ``shadows_prefix_cache``       False   False             True
    ``default_answer_mode``        free    grounded          free
    ``copies``                     False   True              False
    ============================== ======= ================= ==================

    ``default_answer_mode``: how a `RAG` makes answers with this generator unless told
    (`slimrag.config.ANSWER_MODES`): a small local model gets the grounded mode, the passages'
    sentences first and its one short sentence after them; a capable remote model writes freely,
    and its answer is checked all the same (`slimrag.rag.grounded`).

    ``copies``: the generator honours `GenerationConfig.copy_from`, choosing every word from the
    given texts or a few connecting words (`slimrag.llm.engine.copying`); the others ignore it.
    The engine applies it to its own logits; a remote server would need a grammar or a logits
    processor per request, which the OpenAI API does not carry.

    :meth:`Generator.load` loads what the generator needs before the first request (the local
    engine's weights); it does nothing, and returns None, where nothing loads.
    :meth:`Generator.keep` computes and caches a prompt prefix ahead of the request that will
    start with it (a chat's turn and its answer, before the follow-up); it does nothing where
    the generator keeps no cache it controls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from slimrag.config import GenerationConfig
from slimrag.prompt import Prompt, Segment
from slimrag.types import Usage

if TYPE_CHECKING:
    from slimrag.llm.kv.events import KVEvent
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


class LoadReport(Protocol):
    """What :meth:`Generator.load` loaded: the seconds it took and whether the weights came from a
    converted cache (`slimrag.llm.weights.LoadedModel` is one; it reads the model file in place,
    so its ``from_cache`` is False)."""

    @property
    def load_s(self) -> float: ...

    @property
    def from_cache(self) -> bool: ...


class Generator(ABC):
    """A language model behind one method. Implementations: `LocalGenerator` (the engine of
    `slimrag.llm.model` on this machine) and `RemoteGenerator` (any OpenAI-compatible ``/v1/chat/completions`` endpoint).
    The capability attributes are described in the module header."""

    #: A short name for logs and ``slimrag info``.
    name: str = "generator"
    #: May serve several requests at once from different threads; when False, a server runs one
    #: generation at a time.
    thread_safe: bool = False
    #: The repetition penalty a `RAG` uses when given no `GenerationConfig`.
    default_repetition_penalty: float = 1.0
    #: The generator sits behind a prefix cache it cannot show (a remote server's), so the pipeline
    #: should plan against a shadow of what it sent (`slimrag.rag.shadow`).
    shadows_prefix_cache: bool = False
    #: How a `RAG` answers with this generator by default: "free" or "grounded" (module header).
    default_answer_mode: str = "free"
    #: Honours `GenerationConfig.copy_from` (module header).
    copies: bool = False

    def load(self) -> LoadReport | None:
        """Load what generation needs now (idempotent), so the first request does not wait;
        returns what was loaded, or None when nothing loads (the default)."""
        return None

    def planning_cache(self) -> PlanningCache | None:
        """The prefix cache the passage planner should walk (``rag.plan``), or None when this
        generator keeps none it can show (remote backends; the pipeline then keeps a shadow)."""
        return None

    def subscribe_kv(self, listener: Callable[[KVEvent], None]) -> bool:
        """Tell ``listener`` every change of this generator's KV cache as KV events
        (`slimrag.llm.kv.events`, what ``serve --kv-events`` publishes); False when it keeps none."""
        return False

    def keep(self, segments: Sequence[Segment]) -> int:
        """Make sure the KV of ``segments`` (a prompt prefix, every segment with a key, the system
        segment first) is cached, computing what is missing; returns the tokens computed. Called
        off the first-token path (after an answer), so the next request starting with this
        prefix prefills only what follows it. 0 here: nothing is kept."""
        return 0

    def close(self) -> None:  # noqa: B027  (a no-op by default, on purpose)
        """Release what the generator holds for later requests (a remote one's HTTP connections,
        the embedded engine's cached KV); its owner calls it when done. Nothing here: it holds none."""

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
