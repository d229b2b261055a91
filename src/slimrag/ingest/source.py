"""Turn what a user hands to `Index.build`/`Index.add` into chunked documents ready to store.

Inputs may be a folder, a file, a list of those, or a list of ``(source, text)`` pairs. Listing
(`iter_inputs`: crawl rules, stored source names, one entry per source) is separate from the
per-document work (`prepare`: read once, so the SHA-256 and the parsed text come from the same
bytes; skip if unchanged; parse; chunk), because distributed ingest lists on the driver and
prepares on Ray workers; both paths call these two functions.

Naming (`source_name`), one rule for every file, wherever it was found: a file inside the
index's indexed folder (``Manifest.source_root``, the folder it was built from) is stored by its
path relative to that folder (``guide/cats.md``); any other file by its absolute path, symlinks
resolved (``/home/me/notes/dogs.md``); an index with no indexed folder (built from files, from
several inputs, or from texts) names every file absolutely. A ``(source, text)`` pair keeps the
name it was given. Why not ``../notes/dogs.md`` for outside files: a file on another drive has no
relative path at all (Windows), one on another mount only a long ``../../..`` chain, a ``..``
after a symlinked folder means another file than the shell's, and when the indexed folder moves
every ``../`` name would point at the wrong file, while an absolute name still names the same one.
Absolute names are also what indexes built before this rule store, so they keep matching. (Before,
a folder added to an index with no indexed folder had its files named relative to that folder:
two folders' ``README.md`` collided and the second was dropped.)

Nothing about one input ends the add: every read, decode, parse or chunking failure of a file or
text becomes a `Skipped` with its reason (`slimrag.ingest.outcome`), which the writer reports as
one warning. Files are read at most ``max_bytes`` (decompressed ``.gz`` too), whether they were
found in a folder or named directly.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slimrag.errors import IngestError
from slimrag.ingest.chunker import Chunker, ChunkText
from slimrag.ingest.crawl import crawl
from slimrag.ingest.outcome import ENCODING, PARSE_ERROR, SkipFile, Skipped
from slimrag.ingest.rawfile import gunzip_bounded, is_gzip, read_bounded
from slimrag.ingest.readers import DEFAULT_MAX_BYTES, Section, read_bytes, read_plain, reader_for

log = logging.getLogger("slimrag.ingest")

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


def source_name(path: str | Path, root: Path | None) -> str:
    """The stored name of the file ``path`` (which need not exist) in an index whose indexed folder
    is ``root`` (resolved; None when it has none): relative to ``root`` when the resolved path lies
    inside it, else absolute (module header). The one naming rule of add, build, sync and watch."""
    resolved = Path(os.path.realpath(path))
    if root is not None and resolved.is_relative_to(root):
        rel = resolved.relative_to(root).as_posix()
        return rel if rel != "." else resolved.name
    return resolved.as_posix()


@dataclass(frozen=True, slots=True)
class InputItem:
    """One input listed but not read yet: a file (``path``) or a text given inline (``text``).
    max_bytes: the read limit of this file (``IndexConfig.max_file_bytes``), decompressed size included."""

    source: str
    path: Path | None
    text: str | None
    mtime: float
    max_bytes: int = DEFAULT_MAX_BYTES


def iter_inputs(inputs: Inputs, root: Path | None, ignore: tuple[str, ...], max_bytes: int,
                skipped: list[Skipped]) -> Iterator[InputItem]:
    """List every input file or text once, in crawl order, named by `source_name` against the
    indexed folder ``root``, without reading files (only the first
    8 KB of a file whose name no reader claims, to see whether it is text): the crawl rules
    (hidden, ignore files, symlinks, file type, size limit) apply here, to files named directly
    too, and a source listed twice is yielded once. Entries passed over by the crawl are recorded
    in ``skipped``. Raises IngestError for an input path that does not exist (a typo, not a bad
    file); a dangling or looping symlink named directly is a skip."""
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
        if not os.path.lexists(path):
            raise IngestError(f"{path} does not exist")
        for f in crawl(path, ignore=ignore, max_bytes=max_bytes, skipped=skipped):
            source = source_name(f.path, root)
            if source not in seen:
                seen.add(source)
                yield InputItem(source, f.path, None, f.mtime, max_bytes)


def load(item: InputItem) -> tuple[str, bytes | str, int]:
    """``(sha256, data, size in bytes)`` of an input: the file's bytes (hashed as stored on disk,
    returned decompressed for ``.gz``), or the inline text. Raises `SkipFile` when the file cannot
    be read, is over its size limit, or the text is not encodable (lone surrogates)."""
    if item.text is not None:
        try:
            raw = item.text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise SkipFile(ENCODING, f"text holds a lone surrogate at {e.start}; not valid Unicode") from e
        return hashlib.sha256(raw).hexdigest(), item.text, len(raw)
    assert item.path is not None
    raw = read_bounded(item.path, item.max_bytes)
    data = gunzip_bounded(raw, item.max_bytes) if is_gzip(item.path.name) else raw
    return hashlib.sha256(raw).hexdigest(), data, len(raw)


def parse(source: str, data: bytes | str, path: Path | None) -> list[Section]:
    """Sections of one document (``data`` as `load` returns it, decompressed); raises `SkipFile`
    (an IngestError) for unreadable content."""
    if isinstance(data, str):
        p = Path(source)
        reader = reader_for(p)
        if reader is None or reader is read_plain:
            return [Section("", data)] if data.strip() else []
        return reader(data.encode("utf-8"), p)
    assert path is not None
    return read_bytes(path, data)


def prepare(item: InputItem, stored_id: str | None, chunker: Chunker) -> PreparedDoc | Skipped:
    """Read, hash and chunk one input: the per-document work of an add, wherever it runs (in
    `Index.add`, or on a Ray worker). An input whose hash equals ``stored_id`` is not parsed.
    Returns `Skipped` with its reason when the input cannot be read, decoded, parsed or chunked:
    never raises for one bad input."""
    try:
        sha, data, size = load(item)
        if sha == stored_id:
            return PreparedDoc(item.source, sha, item.mtime, size, [])
        pieces = chunker.chunk(parse(item.source, data, item.path))
    except SkipFile as e:
        return Skipped(item.source, str(e), e.kind)
    except IngestError as e:
        return Skipped(item.source, str(e))
    # Readers are strategies around third-party parsers and the tokenizer; any exception they
    # raise on one input (a parser bug on hostile bytes, a tokenizer refusing a string) means
    # "this input cannot be indexed", never "stop the build". The traceback goes to the debug log.
    except Exception as e:  # noqa: BLE001
        log.debug("reading %s failed", item.source, exc_info=True)
        return Skipped.because(item.source, PARSE_ERROR, f"{type(e).__name__}: {str(e)[:200]}")
    return PreparedDoc(item.source, sha, item.mtime, size, pieces)
