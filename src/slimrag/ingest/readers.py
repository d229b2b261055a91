"""Readers turn one file into text sections, one reader per file kind, chosen by suffix.

A reader returns a list of `Section` (heading, text, page): headings come from Markdown ``#`` lines,
reStructuredText underlines, HTML ``<h1>..<h6>``, and PDF pages; the chunker keeps them as
metadata so an answer can cite "file.md › Install" rather than a byte offset.

Every failure a user's folder can contain (binary data, invalid UTF-8, a corrupt PDF, an empty
file) raises `IngestError` with a one-line reason (without the path: the caller names the file);
the index turns that into one warning and goes on. pypdf's own log lines are silenced below
ERROR so that a corrupt PDF gives exactly one warning, ours. Readers are looked up in `READERS` (suffix → function), so adding a format is one entry.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from slimrag.errors import IngestError

logging.getLogger("pypdf").setLevel(logging.ERROR)


@dataclass(frozen=True, slots=True)
class Section:
    """A run of text under one heading (or on one PDF page)."""

    heading: str
    text: str
    page: int | None = None


def _decode(data: bytes, path: Path) -> str:
    """Strict UTF-8 (with BOM) decoding; binary data is refused rather than guessed at."""
    if b"\x00" in data[:8192]:
        raise IngestError("looks binary (NUL bytes); skipped")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise IngestError(f"not valid UTF-8 (byte {e.start}); convert it to UTF-8 to include it") from e


def read_plain(data: bytes, path: Path) -> list[Section]:
    """Plain text and source code: one section, headed by the file name."""
    return [Section("", _decode(data, path))]


_MD_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def read_markdown(data: bytes, path: Path) -> list[Section]:
    """Markdown: split at ``#`` headings (outside fenced code blocks)."""
    sections: list[Section] = []
    heading, buf, fenced = "", [], False
    for line in _decode(data, path).splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        m = None if fenced else _MD_HEADING.match(line)
        if m:
            if "".join(buf).strip():
                sections.append(Section(heading, "\n".join(buf)))
            heading, buf = m.group(2), [line]
        else:
            buf.append(line)
    if "".join(buf).strip():
        sections.append(Section(heading, "\n".join(buf)))
    return sections


_RST_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+])\1{2,}\s*$")


def read_rst(data: bytes, path: Path) -> list[Section]:
    """reStructuredText: a line followed by an underline of punctuation starts a section."""
    lines = _decode(data, path).splitlines()
    sections: list[Section] = []
    heading, buf = "", []
    i = 0
    while i < len(lines):
        line = lines[i]
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if line.strip() and _RST_UNDERLINE.match(nxt) and len(nxt.strip()) >= len(line.strip()):
            if "".join(buf).strip():
                sections.append(Section(heading, "\n".join(buf)))
            heading, buf = line.strip(), [line]
            i += 2
            continue
        if not _RST_UNDERLINE.match(line):
            buf.append(line)
        i += 1
    if "".join(buf).strip():
        sections.append(Section(heading, "\n".join(buf)))
    return sections


class _HTMLText(HTMLParser):
    """Collects visible text, split at h1-h6; drops script/style."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.sections: list[Section] = []
        self.heading = ""
        self.buf: list[str] = []
        self.skip = 0
        self.in_heading = False
        self.head_buf: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style", "noscript"):
            self.skip += 1
        elif tag in ("h1", "h2", "h3", "h4", "h5", "h6"):
            self.flush()
            self.in_heading, self.head_buf = True, []
        elif tag in ("p", "br", "div", "li", "tr", "pre"):
            self.buf.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style", "noscript"):
            self.skip = max(0, self.skip - 1)
        elif tag in ("h1", "h2", "h3", "h4", "h5", "h6") and self.in_heading:
            self.in_heading = False
            self.heading = " ".join("".join(self.head_buf).split())
            self.buf.append(self.heading + "\n")

    def handle_data(self, data: str) -> None:
        if self.skip:
            return
        (self.head_buf if self.in_heading else self.buf).append(data)

    def flush(self) -> None:
        text = re.sub(r"\n\s*\n+", "\n\n", "".join(self.buf)).strip()
        if text:
            self.sections.append(Section(self.heading, text))
        self.buf = []


def read_html(data: bytes, path: Path) -> list[Section]:
    """HTML: visible text split at heading tags."""
    parser = _HTMLText()
    parser.feed(_decode(data, path))
    parser.close()
    parser.flush()
    return parser.sections


def read_pdf(data: bytes, path: Path) -> list[Section]:
    """PDF via pypdf: one section per page with text. Encrypted or corrupt files raise IngestError."""
    import io

    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise IngestError("PDF is encrypted; decrypt it to include it")
        sections = [
            Section(f"page {i + 1}", text, page=i + 1)
            for i, page in enumerate(reader.pages)
            if (text := (page.extract_text() or "")).strip()
        ]
    except (PdfReadError, ValueError, KeyError, TypeError, OSError) as e:
        raise IngestError(f"corrupt or unreadable PDF ({type(e).__name__}: {e})") from e
    if not sections:
        raise IngestError("PDF has no extractable text (scanned images?); skipped")
    return sections


def read_json(data: bytes, path: Path) -> list[Section]:
    """JSON: strings are collected with their key path as heading, so records stay searchable."""
    try:
        obj = json.loads(_decode(data, path))
    except json.JSONDecodeError as e:
        raise IngestError(f"invalid JSON at line {e.lineno}: {e.msg}") from e
    return _json_sections(obj)


def read_jsonl(data: bytes, path: Path) -> list[Section]:
    """JSON Lines: one section per record; bad lines raise (a half-read file would mislead)."""
    sections: list[Section] = []
    for n, line in enumerate(_decode(data, path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise IngestError(f"invalid JSON on line {n}: {e.msg}") from e
        text = "\n".join(s.text for s in _json_sections(obj))
        if text.strip():
            sections.append(Section(f"line {n}", text))
    return sections


def _json_sections(obj: object) -> list[Section]:
    lines: list[str] = []

    def walk(o: object, key: str) -> None:
        if isinstance(o, dict):
            for k, v in o.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(o, list):
            for i, v in enumerate(o):
                walk(v, f"{key}[{i}]")
        elif isinstance(o, str) and o.strip():
            lines.append(f"{key}: {o}" if key else o)
        elif isinstance(o, (int, float, bool)) and key:
            lines.append(f"{key}: {o}")

    walk(obj, "")
    return [Section("", "\n".join(lines))] if lines else []


Reader = Callable[[bytes, Path], list[Section]]

CODE_SUFFIXES = (
    ".py .pyi .js .jsx .ts .tsx .c .h .cc .cpp .hpp .cs .go .rs .java .kt .scala .rb .php .swift .m "
    ".sh .bash .zsh .sql .r .jl .lua .pl .hs .ml .ex .exs .erl .clj .toml .yaml .yml .ini .cfg .conf "
    ".css .scss .vue .svelte .tex .bib .csv .tsv .xml .proto .cmake .mk .dockerfile .gradle"
).split()

#: suffix → reader. Files with other suffixes are not read (binary formats, archives, images).
READERS: dict[str, Reader] = {
    ".txt": read_plain,
    ".text": read_plain,
    ".log": read_plain,
    ".md": read_markdown,
    ".markdown": read_markdown,
    ".rst": read_rst,
    ".html": read_html,
    ".htm": read_html,
    ".pdf": read_pdf,
    ".json": read_json,
    ".jsonl": read_jsonl,
    ".ndjson": read_jsonl,
    **{s: read_plain for s in CODE_SUFFIXES},
}

#: file names without a suffix that are still text
PLAIN_NAMES = {"README", "LICENSE", "Makefile", "Dockerfile", "CHANGELOG", "NOTICE", "AUTHORS"}


def reader_for(path: Path) -> Reader | None:
    """The reader for a path, or None when slimrag does not read this kind of file."""
    if path.name in PLAIN_NAMES:
        return read_plain
    return READERS.get(path.suffix.lower())


def read_file(path: Path, data: bytes | None = None) -> list[Section]:
    """Read a file into sections; raises IngestError for unsupported, binary or corrupt files."""
    reader = reader_for(path)
    if reader is None:
        raise IngestError(f"unsupported file type {path.suffix!r}")
    if data is None:
        data = path.read_bytes()
    sections = reader(data, path)
    if not any(s.text.strip() for s in sections):
        raise IngestError("no text")
    return sections
