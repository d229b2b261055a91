"""What a generator backend declares before one of its generators is built.

A `RAG` reads a generator's capability attributes (`slimrag.llm.base`) when it is made; a
`slimrag.llm.deferred.Deferred` answers them from a `Declared` while the real generator is built
on another thread. The embedded engine's declaration, `LOCAL`, is the one home of its values:
`slimrag.llm.local.LocalGenerator` takes its class attributes from it, and this module imports
nothing heavy, so a caller learns them without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Declared:
    """What a backend's generators say of themselves before one is built: the `Generator`
    capability attributes (`slimrag.llm.base`), and ``options``, the keyword options a build on
    another thread may take (a spec with any other is built at once, so that its error is raised
    where it is given)."""

    thread_safe: bool = False
    default_repetition_penalty: float = 1.0
    shadows_prefix_cache: bool = False
    default_answer_mode: str = "free"
    copies: bool = False
    options: frozenset[str] = frozenset()


#: What the embedded engine's generators declare (`slimrag.llm.local.LocalGenerator` takes its
#: capability attributes from it): thread-safe; grounded answers, as a 135M model shortens well
#: (issue 29), its sentence copied from the evidence (``copies``); repetition penalty 1.1, as it
#: loops without one (measured on the demo questions: 1.1 keeps answers on topic, 1.2 starts to
#: garble).
LOCAL = Declared(thread_safe=True, default_repetition_penalty=1.1, default_answer_mode="grounded", copies=True,
                 options=frozenset({"cache", "batch", "bf16_prefill"}))
