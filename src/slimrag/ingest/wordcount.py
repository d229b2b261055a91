"""Exact token counts of MiniLM's tokenizer from a table of word counts, for the chunker.

The premise: MiniLM's tokenizer (BERT's pipeline) never lets a token cross a space, tab, newline
or carriage return, nor lets the text on one side change the tokens on the other. BERT's
normalizer works per character (control characters dropped, CJK padded, accents stripped after
NFD, lowercase), NFD reorders only marks after a starter and these four are starters, the special
tokens hold no whitespace and match only their own text, and the pre-tokenizer splits there. So
the tokens of a text, with their offsets, are those of its runs between the four characters,
each tokenized alone and shifted by where it starts. `splits_at_whitespace` checks a tokenizer's
configuration for that pipeline; the tests check the premise against one tokenizer call on
hostile text (control characters, marks, special tokens, non-ASCII whitespace, long words).

`WordCounts.count`: a text's token count is the sum of its runs' counts, and a run's count is
remembered: ``capacity`` runs (default `WORD_CACHE`) of at most `WORD_CHARS` characters each,
the table emptied when full, so its memory stays under ~20 MiB (a smaller table is refilled more
often; a larger one holds more of a big corpus's rare words). A run not in the table is cut at
its ASCII punctuation (BERT's pre-tokenizer makes each such character one token of its own, and
the normalizer leaves it as it is), except the characters of the special tokens (``[`` and ``]``:
``[MASK]`` is one token): its count is one per punctuation character plus the counts of the
parts between, which prose has mostly seen (``(see`` and ``below).`` are ``see`` and
``below``). Parts not in the table either are counted by one tokenizer call on them joined by
spaces. On prose almost every run is a word seen before, so a passage costs one ``str.split``
and a dict lookup per word instead of a tokenizer call that also builds and converts an offset
pair per token (figures: docs/benchmarks.md, "Chunking throughput"). The counts are exact, not
estimates.

`WordCounts.spans`, `RunSpans`: a chunk window needs the spans of two tokens, its first and its
last, not all of them. A text is split into runs with their positions and counted by the table;
the run holding a token is found from the running counts (bisect), and only that run is
tokenized, its offsets shifted by where it starts. Where words start is in the running counts
too (`RunSpans.word_after`, `word_before`: a run's first token), and the chunker starts its
windows there (a run of printable ASCII then needs no tokenizer call for its first token at
all). A section of 1,000 tokens costs a table lookup per word and about a dozen calls on one
word, instead of one call that builds 1,000 offset pairs. Memory is a few objects per run: the chunker passes only texts of at most
``piece_chars`` characters.

Threads: a `WordCounts` may be shared (the chunker of a process is); a table emptied by one
thread meanwhile only costs another a tokenizer call. A `RunSpans` belongs to one call.
"""

from __future__ import annotations

import bisect
import itertools
import re
import string
from typing import Any

#: runs whose token count is remembered before the table is emptied (header: under ~20 MiB)
WORD_CACHE = 1 << 17
#: runs longer than this many characters are counted but not remembered (rarely repeated)
WORD_CHARS = 48
#: the characters no MiniLM token crosses (header); the runs between them are counted alone
_RUN = re.compile(r"[^ \t\n\r]+")
#: the same separators, kept by ``re.split`` so that the runs' positions add up
_SEPARATED = re.compile(r"([ \t\n\r]+)")
#: ASCII characters that ``str.split()`` splits at but the tokenizer does not (BERT drops them)
_ODD_ASCII_SPACE = ("\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f")
#: the pipeline whose tokens never cross or depend on ``_RUN``'s separators (see the header)
_WORD_SAFE = {"normalizer": ("BertNormalizer",), "pre_tokenizer": ("BertPreTokenizer",), "model": ("WordPiece",)}


def splits_at_whitespace(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` (a `tokenizers.Tokenizer`) has BERT's pipeline, whose tokens never
    cross a space, tab, newline or carriage return and do not depend on the text beyond one
    (header), and special tokens that match no more than their own text. False for anything
    else (a `Sequence` of normalizers included), and for an object that is not a `Tokenizer`."""
    try:
        parts = {"normalizer": tokenizer.normalizer, "pre_tokenizer": tokenizer.pre_tokenizer, "model": tokenizer.model}
        added = list(tokenizer.get_added_tokens_decoder().values())
    except AttributeError:
        return False
    if any(type(parts[part]).__name__ not in kinds for part, kinds in _WORD_SAFE.items()):
        return False
    return not any(re.search(r"\s", t.content) or t.lstrip or t.rstrip or t.single_word for t in added)


class WordCounts:
    """The table of run counts of one tokenizer (header). Raises ValueError for a tokenizer
    `splits_at_whitespace` refuses: its counts would not be exact."""

    def __init__(self, tokenizer: Any, capacity: int = WORD_CACHE) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        if not splits_at_whitespace(tokenizer):
            raise ValueError("word counts need BERT's tokenizer pipeline (BertNormalizer, BertPreTokenizer, "
                             "WordPiece); tokenize with offsets instead")
        self.tokenizer, self.capacity = tokenizer, capacity
        #: run -> token count; at most ``capacity`` entries
        self.table: dict[str, int] = {}
        special = "".join(t.content for t in tokenizer.get_added_tokens_decoder().values())
        self._punct = re.compile("[" + "".join(re.escape(c) for c in string.punctuation if c not in special) + "]")

    def count(self, text: str) -> int:
        """The exact token count of ``text`` (no special tokens)."""
        if text.isascii() and not any(c in text for c in _ODD_ASCII_SPACE):
            runs = text.split()  # the same runs as _RUN on such text, and faster
        else:
            runs = _RUN.findall(text)
        try:
            return sum(map(self.table.__getitem__, runs))
        except KeyError:
            return sum(self._lookup(runs, self._missing(runs)))

    def spans(self, text: str) -> RunSpans:
        """The token spans of ``text``, found run by run (header)."""
        pieces = _SEPARATED.split(text)  # run, separator, run, ..., run (runs may be empty)
        runs = pieces[::2]
        starts = list(itertools.accumulate(map(len, pieces), initial=0))[::2]
        try:
            counts = list(map(self.table.__getitem__, runs))
        except KeyError:
            counts = self._lookup(runs, self._missing(runs))
        return RunSpans(self.tokenizer, starts, runs, counts)

    def _lookup(self, runs: list[str], found: dict[str, int]) -> list[int]:
        """The counts of ``runs`` from ``found`` (what `_missing` counted), else the table."""
        counts = list(map(found.get, runs, map(self.table.get, runs)))
        if None in counts:  # the table emptied by another thread meanwhile
            counts = [self._count_one(r) if n is None else n for r, n in zip(runs, counts, strict=True)]
        return counts

    def _missing(self, runs: list[str]) -> dict[str, int]:
        """The counts of the ``runs`` not in the table: cut at punctuation (header), the parts not
        in the table either counted in one tokenizer call; runs and parts remembered. Written
        with C-level iteration (``filterfalse``, ``map``): on real prose most sections bring an
        unseen word, so this runs for most of them."""
        table = self.table
        missing = list(set(itertools.filterfalse(table.__contains__, runs)))
        parts = list(map(self._punct.split, missing))  # punctuation characters: len - 1
        unknown = set(itertools.filterfalse(table.__contains__, itertools.chain.from_iterable(parts)))
        unknown.discard("")
        words = list(unknown)
        found = dict(zip(words, self._count_words(words), strict=True))
        found[""] = 0  # the empty part (and the empty run `spans` may hold): no token
        get, known = found.get, table.get
        for r, ps in zip(missing, parts, strict=True):
            try:
                found[r] = len(ps) - 1 + sum(map(get, ps, map(known, ps)))
            except TypeError:  # a part the table lost meanwhile (another thread emptied it)
                found[r] = len(ps) - 1 + sum(self._count_one(p) if get(p) is None else get(p) for p in ps)
        if len(table) + len(found) > self.capacity:
            table.clear()
        if len(table) + len(found) <= self.capacity and max(map(len, found), default=0) <= WORD_CHARS:
            table.update(found)
        else:
            for r, n in found.items():
                if len(r) <= WORD_CHARS and len(table) < self.capacity:
                    table[r] = n
        return found

    def _count_words(self, words: list[str]) -> list[int]:
        """Token counts of whitespace-free ``words``: one tokenizer call (several joined by single
        spaces, each token given to the word its start lies in)."""
        if len(words) <= 1:
            return [len(self.tokenizer.encode(w, add_special_tokens=False)) for w in words]
        starts = list(itertools.accumulate((len(w) + 1 for w in words[:-1]), initial=0))
        counts = [0] * len(words)
        for a, _ in self.tokenizer.encode(" ".join(words), add_special_tokens=False).offsets:
            counts[bisect.bisect_right(starts, a) - 1] += 1
        return counts

    def _count_one(self, run: str) -> int:
        """The count of one run: from the table, else from the tokenizer (when another thread
        emptied the table meanwhile)."""
        n = self.table.get(run)
        return len(self.tokenizer.encode(run, add_special_tokens=False)) if n is None else n


class RunSpans:
    """Token spans of a text from its runs and their token counts (header): token ``t`` lies in
    the run whose running count passes ``t``, and only that run is tokenized to find where. Not
    even that when ``t`` is the first or the last token of a run of printable ASCII: nothing in
    such a run is dropped or changed in length, so its tokens tile it from its first character
    to its last (the tests hold this against one tokenizer call too)."""

    def __init__(self, tokenizer: Any, starts: list[int], runs: list[str], counts: list[int]) -> None:
        self.tokenizer, self.starts, self.runs = tokenizer, starts, runs
        self.before = list(itertools.accumulate(counts, initial=0))  # tokens before each run
        self._offsets: dict[int, list[tuple[int, int]]] = {}  # the last two runs tokenized

    def __len__(self) -> int:
        return self.before[-1]

    def start(self, t: int) -> int:
        """The first character of token ``t``."""
        i = bisect.bisect_right(self.before, t) - 1  # the run holding token t (a run of 0 is skipped)
        if t == self.before[i] and _tiled(self.runs[i]):
            return self.starts[i]
        return self._span(i, t)[0]

    def end(self, t: int) -> int:
        """The character after token ``t``."""
        i = bisect.bisect_right(self.before, t) - 1
        if t == self.before[i + 1] - 1 and _tiled(self.runs[i]):
            return self.starts[i] + len(self.runs[i])
        return self._span(i, t)[1]

    def word_after(self, t: int, hi: int) -> int | None:
        """The first token in ``[t, hi]`` that starts a run (a word, for the chunker), or None."""
        i = bisect.bisect_right(self.before, t) - 1  # the run holding token t; the next one's first
        w = t if self.before[i] == t else self.before[i + 1]
        return w if w <= hi and w < len(self) else None

    def word_before(self, t: int, lo: int) -> int | None:
        """The last token in ``[lo, t]`` that starts a run, or None."""
        w = self.before[bisect.bisect_right(self.before, t) - 1]
        return w if w >= lo else None

    def _span(self, i: int, t: int) -> tuple[int, int]:
        """Token ``t``'s span from run ``i``'s own offsets. The last two runs are kept: a window's
        first and last tokens alternate between two runs when both lie in long ones, and each
        run is then tokenized once, so the work stays linear in the section."""
        offsets = self._offsets.get(i)
        if offsets is None:
            if len(self._offsets) >= 2:
                del self._offsets[min(self._offsets)]
            offsets = self._offsets[i] = self.tokenizer.encode(self.runs[i], add_special_tokens=False).offsets
        a, b = offsets[t - self.before[i]]
        return a + self.starts[i], b + self.starts[i]


def _tiled(run: str) -> bool:
    """Whether ``run``'s tokens cover it end to end (printable ASCII: see `RunSpans`)."""
    return run.isascii() and run.isprintable()
