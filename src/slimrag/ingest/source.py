"""Turn what a user hands to `Index.build`/`Index.add` into chunked documents ready to store.

Inputs may be a folder, a file, a list of those, or a list of ``(source, text)`` pairs. Listing
(`iter_inputs`: crawl rules, stored source names, one entry per source) is separate from the
per-document work (`prepare`: read once, so the SHA-256 and the parsed text come from the same
bytes; skip if unchanged; parse; chunk), because distributed ingest lists on the driver and
prepares on Ray workers; both paths call these two functions.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slimrag.errors import IngestError
from slimrag.ingest.chunker import Chunker, ChunkText
from slimrag.ingest.crawl import Skipped, crawl
from slimrag.ingest.readers import Section, read_file, read_plain, reader_for

Inputs = str | Path | Iterable[str | Path | tuple[str, str]]


@dataclass(frozen=True, slots=True)
class PreparedDoc:
    """A document read, hashed and chunked, ready for `Index.write`.

    doc_id: SHA-256 of the source's bytes, the dedup key. pieces: its chunks in order; empty when
    the document is unchanged (not parsed) or has no text (then skipped with a warning).
    vectors: float32 ``(len(pieces), dim)``, row i the unit-norm embedding of
    ``index.writer.embed_input(pieces[i])`` by the index's embedder; None to embed at write time.
    """

    source: str
    doc_id: str
    mtime: float
    size: int
    pieces: list[ChunkText]
    vectors: np.ndarray | None = None


def _source_name(path: Path, root: Path | None) -> str:
    """Stored source name: relative to the index's source root when inside it, else absolute."""
    path = path.resolve()
    if root is not None and path.is_relative_to(root):
        rel = path.relative_to(root).as_posix()
        return rel if rel != "." else path.name
    return path.as_posix()


@dataclass(frozen=True, slots=True)
class InputItem:
    """One input listed but not read yet: a file (``path``) or a text given inline (``text``)."""

    source: str
    path: Path | None
    text: str | None
    mtime: float


def iter_inputs(inputs: Inputs, root: Path | None, ignore: tuple[str, ...], max_bytes: int,
                skipped: list[Skipped]) -> Iterator[InputItem]:
    """List every input file or text once, in crawl order, without reading files: the crawl rules
    (hidden, ignore files, symlinks, size limit) apply here, and a source listed twice is yielded
    once. Files passed over by the crawl are recorded in ``skipped``."""
    items: Iterable[str | Path | tuple[str, str]]
    items = [inputs] if isinstance(inputs, (str, Path)) else inputs
    seen: set[str] = set()
    for item in items:
        if isinstance(item, tuple):
            source, text = item
            if source not in seen:
                seen.add(source)
                yield InputItem(source, None, text, time.time())
            continue
        path = Path(item)
        if not path.exists():
            raise IngestError(f"{path} does not exist")
        base = path.resolve() if path.is_dir() else None
        for f in crawl(path, ignore=ignore, max_bytes=max_bytes, skipped=skipped):
            source = _source_name(f.path, root) if (root is not None or base is None) else \
                _source_name(f.path, base)
            if source not in seen:
                seen.add(source)
                yield InputItem(source, f.path, None, f.mtime)


def load(item: InputItem) -> tuple[str, bytes | str, int]:
    """``(sha256, data, size in bytes)`` of an input: the file's bytes, or the inline text.
    Raises OSError when the file cannot be read."""
    if item.text is not None:
        raw = item.text.encode("utf-8")
        return hashlib.sha256(raw).hexdigest(), item.text, len(raw)
    assert item.path is not None
    raw = item.path.read_bytes()
    return hashlib.sha256(raw).hexdigest(), raw, len(raw)


def unreadable(e: OSError) -> str:
    """The skip reason for a file that could not be read."""
    return f"cannot read ({e.strerror})"


def parse(source: str, data: bytes | str, path: Path | None) -> list[Section]:
    """Sections of one document; raises IngestError for unreadable content."""
    if isinstance(data, str):
        p = Path(source)
        reader = reader_for(p)
        if reader is None or reader is read_plain:
            return [Section("", data)] if data.strip() else []
        return reader(data.encode("utf-8"), p)
    assert path is not None
    return read_file(path, data)


def prepare(item: InputItem, stored_id: str | None, chunker: Chunker) -> PreparedDoc | Skipped:
    """Read, hash and chunk one input: the per-document work of an add, wherever it runs (in
    `Index.add`, or on a Ray worker). An input whose hash equals ``stored_id`` is not parsed.
    Returns `Skipped` with the one-line reason when the file cannot be read or parsed."""
    try:
        sha, data, size = load(item)
    except OSError as e:
        return Skipped(item.source, unreadable(e))
    if sha == stored_id:
        return PreparedDoc(item.source, sha, item.mtime, size, [])
    try:
        pieces = chunker.chunk(parse(item.source, data, item.path))
    except IngestError as e:
        return Skipped(item.source, str(e))
    return PreparedDoc(item.source, sha, item.mtime, size, pieces)
