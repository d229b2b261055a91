"""Copy-constrained decoding: every word the model writes is copied from given texts, or is a
connecting word (issue 29, "copy-constrained decoding").

A 135M model asked to answer from three sentences writes the right value, and then keeps going:
"... during the Roman Empire, specifically during the reign of Emperor Trajan", "... 128, which
means that the cache can grow without bound". The check withholds the whole sentence, the value
with it. Constraining the tokens it may choose keeps the choosing and the shortening, and takes
away the inventing: a name, a number or an identifier it writes must be a span of the texts.

The rule, over token ids (:class:`CopyConstraint`), one per request:

- the *sources* are the given texts (the evidence sentences the model reads and the question),
  each tokenized after a space, as it stands inside a sentence, and on its own, as it opens one;
  plus `CONNECTORS`, the words that join copied spans ("the", "is", "was", "in", "by", ...), and
  `PUNCTUATION`;
- a token may *continue* a copy: it is the token that follows, in some source, a position the
  tokens chosen so far were copied from (every such position is followed at once, as in a suffix
  automaton; the set of live positions is what is tracked);
- or *start* one: it opens a word in some source (its text begins with a space) or is punctuation
  there; the first token of the answer may also open a source as a sentence does (no space);
- or end the answer: the model's end-of-sequence ids and a line break (the grounded mode stops at
  the line's end).

So a word is written only as a source writes it: mid-word pieces come only by continuation, and a
number's digits only in the source's order.

*Spans* (``spans``, `slimrag.config.GenerationConfig.copy_spans`, default 1): how many copies of
content the answer may start; a connector opening a copy ("The", "It") does not count. With any
number, words are joined in new orders ("Kim Min-jae was composed by the Australian actor and writer
Peter Parker", every word from the passages): measured on the tuning slices, that wrote as many
unbacked claims as free decoding (check precision 0.73-0.77, confidently wrong up to 0.18 on the
folder set). With one, the sentence is a connector or two and then one span of a passage or of the
question, ended at a full stop or by the model: a passage's own words, which the check then reads
for whether they answer (docs/benchmarks.md, "Copy-constrained decoding"). Once the spans are used,
only the current span's next token, a full stop (once) or the end may follow.

Greedy decoding stays deterministic and exact in the engine's sense: the same request gives the
same tokens, cached or not, batched or alone (the mask depends only on the request's own tokens).
Cost: a token's allowed ids (a few hundred) are listed and their logits gathered, and the token is
picked among them (`CopyConstraint.choose_with`): 0.3 ms a token measured for three evidence
sentences and a question (233 ids allowed, on a loaded machine), against ~10-20 ms for the forward.
Building a request's constraint tokenizes its texts only: the connectors' and marks' ids are the same
for every request, read once per tokenizer (`Joining`, which the generator keeps).

Knobs
    ``spans`` (1, above). `CONNECTORS`: more words make the answer read better and let more be
    written that no passage says (a negation, a comparison); the list holds articles,
    prepositions, auxiliaries, pronouns and conjunctions only, no noun, number or adjective.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: Picks a token id from logits (`slimrag.llm.engine.decoding.Chooser`, named here too: that module
#: imports this one).
Pick = Callable[["torch.Tensor"], int]

#: Words that join copied spans (module header): no noun, number or adjective among them.
CONNECTORS = tuple("""
a an the this that these those it its they their them he his she her who whom whose which what
when where why how is are was were be been being has have had do does did can could will would
should may might must of in on at by for from with to into onto as than and or but nor so if
then also not no only both either neither each all any some such there here about after before
during between over under through within without while since until because called known named
""".split())
#: Punctuation the answer may write between spans.
PUNCTUATION = tuple(". , ; : ( ) ' \" ` ? !".split())


class CopyConstraint:
    """The tokens a request may choose next under the copy rule (module header).

    sources: token id sequences to copy from (see `build`); starts: ids that may open a copy at
    any point; openers: ids that may also open the answer; ends: ids that end it (EOS, line
    break); vocab: the logits' length; spans: how many copies may start (None: any number);
    stops: ids that close the answer once the spans are used (a full stop); joiners: ids whose
    copy does not count as a span (the connectors' first tokens). Call `allowed` for the next
    token's ids and `advance` with the token chosen."""

    def __init__(self, sources: Sequence[Sequence[int]], starts: Iterable[int], openers: Iterable[int],
                 ends: Iterable[int], vocab: int, spans: int | None = None, stops: Iterable[int] = (),
                 joiners: Iterable[int] = ()) -> None:
        self.sources = [list(s) for s in sources]
        self.joiners = frozenset(joiners)
        self.spans = spans
        self.stops = frozenset(stops)
        self._started = 0
        self._counted = False
        self._closed = False
        self._last = -1
        self.starts = frozenset(starts)
        self.openers = frozenset(openers)
        self.ends = frozenset(ends)
        self.vocab = vocab
        self._where: dict[int, list[tuple[int, int]]] = {}
        for i, src in enumerate(self.sources):
            for j, t in enumerate(src):
                self._where.setdefault(t, []).append((i, j))
        self._live: list[tuple[int, int]] = []
        self._first = True

    @classmethod
    def build(cls, texts: Sequence[str], encode: Callable[[list[str]], list[list[int]]],
              piece: Callable[[int], str], ends: Iterable[int], vocab: int,
              spans: int | None = None, joining: Joining | None = None) -> CopyConstraint:
        """The constraint for copying from ``texts``: ``encode`` tokenizes a list of texts (no
        special tokens), ``piece`` decodes one id, ``ends`` are the ids that end the answer
        besides a line break, ``vocab`` the logits' length, ``spans`` as in the class; ``joining``:
        the connectors and marks in the same tokens (`Joining.of`, read here when not given)."""
        join = joining or Joining.of(encode, piece)
        spaced = encode([" " + t for t in texts])
        alone = encode(list(texts))
        starts = {t for ids in spaced for t in ids if _starts_word(piece(t))} | join.starts
        openers = {ids[0] for ids in alone if ids} | join.openers
        return cls([*spaced, *join.spaced, *alone, *join.alone, *join.marks], starts, openers,
                   {*ends, *join.ends}, vocab, spans, join.stops, join.joiners)

    def allowed(self) -> list[int]:
        """The ids the next token may be (sorted)."""
        if self._closed:
            return sorted(self.ends)
        full = self.spans is not None and self._started >= self.spans
        out = (set(self.stops) - {self._last} if full else set(self.starts)) | self.ends
        if self._first:
            out |= self.openers
        for i, j in self._live:
            src = self.sources[i]
            if j + 1 < len(src):
                out.add(src[j + 1])
        return sorted(t for t in out if 0 <= t < self.vocab)

    def advance(self, token: int) -> None:
        """Record ``token`` as chosen. The live positions become those it continues; when it
        continues none, a new copy opens at every position holding it (when it may start one).
        A copy counts as a span at its first token that is no connector or mark, whether that
        token opened it or continued it ("The" then " earliest" from a passage is one span)."""
        cont = [(i, j + 1) for i, j in self._live
                if j + 1 < len(self.sources[i]) and self.sources[i][j + 1] == token]
        if not cont:
            if self.spans is not None and self._started >= self.spans and token in self.stops:
                self._closed = True
            self._counted = False
            if token in self.starts or (self._first and token in self.openers):
                cont = list(self._where.get(token, ()))
        if not self._counted and not self._closed and token not in self.joiners:
            self._counted = True
            self._started += 1
        self._live = list(dict.fromkeys(cont))
        self._first = False
        self._last = token

    def choose_with(self, pick: Pick) -> Pick:
        """``pick`` over the `allowed` ids only (their logits gathered, in id order, so greedy ties
        still go to the lowest id), recording each choice; the chooser of one request."""
        import torch

        def constrained(logits: torch.Tensor) -> int:
            ids = torch.tensor(self.allowed(), dtype=torch.long, device=logits.device)
            token = int(ids[pick(logits[..., ids])].item())
            self.advance(token)
            return token

        return constrained


def _starts_word(piece: str) -> bool:
    """Whether a token's text may open a copy: it begins with a space or is punctuation."""
    return piece[:1].isspace() or piece in PUNCTUATION


@dataclass(frozen=True, slots=True)
class Joining:
    """What the copy rule adds to every request's texts, in one tokenizer's ids: `CONNECTORS` after a
    space (as written and capitalised) and capitalised alone (opening the answer), and `PUNCTUATION`.
    The same for every request, so read once per tokenizer (`of`) and handed to `CopyConstraint.build`.

    spaced, alone, marks: their id sequences (sources to copy from); starts: those that open a word
    or are a mark; openers: the first ids of ``alone``; ends: a line break's first id; stops: a full
    stop's; joiners: the first ids of all three, whose copy counts as no span."""

    spaced: tuple[tuple[int, ...], ...]
    alone: tuple[tuple[int, ...], ...]
    marks: tuple[tuple[int, ...], ...]
    starts: frozenset[int]
    openers: frozenset[int]
    ends: frozenset[int]
    stops: frozenset[int]
    joiners: frozenset[int]

    @classmethod
    def of(cls, encode: Callable[[list[str]], list[list[int]]], piece: Callable[[int], str]) -> Joining:
        """The connectors and marks in the ids of ``encode`` (a list of texts, no special tokens) and
        ``piece`` (one id's text)."""
        spaced = [tuple(ids) for ids in encode([" " + w for c in CONNECTORS for w in (c, c.capitalize())])]
        alone = [tuple(ids) for ids in encode([c.capitalize() for c in CONNECTORS])]
        marks = [tuple(ids) for ids in encode(list(PUNCTUATION))]
        firsts = {t for ids in (*spaced, *alone, *marks) for t in ids[:1]}
        starts = {t for ids in spaced for t in ids if _starts_word(piece(t))} | {t for ids in marks for t in ids[:1]}
        return cls(tuple(spaced), tuple(alone), tuple(marks), frozenset(starts),
                   frozenset(ids[0] for ids in alone if ids), frozenset(encode(["\n"])[0][:1]),
                   frozenset(ids[0] for ids in encode(["."]) if ids), frozenset(firsts))
