"""How chunk text and metadata are stored: blocks of consecutive chunks, each one zstd frame
compressed with a dictionary trained on the index's own first chunks.

Block layout
    A block holds the chunks with ids ``first .. first + n - 1`` (chunk ``i`` at slot
    ``i - first``; a slot whose chunk was deleted holds an empty payload once the block is
    rewritten). Stored body: ``codec byte`` + compressed bytes of ``JSON list of payload lengths
    + "\\n" + payloads``. A payload is ``metadata JSON + "\\n" + text``: ``json.dumps`` escapes
    newlines, so the first ``\\n`` always ends the metadata, which thus costs a few bytes a chunk
    (its keys repeat, and the dictionary learns them) against ~45 bytes of JSON in a column.
    Codec byte ``n + 1``: zstd with dictionary ``n`` of the ``dictionaries`` table (0: none).

Why blocks and a dictionary
    Chunks are short (200 tokens: ~200-900 bytes), too short for zstd to find repeats inside one;
    a dictionary holds the corpus's common strings once, and a block lets a chunk reuse its
    neighbours' words. Measured on disfl_qa's 1,484 chunks (`bench.text_store`, payload bytes
    kept): plain zstd per chunk 0.59, a 32 KiB dictionary per chunk 0.42 (level 3), blocks of 64
    with a 16 KiB dictionary 0.35 (level 9), the dictionary's own bytes included. Reading a chunk
    decodes its block (64 chunks: tens of KiB, ~0.1 ms); `Codec` keeps the last decoded blocks,
    so FTS5 reading matched chunks in id order decodes each block once.

Knobs (module constants; each trades bytes against time)
    `LEVEL` = 9: zstd level. Level 3 keeps ~0.02 more of the text and compresses ~3x faster;
    level 19 saves ~0.01 more and is ~6x slower than 9, which a build of millions of chunks feels.
    `BLOCK_CHUNKS` = 64: chunks per block. SQLite's pages decide as much as zstd here: bytes of
    the whole text part (blocks, chunk rows, their index) on disfl_qa for 1, 2, 4, 8, 32 and 64
    chunks a block: 512, 487, 504, 590, 459 and 426 KB. Blocks of 4-16 chunks compress to a
    little over one 4 KiB page and leave most of an overflow page empty; from ~32 on, a block is
    a chain of full overflow pages. The price is decoding: a chunk read decodes 64 chunks' text.
    `DICT_BYTES` = 16 KiB: dictionary size. At 64 chunks a block, 16 and 32 KiB give the same
    bytes on disfl_qa, dictionary included (393 KB); at 16 chunks a block 32 KiB was ~0.003 better.
    It is stored once, so a small index pays less for a small one.
    `TRAIN_MIN_BYTES` = 128 KiB: a dictionary is trained once a commit brings this much text
    (smaller samples do not generalize); a smaller index compresses without one until
    `slimrag.catalog.upgrade` trains one on all it holds.
    `TRAIN_MAX_CHUNKS` = 2,000: the training sample is the first chunks up to this many.
    `CACHE_BLOCKS` = 64: decoded blocks kept per connection (~3 MB of text at 700 bytes a chunk).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import zstandard

LEVEL = 9
BLOCK_CHUNKS = 64
DICT_BYTES = 16 * 1024
TRAIN_MIN_BYTES = 128 * 1024
TRAIN_MAX_CHUNKS = 2000
CACHE_BLOCKS = 64


def payload(text: str, metadata: dict[str, Any]) -> str:
    """What one chunk's slot holds."""
    return json.dumps(metadata) + "\n" + text


def split_payload(p: str) -> tuple[str, dict[str, Any]]:
    """``(text, metadata)`` of a payload (an empty payload is a deleted chunk's slot)."""
    meta, _, text = p.partition("\n")
    return text, json.loads(meta) if meta else {}


def train(samples: Sequence[str]) -> bytes | None:
    """A zstd dictionary trained on ``samples`` (payloads), or None when they are too few bytes
    to train on (see `TRAIN_MIN_BYTES`) or zstd finds nothing to learn in them."""
    raw = [s.encode("utf-8") for s in samples[:TRAIN_MAX_CHUNKS]]
    if sum(len(s) for s in raw) < TRAIN_MIN_BYTES:
        return None
    try:
        return zstandard.train_dictionary(DICT_BYTES, raw, level=LEVEL).as_bytes()
    except zstandard.ZstdError:  # e.g. samples without any repetition: plain zstd it is
        return None


class Codec:
    """Encodes blocks with the newest dictionary and decodes blocks of any dictionary.

    ``load`` fetches a dictionary's bytes by number (from the ``dictionaries`` table);
    dictionaries are immutable once committed, so decoders are cached for the codec's life, and
    `forget` drops them (after a rollback, which may undo a dictionary written in it). Decoded
    blocks are cached by their first chunk id and checked against the stored bytes, so a block
    rewritten by another connection is never served stale."""

    def __init__(self, load: Callable[[int], bytes | None]) -> None:
        self._load = load
        self._decoders: dict[int, zstandard.ZstdDecompressor] = {}
        self._encoder: tuple[int, zstandard.ZstdCompressor] | None = None
        self._blocks: OrderedDict[int, tuple[bytes, list[str]]] = OrderedDict()

    def forget(self) -> None:
        """Drop cached dictionaries and blocks (they are loaded again on use)."""
        self._decoders.clear()
        self._blocks.clear()
        self._encoder = None

    def use(self, number: int, data: bytes | None) -> None:
        """Encode with dictionary ``number`` (0 and None: plain zstd) from now on."""
        d = zstandard.ZstdCompressionDict(data) if data else None
        self._encoder = (number, zstandard.ZstdCompressor(
            level=LEVEL, dict_data=d, write_checksum=False, write_content_size=True, write_dict_id=False))

    def encode(self, payloads: Sequence[str]) -> bytes:
        """The stored body of a block of payloads (slot order)."""
        if self._encoder is None:
            self.use(0, None)
        assert self._encoder is not None
        number, enc = self._encoder
        raw = (json.dumps([len(p) for p in payloads]) + "\n" + "".join(payloads)).encode("utf-8")
        return bytes([number + 1]) + enc.compress(raw)

    def payloads(self, first: int, body: bytes) -> list[str]:
        """The payloads of a stored block, by slot."""
        hit = self._blocks.get(first)
        if hit is not None and hit[0] == body:
            self._blocks.move_to_end(first)
            return hit[1]
        number = body[0] - 1
        dec = self._decoders.get(number)
        if dec is None:
            data = self._load(number) if number else None
            if number and data is None:
                raise ValueError(f"a text block names dictionary {number}, which the catalog does not hold")
            dec = zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(data) if data else None)
            self._decoders[number] = dec
        head, _, rest = dec.decompress(body[1:]).decode("utf-8").partition("\n")
        out, at = [], 0
        for n in json.loads(head):
            out.append(rest[at: at + n])
            at += n
        self._blocks[first] = (body, out)
        if len(self._blocks) > CACHE_BLOCKS:
            self._blocks.popitem(last=False)
        return out

    def chunk(self, chunk_id: int, first: int, body: bytes) -> tuple[str, dict[str, Any]]:
        """``(text, metadata)`` of chunk ``chunk_id`` in the block starting at ``first``."""
        return split_payload(self.payloads(first, body)[chunk_id - first])

    def text(self, chunk_id: int, first: int, body: bytes) -> str:
        """Only the text of one chunk (what the keyword index reads, through SQL)."""
        return self.payloads(first, body)[chunk_id - first].partition("\n")[2]
