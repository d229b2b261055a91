"""Turn what a user hands to `Index.build`/`Index.add` into documents ready to chunk.

Inputs may be a folder, a file, a list of those, or a list of ``(source, text)`` pairs. Each
becomes a `SourceDoc` carrying its bytes and content hash; reading happens here, once, so the hash
and the parsed text always come from the same bytes.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from slimrag.errors import IngestError
from slimrag.ingest.crawl import Skipped, crawl
from slimrag.ingest.readers import Section, read_file, read_plain, reader_for

log = logging.getLogger("slimrag.ingest")

Inputs = str | Path | Iterable[str | Path | tuple[str, str]]


@dataclass(frozen=True, slots=True)
class SourceDoc:
    """A document's identity and its sections. ``doc_id`` is the SHA-256 of its bytes."""

    source: str
    doc_id: str
    mtime: float
    size: int
    sections: list[Section]


def _source_name(path: Path, root: Path | None) -> str:
    """Stored source name: relative to the index's source root when inside it, else absolute."""
    path = path.resolve()
    if root is not None and path.is_relative_to(root):
        rel = path.relative_to(root).as_posix()
        return rel if rel != "." else path.name
    return path.as_posix()


def iter_source_docs(inputs: Inputs, root: Path | None, ignore: tuple[str, ...], max_bytes: int,
                     skipped: list[Skipped]) -> Iterator[tuple[str, str, float, int, bytes | str, Path | None]]:
    """Yield raw ``(source, sha256, mtime, size, data, path)`` for every input file or text,
    without parsing; files that cannot be read are logged and recorded in ``skipped``."""
    items: Iterable[str | Path | tuple[str, str]]
    items = [inputs] if isinstance(inputs, (str, Path)) else inputs
    for item in items:
        if isinstance(item, tuple):
            source, text = item
            data = text.encode("utf-8")
            yield source, hashlib.sha256(data).hexdigest(), time.time(), len(data), text, None
            continue
        path = Path(item)
        if not path.exists():
            raise IngestError(f"{path} does not exist")
        base = path.resolve() if path.is_dir() else None
        for f in crawl(path, ignore=ignore, max_bytes=max_bytes, skipped=skipped):
            source = _source_name(f.path, root) if (root is not None or base is None) else \
                _source_name(f.path, base)
            try:
                raw = f.path.read_bytes()
            except OSError as e:
                log.warning("skipped %s: cannot read (%s)", source, e.strerror)
                skipped.append(Skipped(source, f"cannot read ({e.strerror})"))
                continue
            yield source, hashlib.sha256(raw).hexdigest(), f.mtime, len(raw), raw, f.path


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
