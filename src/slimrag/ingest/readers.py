"""Readers turn one file into text sections, one reader per file kind, chosen by suffix.

A reader returns a list of `Section` (heading, text, page): headings come from Markdown ``#`` lines,
reStructuredText underlines, HTML ``<h1>..<h6>``, PDF pages, Word headings, slides, e-mail
subjects and table row ranges; the chunker keeps them as metadata so an answer can cite
"file.md › Install" rather than a byte offset, and a PDF's page number travels with its chunks.

The text formats are read here; each container format has its own module, registered below:
`slimrag.ingest.office` (docx, pptx), `slimrag.ingest.epub`, `slimrag.ingest.notebook` (ipynb),
`slimrag.ingest.mail` (eml, mbox), `slimrag.ingest.tables` (csv, tsv). Their parsing libraries
(pypdf, python-docx, python-pptx) are imported inside the reader, on first use.

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

Decoding (`slimrag.ingest.text.decode`): strict UTF-8 first (a BOM is honoured); when that fails,
the charset the file declares (XML declaration, HTML ``<meta charset>``, ``coding:`` line), so a
Latin-1 page that says so is read, not refused. Zip-based formats are not decoded: their NUL bytes
are no sign of binary data, and the name alone picks their reader.

Linear time: every reader is linear in the input. Markdown headings and reStructuredText
underlines are recognised with string methods, not regexes (a backtracking heading pattern took
55 s on a 2 KB line of spaces). HTML goes through `slimrag.ingest.mainhtml` (the page's main
content, its navigation, sidebars and footers left out) and `slimrag.ingest.html`, which defuses
the markup CPython's `HTMLParser` would be quadratic on.
JSON nesting is bounded by the C parser's recursion limit (refused, not a crash), and its walk is
iterative.

Bounded output (`slimrag.ingest.bounds`): `read_bytes` checks every reader's sections against
its multiple of the input in `EXPANSION` (4 for the text formats, 16 for JSON, 32 for tables,
100 for the compressed containers), and a file over it is skipped as ``too large``. JSON key
paths are cut to their last `KEY_PATH_CHARS` characters, and the JSON walk counts what it writes
as it goes, so a hostile file stops one leaf past its bound.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from slimrag.ingest.bounds import (
    JSON_EXPANSION,
    KEY_PATH_CHARS,
    PACKED_EXPANSION,
    TABLE_EXPANSION,
    TEXT_EXPANSION,
    Budget,
    check_output,
    tail_of,
)
from slimrag.ingest.epub import read_epub
from slimrag.ingest.mail import read_eml, read_mbox
from slimrag.ingest.mainhtml import main_sections
from slimrag.ingest.notebook import read_notebook
from slimrag.ingest.office import read_docx, read_pptx
from slimrag.ingest.outcome import EMPTY, PARSE_ERROR, UNREADABLE, UNSUPPORTED, SkipFile
from slimrag.ingest.rawfile import (
    SNIFF_BYTES,
    gunzip_bounded,
    inner_name,
    is_gzip,
    looks_like_text,
    read_bounded,
)
from slimrag.ingest.tables import read_table
from slimrag.ingest.text import Section, decode, load_json, markdown_sections
from slimrag.ingest.text import md_heading as md_heading  # re-exported: the hostile-input tests use it

logging.getLogger("pypdf").setLevel(logging.ERROR)

#: the read limit of `read_file` when called without one (`IndexConfig.max_file_bytes`' default)
DEFAULT_MAX_BYTES = 20 * 1024 * 1024


def read_plain(data: bytes, path: Path) -> list[Section]:
    """Plain text and source code: one section, headed by the file name."""
    return [Section("", decode(data))]


def read_markdown(data: bytes, path: Path) -> list[Section]:
    """Markdown: split at ``#`` headings (outside fenced code blocks)."""
    return markdown_sections(decode(data))


_RST_PUNCT = frozenset("=-~^\"'`#*+")


def rst_underline(line: str) -> bool:
    """True for a reStructuredText underline: 3 or more of one punctuation character from column 0,
    then only whitespace (the pattern ``^([=\\-~^"'`#*+])\\1{2,}\\s*$``, in linear time)."""
    s = line.rstrip()
    return len(s) >= 3 and s[0] in _RST_PUNCT and s.count(s[0]) == len(s)


def read_rst(data: bytes, path: Path) -> list[Section]:
    """reStructuredText: a line followed by an underline of punctuation starts a section."""
    lines = decode(data).splitlines()
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
    """HTML: the page's main content, without navigation, sidebars or footers, split at heading
    tags (`slimrag.ingest.mainhtml`)."""
    return main_sections(decode(data))


def read_pdf(data: bytes, path: Path) -> list[Section]:
    """PDF via pypdf: one section per page with text, counted against `PACKED_EXPANSION` times the
    file as pages are read. Encrypted, corrupt or over-expanding files raise `SkipFile`."""
    import io

    from pypdf import PdfReader

    budget = Budget("PDF", len(data), PACKED_EXPANSION)  # Flate streams: pypdf inflates each to 75 MB at most
    sections: list[Section] = []
    try:
        reader = PdfReader(io.BytesIO(data))
        encrypted = reader.is_encrypted
        for i, page in enumerate([] if encrypted else reader.pages):
            text = page.extract_text() or ""
            budget.take(len(text))
            if text.strip():
                sections.append(Section(f"page {i + 1}", text, page=i + 1))
    except SkipFile:
        raise
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


def read_json(data: bytes, path: Path) -> list[Section]:
    """JSON: strings are collected with their key path as heading, so records stay searchable."""
    return _json_sections(load_json(decode(data)), Budget("JSON", len(data), JSON_EXPANSION))


def read_jsonl(data: bytes, path: Path) -> list[Section]:
    """JSON Lines: one section per record; bad lines raise (a half-read file would mislead)."""
    sections: list[Section] = []
    budget = Budget("JSON Lines", len(data), JSON_EXPANSION)
    for n, line in enumerate(decode(data).splitlines(), 1):
        if not line.strip():
            continue
        obj = load_json(line, n)
        text = "\n".join(s.text for s in _json_sections(obj, budget))
        if text.strip():
            sections.append(Section(f"line {n}", text))
    return sections


def _json_sections(obj: object, budget: Budget) -> list[Section]:
    """One section of ``key.path[i]: value`` lines, in document order. The walk keeps its own
    stack of iterators, so any depth the parser accepted is walked without recursion, and a
    container's children get their key paths one at a time (a list of a million leaves holds one
    pending path, not a million). A key path keeps its last `KEY_PATH_CHARS` characters (a key is
    cut before it is joined, so no longer path is ever built), and each line is counted against
    ``budget``."""
    lines: list[str] = []
    stack: list[Iterator[tuple[object, str]]] = [iter([(obj, "")])]
    while stack:
        item = next(stack[-1], None)
        if item is None:
            stack.pop()
            continue
        o, key = item
        if isinstance(o, (dict, list)):
            stack.append(_children(o, key))
        elif isinstance(o, str) and o.strip():
            lines.append(f"{key}: {o}" if key else o)
            budget.take(len(lines[-1]) + 1)
        elif isinstance(o, (int, float, bool)) and key:
            lines.append(f"{key}: {o}")
            budget.take(len(lines[-1]) + 1)
    return [Section("", "\n".join(lines))] if lines else []


def _children(o: dict[Any, Any] | list[Any], key: str) -> Iterator[tuple[object, str]]:
    """The children of a JSON object or array with their key paths, made as they are asked for."""
    if isinstance(o, dict):
        sep = "." if key else ""
        for k, v in o.items():
            yield v, _child(key, sep, str(k))
    else:
        for i, v in enumerate(o):
            yield v, _child(key, "", f"[{i}]")


def _child(key: str, sep: str, part: str) -> str:
    """The key path of a child: ``key`` + ``sep`` + ``part``, cut to its last `KEY_PATH_CHARS`."""
    return tail_of(key + sep + tail_of(part, KEY_PATH_CHARS), KEY_PATH_CHARS)


Reader = Callable[[bytes, Path], list[Section]]

CODE_SUFFIXES = (
    ".py .pyi .js .jsx .ts .tsx .c .h .cc .cpp .hpp .cs .go .rs .java .kt .scala .rb .php .swift .m "
    ".sh .bash .zsh .sql .r .jl .lua .pl .hs .ml .ex .exs .erl .clj .toml .yaml .yml .ini .cfg .conf "
    ".css .scss .vue .svelte .tex .bib .xml .proto .cmake .mk .dockerfile .gradle"
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
    ".ipynb": read_notebook,
    ".jsonl": read_jsonl,
    ".ndjson": read_jsonl,
    ".docx": read_docx,
    ".pptx": read_pptx,
    ".epub": read_epub,
    ".eml": read_eml,
    ".mbox": read_mbox,
    ".csv": read_table,
    ".tsv": read_table,
    **{s: read_plain for s in CODE_SUFFIXES},
}

#: reader → the multiple of its input its sections may cost (`slimrag.ingest.bounds`); a reader
#: not listed gets `TEXT_EXPANSION`
EXPANSION: dict[Reader, int] = {
    read_json: JSON_EXPANSION,
    read_jsonl: JSON_EXPANSION,
    read_notebook: JSON_EXPANSION,
    read_table: TABLE_EXPANSION,
    read_docx: PACKED_EXPANSION,
    read_pptx: PACKED_EXPANSION,
    read_epub: PACKED_EXPANSION,
    read_pdf: PACKED_EXPANSION,
}

#: suffixes of formats slimrag cannot read (images, archives, other office files, media, compiled code):
#: refused by name, without opening the file
BINARY_SUFFIXES = frozenset((
    ".png .jpg .jpeg .gif .bmp .tif .tiff .ico .webp .svgz .psd .heic .mp3 .mp4 .m4a .ogg .oga .wav "
    ".flac .avi .mov .mkv .webm .zip .tar .tgz .bz2 .xz .zst .7z .rar .jar .war .whl .egg .deb .rpm "
    ".xlsx .odt .ods .odp .doc .xls .ppt .so .dylib .dll .exe .o .a .pyc .pyo .class "
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
    check_output(sections, len(data), EXPANSION.get(reader, TEXT_EXPANSION))
    return sections


def read_file(path: Path, data: bytes | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> list[Section]:
    """Read a file into sections: at most ``max_bytes`` (decompressed for ``.gz``; ``data``, when
    given, is the file's raw bytes). Raises `SkipFile` for unsupported, binary or corrupt files."""
    if data is None:
        data = read_bounded(path, max_bytes)
    if is_gzip(path.name):
        data = gunzip_bounded(data, max_bytes)
    return read_bytes(path, data)
