"""Short sections counted by words (`Chunker.short_count`) give exactly the chunks of tokenizing
every section whole: checked against a straightforward reference on the fixture pages, synthetic
passages and hostile text (empty, blank, huge, long words, control characters, non-ASCII)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from bench.passages import Passages
from slimrag.embed.local import default_model_dir
from slimrag.ingest.chunker import MAX_CHARS_PER_TOKEN, Chunker, ChunkText, load_tokenizer
from slimrag.ingest.readers import Section, read_file
from slimrag.ingest.wordcount import WordCounts, splits_at_whitespace

FIXTURES = Path(__file__).parent / "fixtures"
SIZES = [(200, 40), (64, 16), (12, 3)]
#: pieces of hostile text: characters str.split() and BERT treat differently (\x0b, \x1c, \x85,
#: \u2028), ones BERT drops (\x00, \ufffd, soft hyphen) or pads (CJK), marks NFD reorders, case
#: changes that grow a character (İ, ß), special tokens, a word over WordPiece's 100 characters,
#: ASCII punctuation next to marks, special tokens and code, non-ASCII punctuation
PIECES = ["the", "lighthouse", "keeper's", "e-mail", "3.14", "(see", "below).", "café", "naïve", "Ἀθῆναι",
          "İstanbul", "straße", "ΣΊΣΥΦΟΣ", "漢字仮名", "한국어", "🙂👍🏽", "a\u0301\u0327", "\u0301x", "x\u0300\u0316",
          "[MASK]", "[UNK]x", "x[SEP]y", "\x00", "a\x00b", "\x0b", "a\x0bb", "\x1c", "x\x1f", "\x85", "b\x85c",
          "\u00a0", "q\u00a0r", "\u2028", "\u3000", "\u200b", "\u00ad", "\ufffd", "\ufeff", "w" * 120, "ab" * 60,
          "ÉCOLE", "ﬁne", "Ⅻ", "①", "<a", "#", "...", "--", "\u0600", "\U0001d400",
          # punctuation, where words missing from the table are cut (Chunker._count_missing)
          ".\u0301", "x.\u0903", "e.g.", "[MASK].", ".[UNK]", "[CLS", "SEP]", "[PAD]]", "foo()", "__init__",
          "a-b-c", "'s", "\"q\"", "os.path.join(", "http://x.y/z?a=1&b=2", "¿qué?", "«»", "\u037e", "\u0387"]
SEPARATORS = [" ", " ", " ", "\n", "\n\n", "\t", "\r\n", "  ", ""]


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_tokenizer(str(default_model_dir()))


def reference_chunks(tok: Any, sections: list[Section], size: int, overlap: int) -> list[ChunkText]:
    """The chunks of the header's algorithm with each section tokenized whole, in one call: the
    ground truth (the module's own code tokenizes huge sections in pieces and counts short ones
    by words)."""
    out: list[ChunkText] = []
    pending: list[tuple[Section, int]] = []

    def flush() -> None:
        if pending:
            first = pending[0][0]
            meta: dict[str, Any] = {"heading": first.heading, "tokens": sum(n for _, n in pending)}
            if first.page is not None:
                meta["page"] = first.page
            out.append(ChunkText("\n\n".join(s.text.strip() for s, _ in pending), meta))
            pending.clear()

    for sec in sections:
        if not sec.text.strip():
            continue
        spans = tok.encode(sec.text, add_special_tokens=False).offsets
        if len(spans) <= size:
            if sum(n for _, n in pending) + len(spans) > size or (pending and sec.page != pending[0][0].page):
                flush()
            pending.append((sec, len(spans)))
            continue
        flush()
        grid = start = 0  # ends on the grid of size - overlap, starts at word starts
        while True:
            end = min(grid + size, len(spans))
            lo = spans[start][0]
            text = sec.text[lo: spans[end - 1][1]].strip()
            if text:
                meta = {"heading": sec.heading, "tokens": end - start, "char_start": lo}
                if sec.page is not None:
                    meta["page"] = sec.page
                out.append(ChunkText(text, meta))
            if end == len(spans):
                break
            grid += size - overlap
            ahead = [t for t in range(max(grid, start + 1), end + 1) if starts_word(sec.text, spans, t)]
            back = [t for t in range(start + 1, grid) if starts_word(sec.text, spans, t)]
            if ahead:
                start = ahead[0]
            else:
                grid = start = back[-1] if back else max(grid, start + 1)
    flush()
    cap, cut = size * MAX_CHARS_PER_TOKEN, []
    for c in out:
        if len(c.text) <= cap:
            cut.append(c)
            continue
        tokens = c.metadata["tokens"]
        for i in range(0, len(c.text), cap):
            piece = c.text[i: i + cap]
            if piece.strip():
                meta = {**c.metadata, "tokens": max(1, round(tokens * len(piece) / len(c.text)))}
                if "char_start" in meta:
                    meta["char_start"] += i
                cut.append(ChunkText(piece, meta))
    return cut


def starts_word(text: str, spans: list[tuple[int, int]], t: int) -> bool:
    """Whether token ``t`` starts a word: token 0, or one after a space, tab, newline or CR."""
    return t == 0 or any(c in " \t\n\r" for c in text[spans[t - 1][1]: spans[t][0]])


def hostile_text(rng: random.Random, words: int) -> str:
    return "".join(rng.choice(PIECES) + rng.choice(SEPARATORS) for _ in range(words))


def assert_same_chunks(tok: Any, docs: list[list[Section]]) -> None:
    """Every (size, overlap) of `SIZES`: one chunker over all documents (its word table warm from
    the earlier ones, as in a build) cuts each exactly as the reference does."""
    for size, overlap in SIZES:
        chunker = Chunker(tok, size, overlap)
        assert chunker.word_counts
        for sections in docs:
            assert chunker.chunk(sections) == reference_chunks(tok, sections, size, overlap), sections[:2]


def test_the_fixture_pages_give_the_reference_chunks(tok: Any) -> None:
    docs = [read_file(p) for p in sorted(FIXTURES.rglob("*")) if p.is_file()]
    assert len(docs) >= 3 and all(docs)
    assert_same_chunks(tok, docs)


def test_synthetic_passages_give_the_reference_chunks(tok: Any) -> None:
    """The bench's passages, one per document as `bench.scale` builds them, and merged sections."""
    texts = [t for _, t in Passages(0).pairs(1500)]
    docs = [[Section("", t)] for t in texts] + [[Section(f"h{i}", t) for i, t in enumerate(texts[j: j + 7])]
                                                for j in range(0, 300, 7)]
    assert_same_chunks(tok, docs)


def test_hostile_sections_give_the_reference_chunks(tok: Any) -> None:
    """Empty, blank, whitespace-only, long words, control and non-ASCII characters, sections just
    around the chunk size and the word-count length limit, and huge sections (tokenized in pieces)."""
    rng = random.Random(17)
    docs: list[list[Section]] = [
        [], [Section("", "")], [Section("e", " \n\t\r ")], [Section("", "\x00\x0b\x1c")],
        [Section("w", "x" * 300_000)], [Section("b", "alpha" + " " * 300_000 + "omega")],
        [Section("h", hostile_text(rng, 40_000))],  # > PIECE_CHARS: tokenized in pieces
    ]
    for _ in range(300):
        n = rng.choice([1, 3, 10, 40, 120, 400])
        docs.append([Section(f"s{i}", hostile_text(rng, n), page=rng.choice([None, 1, 2]))
                     for i in range(rng.randint(1, 6))])
    assert_same_chunks(tok, docs)


def test_word_counts_equal_one_tokenizer_call(tok: Any) -> None:
    """`short_count` is the token count of one tokenizer call on the text, with a cold table, a
    warm one, and a table so small it is emptied all the time."""
    rng = random.Random(3)
    texts = [hostile_text(rng, rng.randint(0, 60)) for _ in range(3000)]
    for chunker in (Chunker(tok, 200, 40), Chunker(tok, 200, 40, word_cache=7), Chunker(tok, 200, 40, word_cache=0)):
        for text in texts + texts:
            n = chunker.short_count(text)
            expected = len(tok.encode(text, add_special_tokens=False))
            assert n is None and len(text) > 1600 or n == expected, repr(text)
        assert chunker.words is not None and len(chunker.words.table) <= chunker.words.capacity


def test_other_tokenizer_pipelines_are_tokenized_whole(tok: Any) -> None:
    """The premise of word counts is checked on the tokenizer's configuration: a pipeline that is
    not BERT's (here a Metaspace pre-tokenizer, whose tokens carry the space) never uses them."""
    from tokenizers import Tokenizer, pre_tokenizers

    assert splits_at_whitespace(tok)
    other = Tokenizer.from_str(tok.to_str())
    other.pre_tokenizer = pre_tokenizers.Metaspace()
    assert not splits_at_whitespace(other)
    chunker = Chunker(other, 200, 40)
    assert not chunker.word_counts and chunker.short_count("a few words") is None
    assert not Chunker(tok, 200, 40, word_counts=False).word_counts
    with pytest.raises(ValueError, match="BERT's tokenizer pipeline"):
        WordCounts(other)


def test_long_sections_are_cut_as_from_their_pieces(tok: Any) -> None:
    """Sections over ``piece_chars``: by word counts when every piece would be cut between words,
    else from the pieces, and the chunks are those of the pieces either way (ground truth: the
    chunker tokenizing with offsets only), also when a stretch without a space, tab or newline
    (words joined by carriage returns, one long 'word') makes a piece end inside a word."""
    rng = random.Random(11)
    texts = [hostile_text(rng, 3000),
             "\r".join(["lighthouse"] * 2000) + " tail words here",
             "lead " + "ab" * 3000 + " " + hostile_text(rng, 800),
             " ".join("word" for _ in range(2000))]
    for text in texts:
        assert len(text) > 4096
        by_words = Chunker(tok, 64, 16, piece_chars=4096)
        pieces = Chunker(tok, 64, 16, piece_chars=4096, word_counts=False)
        assert by_words.chunk([Section("h", text)]) == pieces.chunk([Section("h", text)]), text[:80]
