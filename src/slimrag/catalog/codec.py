"""How a chunk's text and metadata are stored: one zstd-compressed body, with a dictionary
trained on the index's own first chunks.

Body layout
    ``codec byte`` + payload. The payload, once decoded, is ``metadata JSON + "\\n" + text``:
    ``json.dumps`` escapes newlines, so the first ``\\n`` always ends the metadata. Storing the
    metadata in the same compressed frame costs a few bytes a chunk (its keys repeat from chunk to
    chunk, which the dictionary learns), against ~45 bytes of plain JSON in a column.
    Codec byte 0: the payload is plain UTF-8 (used when compression would not make it smaller);
    codec byte n >= 1: a zstd frame compressed with dictionary ``n - 1`` of the ``dictionaries``
    table, where dictionary 0 means none (plain zstd).

Why a dictionary
    Chunks are short (200 tokens, ~200-900 bytes), too short for zstd to find repeats inside one
    chunk; a dictionary holds the corpus's common strings once. Measured on the 43,408 Python doc
    paragraphs (223 bytes on average; `bench.text_store`): plain per-chunk zstd keeps 0.667 of the
    bytes, a 32 KiB dictionary trained on the first 1,000 chunks 0.490 (level 3). Compressing the
    whole corpus as one stream would keep 0.218 but then reading one chunk means decoding many.

Knobs (module constants; each trades bytes against time)
    `LEVEL` = 3: zstd level. Level 19 saves another ~0.025 of the text bytes but compresses ~10x
    slower, which a build of millions of chunks would feel.
    `DICT_BYTES` = 32 KiB: dictionary size; 64 KiB saved ~0.01 more on Python docs, and the
    dictionary itself is stored once.
    `TRAIN_MIN_BYTES` = 128 KiB: a dictionary is trained once the text at hand reaches this size
    (smaller samples make a dictionary that does not generalize); smaller indexes use plain zstd.
    `TRAIN_MAX_CHUNKS` = 2,000: the training sample is the first chunks up to this many; training
    takes a few seconds and is done once per index.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import zstandard

LEVEL = 3
DICT_BYTES = 32 * 1024
TRAIN_MIN_BYTES = 128 * 1024
TRAIN_MAX_CHUNKS = 2000

#: codec byte of a body stored as plain UTF-8
RAW = 0


def payload(text: str, metadata: dict[str, Any]) -> bytes:
    """What one chunk's body holds, before compression."""
    return (json.dumps(metadata) + "\n" + text).encode("utf-8")


def train(samples: Sequence[bytes]) -> bytes | None:
    """A zstd dictionary trained on ``samples`` (chunk payloads), or None when they are too few
    bytes to train on (see `TRAIN_MIN_BYTES`) or zstd finds nothing to learn in them."""
    samples = list(samples[:TRAIN_MAX_CHUNKS])
    if sum(len(s) for s in samples) < TRAIN_MIN_BYTES:
        return None
    try:
        return zstandard.train_dictionary(DICT_BYTES, samples, level=LEVEL).as_bytes()
    except zstandard.ZstdError:  # e.g. samples without any repetition: plain zstd it is
        return None


class Codec:
    """Encodes chunk bodies with the newest dictionary and decodes bodies of any dictionary.

    ``load`` fetches a dictionary's bytes by number (from the catalog's ``dictionaries`` table);
    dictionaries are immutable once committed, so decoders are cached for the codec's life.
    `forget` drops the cache (after a rollback, which may undo a dictionary written in it)."""

    def __init__(self, load: Callable[[int], bytes | None]) -> None:
        self._load = load
        self._decoders: dict[int, zstandard.ZstdDecompressor] = {}
        self._encoder: tuple[int, zstandard.ZstdCompressor] | None = None

    def forget(self) -> None:
        """Drop cached dictionaries (they are loaded again on use)."""
        self._decoders.clear()
        self._encoder = None

    def use(self, number: int, data: bytes | None) -> None:
        """Encode with dictionary ``number`` (0 and None: plain zstd) from now on."""
        d = zstandard.ZstdCompressionDict(data) if data else None
        self._encoder = (number, zstandard.ZstdCompressor(
            level=LEVEL, dict_data=d, write_checksum=False, write_content_size=True, write_dict_id=False))

    def encode(self, text: str, metadata: dict[str, Any]) -> bytes:
        """The stored body of one chunk."""
        raw = payload(text, metadata)
        if self._encoder is None:
            self.use(0, None)
        assert self._encoder is not None
        number, enc = self._encoder
        packed = enc.compress(raw)
        if len(packed) >= len(raw):
            return bytes([RAW]) + raw
        return bytes([number + 1]) + packed

    def decode(self, body: bytes) -> tuple[str, dict[str, Any]]:
        """``(text, metadata)`` of a stored body."""
        meta, _, text = self.decode_payload(body).partition("\n")
        return text, json.loads(meta)

    def text(self, body: bytes) -> str:
        """Only the text of a stored body (what the keyword index reads)."""
        return self.decode_payload(body).partition("\n")[2]

    def decode_payload(self, body: bytes) -> str:
        codec = body[0]
        if codec == RAW:
            return body[1:].decode("utf-8")
        number = codec - 1
        dec = self._decoders.get(number)
        if dec is None:
            data = self._load(number) if number else None
            if number and data is None:
                raise ValueError(f"chunk body names dictionary {number}, which the catalog does not hold")
            dec = zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(data) if data else None)
            self._decoders[number] = dec
        return dec.decompress(body[1:]).decode("utf-8")
