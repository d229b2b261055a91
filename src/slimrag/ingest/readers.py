"""Readers turn one file into text sections, one reader per file kind, chosen by suffix.

A reader returns a list of `Section` (heading, text, page): headings come from Markdown ``#`` lines,
reStructuredText underlines, HTML ``<h1>..<h6>``, and PDF pages; the chunker keeps them as
metadata so an answer can cite "file.md › Install" rather than a byte offset.

Every failure a user's folder can contain (binary data, invalid UTF-8, a corrupt PDF, JSON nested
100,000 deep, an empty file) raises `SkipFile` (an `IngestError`) with its reason from
`slimrag.ingest.outcome` and a one-line detail (without the path: the caller names the file);
the index turns that into one warning and goes on. pypdf's own log lines are silenced below
ERROR so that a corrupt PDF gives exactly one warning, ours.

Choosing a reader (`reader_for_data`): by the file name (``.gz`` stripped), through `READERS`
(suffix → function, so adding a format is one entry) and `PLAIN_NAMES` (suffix-less text such as
``README`` or Debian's ``copyright``); a name slimrag does not know is read as plain text when its
first bytes look like text (`slimrag.ingest.rawfile.looks_like_text`), else it is an unsupported
type. `BINARY_SUFFIXES` are refused by name alone, without opening the file.

Decoding: strict UTF-8 first (a BOM is honoured), so every UTF-8 file reads exactly as before;
when that fails, the charset the file declares (XML declaration, HTML ``<meta charset>``,
``coding:`` line) is used, so a Latin-1 page that says so is read, not refused.

Linear time: every reader is linear in the input. Markdown headings and reStructuredText
underlines are recognised with string methods, not regexes (a backtracking heading pattern took
55 s on a 2 KB line of spaces). HTML goes through `slimrag.ingest.html`, which
defuses the markup CPython's `HTMLParser` would be quadratic on.
JSON nesting is bounded by the C parser's recursion limit (refused, not a crash), and its walk is
iterative.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from slimrag.ingest.html import html_sections
from slimrag.ingest.outcome import BINARY, EMPTY, ENCODING, PARSE_ERROR, UNREADABLE, UNSUPPORTED, SkipFile
from slimrag.ingest.rawfile import (
    SNIFF_BYTES,
    declared_charset,
    gunzip_bounded,
    inner_name,
    is_gzip,
    looks_like_text,
    read_bounded,
)

logging.getLogger("pypdf").setLevel(logging.ERROR)

#: the read limit of `read_file` when called without one (`IndexConfig.max_file_bytes`' default)
DEFAULT_MAX_BYTES = 20 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Section:
    """A run of text under one heading (or on one PDF page)."""

    heading: str
    text: str
    page: int | None = None


def _decode(data: bytes, path: Path) -> str:
    """Strict UTF-8 (with BOM), else the charset the file declares; binary data is refused rather
    than guessed at."""
    if b"\x00" in data[:SNIFF_BYTES]:
        raise SkipFile(BINARY, f"NUL bytes in the first {SNIFF_BYTES // 1024} KB")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        charset = declared_charset(data)
        if charset is None:
            raise SkipFile(ENCODING, f"not valid UTF-8 (byte {e.start}) and no charset declared; "
                                     "convert it to UTF-8 to include it") from e
        try:
            return data.decode(charset)
        except UnicodeDecodeError as e2:
            raise SkipFile(ENCODING, f"not valid UTF-8, nor {charset} as declared (byte {e2.start})") from e2


def read_plain(data: bytes, path: Path) -> list[Section]:
    """Plain text and source code: one section, headed by the file name."""
    return [Section("", _decode(data, path))]


def md_heading(line: str) -> str | None:
    """The text of an ATX heading line (``## Title ##`` → ``Title``), or None when the line is not
    one: 1 to 6 ``#`` at column 0, whitespace, then the title; closing ``#`` and whitespace are
    dropped. Same result as the pattern ``^(#{1,6})\\s+(.*?)\\s*#*\\s*$``, in linear time."""
    level = len(line) - len(line.lstrip("#"))
    if not 1 <= level <= 6 or len(line) == level or not line[level].isspace():
        return None
    return line[level:].strip().rstrip("#").rstrip()


def read_markdown(data: bytes, path: Path) -> list[Section]:
    """Markdown: split at ``#`` headings (outside fenced code blocks)."""
    sections: list[Section] = []
    heading, buf, fenced = "", [], False
    for line in _decode(data, path).splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        title = None if fenced else md_heading(line)
        if title is not None:
            if "".join(buf).strip():
                sections.append(Section(heading, "\n".join(buf)))
            heading, buf = title, [line]
        else:
            buf.append(line)
    if "".join(buf).strip():
        sections.append(Section(heading, "\n".join(buf)))
    return sections


_RST_PUNCT = frozenset("=-~^\"'`#*+")


def rst_underline(line: str) -> bool:
    """True for a reStructuredText underline: 3 or more of one punctuation character from column 0,
    then only whitespace (the pattern ``^([=\\-~^"'`#*+])\\1{2,}\\s*$``, in linear time)."""
    s = line.rstrip()
    return len(s) >= 3 and s[0] in _RST_PUNCT and s.count(s[0]) == len(s)


def read_rst(data: bytes, path: Path) -> list[Section]:
    """reStructuredText: a line followed by an underline of punctuation starts a section."""
    lines = _decode(data, path).splitlines()
    sections: list[Section] = []
    heading, buf = "", []
    i = 0
    while i < len(lines):
        line = lines[i]
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if line.strip() and rst_underline(nxt) and len(nxt.strip()) >= len(line.strip()):
            if "".join(buf).strip():
                sections.append(Section(heading, "\n".join(buf)))
            heading, buf = line.strip(), [line]
            i += 2
            continue
        if not rst_underline(line):
            buf.append(line)
        i += 1
    if "".join(buf).strip():
        sections.append(Section(heading, "\n".join(buf)))
    return sections


def read_html(data: bytes, path: Path) -> list[Section]:
    """HTML: visible text split at heading tags (`slimrag.ingest.html`)."""
    try:
        return [Section(h, t) for h, t in html_sections(_decode(data, path))]
    except AssertionError as e:  # _markupbase asserts on an unknown marked section ("<![foo[")
        raise SkipFile(PARSE_ERROR, f"malformed HTML ({e})") from e


def read_pdf(data: bytes, path: Path) -> list[Section]:
    """PDF via pypdf: one section per page with text. Encrypted or corrupt files raise `SkipFile`."""
    import io

    from pypdf import PdfReader

    try:
        reader = PdfReader(io.BytesIO(data))
        encrypted = reader.is_encrypted
        sections = [] if encrypted else [
            Section(f"page {i + 1}", text, page=i + 1)
            for i, page in enumerate(reader.pages)
            if (text := (page.extract_text() or "")).strip()
        ]
    # pypdf on a malformed file raises far more than PdfReadError: RecursionError on a content
    # stream nested 20,000 deep, AttributeError, IndexError, AssertionError, ZeroDivisionError...
    # Every one of them means "this PDF cannot be read"; none may end the build.
    except Exception as e:  # noqa: BLE001
        raise SkipFile(PARSE_ERROR, f"corrupt or unreadable PDF ({type(e).__name__}: {str(e)[:200]})") from e
    if encrypted:
        raise SkipFile(UNREADABLE, "PDF is encrypted; decrypt it to include it")
    if not sections:
        raise SkipFile(EMPTY, "PDF has no extractable text (scanned images?)")
    return sections


#: integers longer than this stay digit strings (Python refuses to convert over 4,300 digits, and
#: the conversion is quadratic below that limit)
_MAX_INT_DIGITS = 640


def _parse_int(digits: str) -> int | str:
    return int(digits) if len(digits) <= _MAX_INT_DIGITS else digits


def _json_loads(text: str, line: int | None = None) -> object:
    """`json.loads` with a refusal, not a crash, for nesting past the recursion limit; a
    100,001-digit number is kept as its digits (it prints the same)."""
    try:
        return json.loads(text, parse_int=_parse_int)
    except json.JSONDecodeError as e:
        where = f"at line {e.lineno}" if line is None else f"on line {line}"
        raise SkipFile(PARSE_ERROR, f"invalid JSON {where}: {e.msg}") from e
    except RecursionError as e:
        raise SkipFile(PARSE_ERROR, "JSON nested too deeply to read") from e


def read_json(data: bytes, path: Path) -> list[Section]:
    """JSON: strings are collected with their key path as heading, so records stay searchable."""
    return _json_sections(_json_loads(_decode(data, path)))


def read_jsonl(data: bytes, path: Path) -> list[Section]:
    """JSON Lines: one section per record; bad lines raise (a half-read file would mislead)."""
    sections: list[Section] = []
    for n, line in enumerate(_decode(data, path).splitlines(), 1):
        if not line.strip():
            continue
        obj = _json_loads(line, n)
        text = "\n".join(s.text for s in _json_sections(obj))
        if text.strip():
            sections.append(Section(f"line {n}", text))
    return sections


def _json_sections(obj: object) -> list[Section]:
    """One section of ``key.path[i]: value`` lines, in document order. The walk keeps its own
    stack, so any depth the parser accepted is walked without recursion."""
    lines: list[str] = []
    stack: list[tuple[object, str]] = [(obj, "")]
    while stack:
        o, key = stack.pop()
        if isinstance(o, dict):
            stack.extend(reversed([(v, f"{key}.{k}" if key else str(k)) for k, v in o.items()]))
        elif isinstance(o, list):
            stack.extend(reversed([(v, f"{key}[{i}]") for i, v in enumerate(o)]))
        elif isinstance(o, str) and o.strip():
            lines.append(f"{key}: {o}" if key else o)
        elif isinstance(o, (int, float, bool)) and key:
            lines.append(f"{key}: {o}")
    return [Section("", "\n".join(lines))] if lines else []


Reader = Callable[[bytes, Path], list[Section]]

CODE_SUFFIXES = (
    ".py .pyi .js .jsx .ts .tsx .c .h .cc .cpp .hpp .cs .go .rs .java .kt .scala .rb .php .swift .m "
    ".sh .bash .zsh .sql .r .jl .lua .pl .hs .ml .ex .exs .erl .clj .toml .yaml .yml .ini .cfg .conf "
    ".css .scss .vue .svelte .tex .bib .csv .tsv .xml .proto .cmake .mk .dockerfile .gradle"
).split()

#: suffix → reader. Other suffixes are read as plain text when their content looks like text.
READERS: dict[str, Reader] = {
    ".txt": read_plain,
    ".text": read_plain,
    ".log": read_plain,
    ".md": read_markdown,
    ".markdown": read_markdown,
    ".rst": read_rst,
    ".html": read_html,
    ".htm": read_html,
    ".xhtml": read_html,
    ".pdf": read_pdf,
    ".json": read_json,
    ".ipynb": read_json,
    ".jsonl": read_jsonl,
    ".ndjson": read_jsonl,
    **{s: read_plain for s in CODE_SUFFIXES},
}

#: suffixes of formats slimrag cannot read (images, archives, office zips, media, compiled code):
#: refused by name, without opening the file
BINARY_SUFFIXES = frozenset((
    ".png .jpg .jpeg .gif .bmp .tif .tiff .ico .webp .svgz .psd .heic .mp3 .mp4 .m4a .ogg .oga .wav "
    ".flac .avi .mov .mkv .webm .zip .tar .tgz .bz2 .xz .zst .7z .rar .jar .war .whl .egg .deb .rpm "
    ".docx .xlsx .pptx .odt .ods .odp .epub .doc .xls .ppt .so .dylib .dll .exe .o .a .pyc .pyo .class "
    ".bin .dat .db .sqlite .sqlite3 .npy .npz .pkl .pt .safetensors .gguf .onnx .parquet .arrow .woff "
    ".woff2 .ttf .otf .eot .mo .gmo .iso .img .dmg"
).split())

#: file names without a suffix that are text (lower case; compared lower-cased)
PLAIN_NAMES = frozenset((
    "readme license licence copying copyright notice authors contributors credits thanks changelog "
    "changes news history todo install makefile gnumakefile dockerfile containerfile vagrantfile "
    "gemfile rakefile procfile brewfile jenkinsfile"
).split())


def _by_name(name: str) -> Reader | None:
    name = inner_name(name)
    if name.lower() in PLAIN_NAMES:
        return read_plain
    return READERS.get(Path(name).suffix.lower())


def refused_by_name(path: Path) -> bool:
    """True for a file slimrag never reads, judged by its name alone (`BINARY_SUFFIXES`)."""
    return Path(inner_name(path.name)).suffix.lower() in BINARY_SUFFIXES


def reader_for(path: Path) -> Reader | None:
    """The reader a name alone selects (``.gz`` stripped), or None when the content must decide
    (see `reader_for_data`)."""
    return _by_name(path.name)


def reader_for_data(path: Path, head: bytes) -> Reader | None:
    """The reader for a file whose (decompressed) content starts with ``head``: by name, else plain
    text when ``head`` looks like text, else None (an unsupported type)."""
    reader = _by_name(path.name)
    if reader is None and not refused_by_name(path) and looks_like_text(head):
        return read_plain
    return reader


def read_bytes(path: Path, data: bytes) -> list[Section]:
    """The sections of a file's decompressed bytes, the reader chosen by ``path``'s name and the
    content; raises `SkipFile` for an unsupported, binary, corrupt or empty file."""
    reader = reader_for_data(path, data[:SNIFF_BYTES])
    if reader is None:
        suffix = Path(inner_name(path.name)).suffix
        raise SkipFile(UNSUPPORTED, f"no reader for {suffix!r} files" if suffix else "no reader, and not text")
    sections = reader(data, path)
    if not any(s.text.strip() for s in sections):
        raise SkipFile(EMPTY)
    return sections


def read_file(path: Path, data: bytes | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> list[Section]:
    """Read a file into sections: at most ``max_bytes`` (decompressed for ``.gz``; ``data``, when
    given, is the file's raw bytes). Raises `SkipFile` for unsupported, binary or corrupt files."""
    if data is None:
        data = read_bounded(path, max_bytes)
    if is_gzip(path.name):
        data = gunzip_bounded(data, max_bytes)
    return read_bytes(path, data)
