"""Token choice and streaming text for the embedded engine.

Decoding: temperature 0 is greedy (``argmax``; ties go to the lowest id), which is what makes
cached and uncached runs comparable token for token. Otherwise logits are divided by the
temperature, cut to the smallest set whose probability reaches ``top_p``, and sampled with a
``torch.Generator`` seeded from ``seed`` on every call, so the same request gives the same text.

Streaming text: after each token the engine decodes all generated ids and emits the new suffix.
Text that ends in U+FFFD (a multi-byte character split across tokens) is held back until it
completes, and so is any tail that could be the start of a stop string, so a stop string never
leaks out (:func:`safe_len`, :func:`find_stop`).

Imports: torch only where a token is chosen (inside the functions, a ``sys.modules`` look-up after
the first), so :class:`LoopGuard` and the text helpers cost a grounded answer's evidence lead no
torch import (~1.2 s of a cold ``slimrag ask``, docs/benchmarks.md "Cold ask").

Loops: small models fall into degenerate repetition (``1.\n2.\n3.\n`` to the token limit, or one
sentence over and over). :class:`LoopGuard` watches the text as it streams and says when its tail
has become periodic: after runs of digits are collapsed to one ``0`` (so a counter that grows is
still "the same" unit), the tail is one unit of at most ``max_period`` (80) characters repeated
at least ``min_repeats`` (4) times and covering at least ``min_chars`` (80) characters. A normal
answer never matches (a numbered list whose items have text is not periodic); the price is that
an answer which truly is 80 characters of one short pattern (a long counter, a ruler of dashes)
is stopped too. The check is one anchored regular expression over the last ``window`` (320)
characters: under a millisecond per piece, against tens of milliseconds per token. It only reads
text, so greedy decoding stays exact: a guard that never fires changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from slimrag.config import GenerationConfig

if TYPE_CHECKING:
    import torch

    from slimrag.llm.engine.copying import CopyConstraint
    from slimrag.llm.weights import LoadedModel

Chooser = Callable[["torch.Tensor"], int]


def greedy(logits: torch.Tensor) -> int:
    """The highest-scoring token id (the lowest id among ties)."""
    import torch

    return int(torch.argmax(logits).item())


def chooser(config: GenerationConfig, seed: int, copy: CopyConstraint | None = None) -> Chooser:
    """Greedy for temperature 0, else seeded temperature + nucleus (top-p) sampling; with
    ``config.repetition_penalty`` > 1, applied to the logits with this chooser's earlier picks
    penalized (one chooser per request: it remembers what it chose); with ``copy``, only among
    the tokens it allows (`slimrag.llm.engine.copying`)."""
    pick = _pick(config, seed)
    if copy is not None:
        pick = copy.choose_with(pick)
    if config.repetition_penalty == 1.0:
        return pick
    penalty = config.repetition_penalty
    chosen: list[int] = []

    def penalized(logits: torch.Tensor) -> int:
        import torch

        if chosen:
            ids = torch.tensor(sorted(set(chosen)), device=logits.device)
            scores = logits[..., ids]
            logits = logits.clone()
            logits[..., ids] = torch.where(scores > 0, scores / penalty, scores * penalty)
        token = pick(logits)
        chosen.append(token)
        return token

    return penalized


def _pick(config: GenerationConfig, seed: int) -> Chooser:
    """The token rule without penalties: greedy, or seeded temperature + top-p sampling."""
    if config.temperature == 0:
        return greedy
    import torch

    rng = torch.Generator(device="cpu").manual_seed(seed)
    temperature, top_p = config.temperature, config.top_p

    def sample(logits: torch.Tensor) -> int:
        with torch.inference_mode():
            probs = torch.softmax(logits.detach().cpu() / temperature, dim=-1)
            if top_p < 1.0:
                sorted_p, order = torch.sort(probs, descending=True)
                # Keep a token when the mass before it is still below top_p (the first always stays).
                keep = (torch.cumsum(sorted_p, dim=-1) - sorted_p) < top_p
                probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
            return int(torch.multinomial(probs, 1, generator=rng).item())

    return sample


def find_stop(text: str, stops: tuple[str, ...]) -> int | None:
    """Index where the earliest stop string starts in ``text``, or None."""
    hits = [i for s in stops if s and (i := text.find(s)) >= 0]
    return min(hits) if hits else None


def safe_len(text: str, stops: tuple[str, ...]) -> int:
    """How much of ``text`` can be emitted now: not a trailing partial character, and not a tail
    that might grow into a stop string."""
    end = len(text)
    while end and text[end - 1] == "\ufffd":
        end -= 1
    held = 0
    for s in stops:
        for k in range(min(len(s) - 1, end), held, -1):
            if text[end - k : end] == s[:k]:
                held = k
                break
    return end - held


_DIGITS = re.compile(r"\d+")


@dataclass(slots=True)
class LoopGuard:
    """Detects a degenerate loop in streamed text (see the module header for the rule and its
    knobs). Feed it every piece with :meth:`feed`; True means stop. One guard per answer."""

    max_period: int = 80
    min_repeats: int = 4
    min_chars: int = 80
    window: int = 320
    _tail: str = field(default="", repr=False)
    _pattern: re.Pattern[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_period < 1 or self.min_repeats < 2 or self.min_chars < 1:
            raise ValueError("max_period and min_chars must be >= 1 and min_repeats >= 2")
        if self.window < max(self.min_chars, self.max_period * self.min_repeats):
            raise ValueError("window must hold min_chars and min_repeats periods")
        self._pattern = re.compile(rf"(.{{1,{self.max_period}}}?)\1{{{self.min_repeats - 1},}}\Z", re.S)

    def feed(self, piece: str) -> bool:
        """Add ``piece`` to the text seen so far; True when the text now ends in a loop."""
        if not piece:
            return False
        self._tail = (self._tail + piece)[-self.window:]
        match = self._pattern.search(_DIGITS.sub("0", self._tail))
        return match is not None and len(match.group(0)) >= self.min_chars


#: Token strings that end a turn in ChatML models, added to the tokenizer's own EOS ids.
END_TOKENS = ("<|im_end|>", "<|endoftext|>")


def eos_ids(loaded: LoadedModel) -> frozenset[int]:
    """The tokenizer's EOS, the model config's EOS ids, and ChatML's end-of-turn tokens."""
    tok = loaded.tokenizer
    ids: set[int] = set(loaded.model.config.eos_ids)
    if tok.eos_token_id is not None:
        ids.add(int(tok.eos_token_id))
    vocab = tok.get_vocab()
    ids.update(vocab[t] for t in END_TOKENS if t in vocab)
    return frozenset(ids)
