"""What every reader shares: the `Section` a reader returns, the decoding of text bytes, and
Markdown's heading split (used by the Markdown reader and by the notebook reader, whose markdown
cells are Markdown).

JSON is loaded by `load_json` (JSON, JSON Lines and notebooks): nesting past the C parser's
recursion limit is refused, not a crash, and an integer of more than 640 digits stays a digit
string (Python refuses to convert over 4,300 digits, and the conversion is quadratic below that).

Kept apart from `slimrag.ingest.readers` so the readers of container formats (office, EPUB,
notebook, mail, tables), which the registry in `readers` imports, can use them without an import
cycle.

Decoding: a UTF-16 or UTF-32 byte-order mark first (Windows Notepad's "Unicode" is UTF-16 LE with
its mark), the text decoded by it; then strict UTF-8 (a BOM is honoured), so every UTF-8 file reads
exactly as before; when that fails, the charset the file declares (XML declaration, HTML
``<meta charset>``, ``coding:`` line) is used, so a Latin-1 page that says so is read, not refused.
NUL bytes in the first 8 KB (NUL characters, behind a wide mark) mean binary data: refused rather
than guessed at, which is also where UTF-16 without a mark ends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from slimrag.ingest.outcome import BINARY, ENCODING, PARSE_ERROR, SkipFile
from slimrag.ingest.rawfile import SNIFF_BYTES, bom_codec, declared_charset


@dataclass(frozen=True, slots=True)
class Section:
    """A run of text under one heading (or on one PDF page: ``page`` counts from 1)."""

    heading: str
    text: str
    page: int | None = None


def decode(data: bytes) -> str:
    """UTF-16/32 behind its byte-order mark, else strict UTF-8 (with BOM), else the charset the
    file declares; raises `SkipFile` for binary data (NUL bytes) and for bytes valid in none."""
    wide = bom_codec(data)
    if wide is not None:
        return _decode_wide(data, wide)
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


def _decode_wide(data: bytes, codec: str) -> str:
    """``data`` decoded by the UTF-16/32 ``codec`` its byte-order mark names (the mark dropped)."""
    name = codec.upper()
    try:
        text = data.decode(codec)
    except UnicodeDecodeError as e:
        raise SkipFile(ENCODING, f"starts with a {name} byte-order mark but is not valid {name} "
                                 f"(byte {e.start}); convert it to UTF-8 to include it") from e
    if "\x00" in text[:SNIFF_BYTES]:
        raise SkipFile(BINARY, f"NUL characters in the first {SNIFF_BYTES // 1024} K characters of {name} text")
    return text


def md_heading(line: str) -> str | None:
    """The text of an ATX heading line (``## Title ##`` → ``Title``), or None when the line is not
    one: 1 to 6 ``#`` at column 0, whitespace, then the title; closing ``#`` and whitespace are
    dropped. Same result as the pattern ``^(#{1,6})\\s+(.*?)\\s*#*\\s*$``, in linear time."""
    level = len(line) - len(line.lstrip("#"))
    if not 1 <= level <= 6 or len(line) == level or not line[level].isspace():
        return None
    return line[level:].strip().rstrip("#").rstrip()


def markdown_sections(text: str, heading: str = "") -> list[Section]:
    """Markdown split at ``#`` headings (outside fenced code blocks); text before the first
    heading goes under ``heading``."""
    sections: list[Section] = []
    buf: list[str] = []
    fenced = False
    for line in text.splitlines():
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


#: integers longer than this stay digit strings (see the module header)
_MAX_INT_DIGITS = 640


def _parse_int(digits: str) -> int | str:
    return int(digits) if len(digits) <= _MAX_INT_DIGITS else digits


def load_json(text: str, line: int | None = None) -> object:
    """`json.loads` with a `SkipFile` for invalid JSON (at ``line`` of a JSON Lines file, when
    given) and for nesting past the recursion limit; a 100,001-digit number is kept as its digits
    (it prints the same)."""
    try:
        return json.loads(text, parse_int=_parse_int)
    except json.JSONDecodeError as e:
        where = f"at line {e.lineno}" if line is None else f"on line {line}"
        # json's own messages end with " at" ("Unterminated string starting at") where it appends
        # the position; finish the sentence with the column
        at = "" if e.msg.endswith(" at") else " at"
        raise SkipFile(PARSE_ERROR, f"invalid JSON {where}: {e.msg}{at} column {e.colno}") from e
    except RecursionError as e:
        raise SkipFile(PARSE_ERROR, "JSON nested too deeply to read") from e
