"""Chunk windows start at word starts (`slimrag.ingest.chunker`, header): a window after a section's
first never begins with the tail of a word ("mpy version supported", "iki.fi> 2012-2014",
"-URL: documentation"), whichever way the spans are found (word counts, one tokenizer call,
pieces), and the windows still cover the whole text, each at most ``size`` tokens, with the
chunk count of the grid."""

from __future__ import annotations

import random
from typing import Any

import pytest

from slimrag.embed.local import default_model_dir
from slimrag.ingest.chunker import Chunker, ChunkText, load_tokenizer
from slimrag.ingest.readers import Section

#: words MiniLM cuts into several word pieces or punctuation tokens, as in package metadata
TECHNICAL = ["numpy", "Project-URL:", "<jukka@iki.fi>", "2012-2014", "https://numpy.org/doc/stable/release.html",
             "**Homepage:**", "https://github.com/numpy/numpy/issues?q=is%3Aopen+label%3Abug", "scikit-learn",
             "pyproject.toml", "requires-python>=3.10", "functools.lru_cache", "__init__.py", "tokenizers==0.19.1",
             "mailto:numpy-discussion@python.org", "Copyright(c)", "x86_64-linux-gnu", "TensorFlow", "cuBLASLt"]
PROSE = ["the", "oldest", "version", "supported", "is", "by", "Python", "and", "a", "release", "of", "for"]
SEPARATORS = [" ", " ", " ", " ", "\n", "\n\n", "\t", "\r\n"]
#: (size, overlap, longest word in tokens): the default, a small one, and an overlap over the step,
#: whose windows start at words of at most ``size - overlap`` tokens (header)
SIZES = [(200, 40, 32), (64, 16, 32), (48, 32, 16)]


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_tokenizer(str(default_model_dir()))


def metadata_text(seed: int, words: int, technical: list[str] = TECHNICAL) -> str:
    """Prose dense with many-piece words (half the words ``technical``)."""
    rng = random.Random(seed)
    return "".join(rng.choice(technical if rng.random() < 0.5 else PROSE) + rng.choice(SEPARATORS)
                   for _ in range(words)).strip()


def starts_a_word(text: str, at: int) -> bool:
    return at == 0 or text[at - 1].isspace()


def assert_word_starts_and_cover(text: str, chunks: list[ChunkText], size: int) -> None:
    """Each chunk is the exact slice at its ``char_start``, of at most ``size`` tokens; each after
    the first begins at a word start and overlaps or touches the one before; together they cover
    every character of the text but the whitespace at its ends."""
    assert len(chunks) > 1
    covered = 0  # every character before this is in some chunk
    for i, c in enumerate(chunks):
        at = int(c.metadata["char_start"])
        assert text[at: at + len(c.text)] == c.text
        assert 0 < int(c.metadata["tokens"]) <= size
        assert i == 0 or starts_a_word(text, at), (i, text[max(0, at - 20): at], c.text[:40])
        assert at <= covered or not text[covered:at].strip(), (i, text[covered:at])
        covered = max(covered, at + len(c.text))
    assert not text[covered:].strip()


def grid_starts_inside_words(tok: Any, text: str, size: int, overlap: int) -> int:
    """How many windows of the plain grid (every ``size - overlap`` tokens) begin inside a word:
    what this text would give without the fix."""
    spans = tok.encode(text, add_special_tokens=False).offsets
    return sum(not starts_a_word(text, spans[t][0]) for t in range(size - overlap, len(spans) - overlap, size - overlap))


@pytest.mark.parametrize(("size", "overlap", "longest"), SIZES)
def test_windows_start_at_word_starts_whichever_spans(tok: Any, size: int, overlap: int, longest: int) -> None:
    """Word counts (the default), one tokenizer call with offsets, and offsets in small pieces all
    cut the same windows, each after the first at a word start, together covering the text."""
    technical = [w for w in TECHNICAL if len(tok.encode(w, add_special_tokens=False).ids) <= longest]
    assert len(technical) >= len(TECHNICAL) - 3 and max(len(w) for w in technical) > 30
    text = metadata_text(1, 4000, technical)
    assert grid_starts_inside_words(tok, text, size, overlap) > 5  # the text does exercise the fix
    cut = [Chunker(tok, size, overlap).chunk([Section("Metadata", text)]),
           Chunker(tok, size, overlap, word_counts=False).chunk([Section("Metadata", text)]),
           Chunker(tok, size, overlap, word_counts=False, piece_chars=512).chunk([Section("Metadata", text)])]
    assert cut[0] == cut[1] == cut[2]
    assert_word_starts_and_cover(text, cut[0], size)
    assert all(c.metadata["heading"] == "Metadata" for c in cut[0])


def test_the_grid_keeps_its_windows_and_the_overlap_its_size(tok: Any) -> None:
    """Starts move forward within the overlap, ends stay on the grid: as many windows as the grid
    cuts (``ceil((n - size) / step) + 1``), consecutive ones still overlapping."""
    text = metadata_text(2, 6000)
    n = len(tok.encode(text, add_special_tokens=False).ids)
    chunks = Chunker(tok, 200, 40).chunk([Section("", text)])
    assert len(chunks) == -(-(n - 200) // 160) + 1
    for prev, nxt in zip(chunks, chunks[1:], strict=False):
        assert int(nxt.metadata["char_start"]) < int(prev.metadata["char_start"]) + len(prev.text)
    assert Chunker(tok, 200, 40).chunk([Section("", text)]) == chunks  # deterministic


def test_a_word_longer_than_the_overlap_moves_the_window_back(tok: Any) -> None:
    """URLs of ~60 tokens with windows of 64 and an overlap of 16: no word start lies between the
    grid point and the previous window's end, so the window moves back to the URL's start."""
    rng = random.Random(5)
    urls = ["https://example.org/" + "/".join(rng.choice(["numpy", "scikit-learn", "x86_64", "cuBLASLt", "lru_cache"])
                                              for _ in range(10)) for _ in range(30)]
    text = " ".join(f"see {u} for the release notes." for u in urls)
    assert max(len(tok.encode(u, add_special_tokens=False).ids) for u in urls) > 40
    assert grid_starts_inside_words(tok, text, 64, 16) > 5
    for chunker in (Chunker(tok, 64, 16), Chunker(tok, 64, 16, word_counts=False)):
        assert_word_starts_and_cover(text, chunker.chunk([Section("", text)]), 64)


def test_a_run_without_spaces_is_still_cut_and_covered(tok: Any) -> None:
    """A run with no word start over a whole window (one line of minified code) cannot start each
    window at a word: it is cut at the grid, still covered and within the size; the prose around
    it keeps its word starts."""
    code = "f(a,b);" * 400  # ~2,000 tokens, no space
    text = f"{metadata_text(3, 300)} {code} {metadata_text(4, 300)}"
    for chunker in (Chunker(tok, 64, 16), Chunker(tok, 64, 16, word_counts=False)):
        chunks = chunker.chunk([Section("", text)])
        code_at, code_end = text.index(code), text.index(code) + len(code)
        outside = [c for c in chunks if not code_at < int(c.metadata["char_start"]) < code_end]
        assert len(outside) < len(chunks)  # some windows start inside the run, as they must
        assert all(i == 0 or starts_a_word(text, int(c.metadata["char_start"])) for i, c in enumerate(outside))
        covered = 0
        for c in chunks:
            at = int(c.metadata["char_start"])
            assert text[at: at + len(c.text)] == c.text and int(c.metadata["tokens"]) <= 64
            assert at <= covered or not text[covered:at].strip()
            covered = max(covered, at + len(c.text))
        assert covered == len(text)
