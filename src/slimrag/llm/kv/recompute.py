"""Recompute policies of blend reuse: which reused passage tokens get their K/V computed again.

Blend reuse (:mod:`slimrag.llm.kv.blend`) places a passage's cached K/V, computed after the
system segment only, at a later position of a new prompt. Its tokens then never attended to the
passages now before them (cross-attention is missing), so their K/V from the second layer up
deviate from what a full prefill gives. A policy picks the tokens whose K/V are recomputed, in
full context and at their true positions, during the request's prefill; every other reused
token keeps its cached K/V (K re-rotated to the new position, which is exact).

Policies, by name (``CacheConfig.recompute``; join several with ``+`` for their union):

- ``boundary:k`` (EPIC, arXiv 2410.15332): the first ``k`` tokens of each placed passage. They act
  as attention sinks of the passage; recomputing them repairs most of the damage for a cost of
  ``k`` tokens per passage, known without looking at the model. EPIC's sweet spot is k ≤ 32.
- ``deviation:r`` (CacheBlend, arXiv 2405.16444; LMCache's ``blend_recompute_ratio`` = 0.15):
  the fraction ``r`` of placed tokens whose K/V deviate most from the full-prefill K/V at an early
  layer (:data:`DEVIATION_LAYER`). Finding them costs a forward of every prompt token after the
  exact prefix through the first ``DEVIATION_LAYER + 1`` layers (2 of SmolLM2's 30: ~7% of a full
  prefill), paid on every request.
- ``all``: every placed token (the limiting case: blend then computes what exact reuse computes,
  which the tests use to prove the placement and masking right). ``none``: no token (EPIC's
  "naive" baseline; only the question is prefilled).

The measured TTFT/fidelity trade-off of each setting is in ``docs/bench_generation.md``.
Policies are pure Python over token spans and a per-token score list, so they are unit-testable
without a model.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

#: The decoder layer (0-based) at which ``deviation`` compares cached and fresh K/V. Layer 0's
#: K/V depend only on the token and its position, so they never deviate once K is re-rotated;
#: layer 1 is the first that sees the missing cross-attention (CacheBlend's choice).
DEVIATION_LAYER = 1


@dataclass(frozen=True, slots=True)
class Span:
    """One placed passage: its first position in the prompt and its token count."""

    start: int
    tokens: int


class RecomputePolicy(ABC):
    """Chooses the placed tokens to recompute. ``needs_deviation``: whether :meth:`select` reads
    the per-token deviation scores (the engine only pays for them when it does). ``exact``:
    whether it recomputes every placed token, so blend can give exact mode's tokens (the engine
    then keeps exact mode's one-forward-per-segment schedule)."""

    needs_deviation: bool = False
    exact: bool = False

    @abstractmethod
    def select(self, spans: Sequence[Span], deviation: Sequence[float] | None) -> set[int]:
        """Absolute positions to recompute, among the tokens of ``spans``. ``deviation``: one
        score per placed token, spans concatenated in order (None unless ``needs_deviation``)."""


class Boundary(RecomputePolicy):
    """EPIC: the first ``k`` tokens of each placed passage."""

    def __init__(self, k: int) -> None:
        if k < 0:
            raise ValueError(f"boundary:k needs k >= 0, got {k}")
        self.k = k

    def select(self, spans: Sequence[Span], deviation: Sequence[float] | None) -> set[int]:
        return {s.start + i for s in spans for i in range(min(self.k, s.tokens))}


class Deviation(RecomputePolicy):
    """CacheBlend: the fraction ``r`` of placed tokens with the largest K/V deviation."""

    needs_deviation = True

    def __init__(self, ratio: float) -> None:
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"deviation:r needs 0 <= r <= 1, got {ratio}")
        self.ratio = ratio

    def select(self, spans: Sequence[Span], deviation: Sequence[float] | None) -> set[int]:
        positions = [s.start + i for s in spans for i in range(s.tokens)]
        if not positions:
            return set()
        if deviation is None or len(deviation) != len(positions):
            raise ValueError(f"deviation needs one score per placed token ({len(positions)})")
        n = math.ceil(self.ratio * len(positions))
        ranked = sorted(range(len(positions)), key=lambda i: -deviation[i])
        return {positions[i] for i in ranked[:n]}


class Every(RecomputePolicy):
    """Every placed token (the limiting case)."""

    exact = True

    def select(self, spans: Sequence[Span], deviation: Sequence[float] | None) -> set[int]:
        return {s.start + i for s in spans for i in range(s.tokens)}


class Nothing(RecomputePolicy):
    """No placed token."""

    def select(self, spans: Sequence[Span], deviation: Sequence[float] | None) -> set[int]:
        return set()


class Union(RecomputePolicy):
    """The union of several policies' choices."""

    def __init__(self, parts: Sequence[RecomputePolicy]) -> None:
        self.parts = tuple(parts)
        self.needs_deviation = any(p.needs_deviation for p in parts)
        self.exact = any(p.exact for p in parts)

    def select(self, spans: Sequence[Span], deviation: Sequence[float] | None) -> set[int]:
        return set().union(*(p.select(spans, deviation) for p in self.parts))


def _int_arg(make: Callable[[int], RecomputePolicy]) -> Callable[[str | None], RecomputePolicy]:
    def build(arg: str | None) -> RecomputePolicy:
        if arg is None or not arg.isdigit():
            raise ValueError(f"expected a whole number after ':', got {arg!r}")
        return make(int(arg))
    return build


def _float_arg(make: Callable[[float], RecomputePolicy]) -> Callable[[str | None], RecomputePolicy]:
    def build(arg: str | None) -> RecomputePolicy:
        try:
            value = float(arg) if arg is not None else math.nan
        except ValueError:
            value = math.nan
        if math.isnan(value):
            raise ValueError(f"expected a number after ':', got {arg!r}")
        return make(value)
    return build


def _no_arg(make: Callable[[], RecomputePolicy]) -> Callable[[str | None], RecomputePolicy]:
    def build(arg: str | None) -> RecomputePolicy:
        if arg is not None:
            raise ValueError(f"takes no argument, got {arg!r}")
        return make()
    return build


#: Policy name -> builder from the text after ``name:`` (None when there is no colon).
RECOMPUTE_POLICIES: dict[str, Callable[[str | None], RecomputePolicy]] = {
    "boundary": _int_arg(Boundary),
    "deviation": _float_arg(Deviation),
    "all": _no_arg(Every),
    "none": _no_arg(Nothing),
}


def parse_recompute(spec: str) -> RecomputePolicy:
    """The policy named by ``spec`` (``"boundary:8"``, ``"deviation:0.15"``,
    ``"boundary:8+deviation:0.15"``, ``"all"``, ``"none"``); a ValueError naming the choices
    when it is not one."""
    parts = []
    for part in spec.split("+"):
        name, colon, arg = part.strip().partition(":")
        build = RECOMPUTE_POLICIES.get(name)
        if build is None:
            raise ValueError(f"unknown recompute policy {name!r} in {spec!r}; "
                             f"choose from {sorted(RECOMPUTE_POLICIES)}, joined with '+'")
        try:
            parts.append(build(arg if colon else None))
        except ValueError as exc:
            raise ValueError(f"recompute policy {part.strip()!r}: {exc}") from exc
    return parts[0] if len(parts) == 1 else Union(parts)
