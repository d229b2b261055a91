"""What one file may cost: every reader's output is bounded by a stated multiple of its input, and
the metadata copied into every chunk is bounded by a length.

Why: a reader that writes something for each small piece of its input can turn a few megabytes
into gigabytes. Three shapes did (issue 27): a JSON leaf carried its whole key path (a path 1 MB
long over a million one-byte leaves asks for a terabyte), every CSV row repeated every header name
(a header of long names over rows of one-character cells), and a long heading was copied into the
metadata and the embedding input of every chunk under it. Each is cut at its source here, and the
total is checked against the file's size, so a file costs what it weighs.

Lengths (metadata, truncated with ``…``: the text itself keeps every character, so nothing a
search needs is lost, and no warning is given):

- `HEADING_CHARS` (200): a section heading as stored in each chunk's metadata and put before its
  text for the embedder (`slimrag.ingest.chunker`). A real heading is under 100 characters.
- `KEY_PATH_CHARS` (120): a JSON leaf's key path, ``a.b[3].c``; a longer one keeps its last
  120 characters (the keys nearest the value say the most), so every leaf line is at most 120
  characters more than its value.
- `HEADER_NAME_CHARS` (64): a CSV/TSV column name written before each cell; a longer one keeps
  its first 64.

Multiples (`EXPANSION`, characters of text and headings out per byte in, plus `SLACK_CHARS`,
64 Ki, so that a tiny file is never refused): a file whose sections would pass the bound is
skipped as ``too large`` with the bound in the message, not truncated: half a table or half a
JSON document would answer questions wrongly without saying so, and the user can split or
convert the file. Measured on the files of this machine (Debian's ``/usr/share``, the
virtual environment, the tests' fixtures; the largest ratio seen): Markdown 1.2, reST 1.0,
HTML 0.85, PDF 0.27, JSON 1.7, CSV 3.2, TSV 11.5 (a package list of short cells).

=================  ========  ==================================================================
readers            multiple  why that much
=================  ========  ==================================================================
text, Markdown,    4         the text is at most the file; a heading is also in its section's
reST, HTML, mail             text (2x), and mail headers head each message's section
JSON, JSON Lines,  16        each leaf gets its key path (numbers under long paths reach 10x);
notebooks                    a notebook's heading heads every code cell below it
CSV, TSV           32        each cell gets its column name; one-digit answers under 50-char
                             survey questions reach 27x
docx, pptx, EPUB,  100       the input is compressed (zip, Flate): 100x is also the zip guard's
PDF                          bound on what the members unzip to (`slimrag.ingest.rawfile`)
=================  ========  ==================================================================

Readers that could amplify (JSON, tables, Word tables) count their output as they write it
(`Budget`), so a hostile file is stopped after one step past its bound, before the memory is
spent; `check_output` checks every reader's sections afterwards. The bounds are module constants,
not configuration: a file over one is a file to split or convert, not a setting to raise.
"""

from __future__ import annotations

from dataclasses import dataclass

from slimrag.ingest.outcome import TOO_LARGE, SkipFile
from slimrag.ingest.text import Section

#: longest heading kept in a chunk's metadata and embedding input (header)
HEADING_CHARS = 200
#: longest JSON key path written before a leaf's value (header)
KEY_PATH_CHARS = 120
#: longest CSV/TSV column name written before each cell (header)
HEADER_NAME_CHARS = 64
#: characters any file may produce whatever its size (header)
SLACK_CHARS = 64 * 1024

#: the multiples of the header's table, by reader kind
TEXT_EXPANSION = 4
JSON_EXPANSION = 16
TABLE_EXPANSION = 32
PACKED_EXPANSION = 100


def head_of(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, its end replaced by ``…`` when cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def tail_of(text: str, limit: int) -> str:
    """``text`` cut to its last ``limit`` characters, its start replaced by ``…`` when cut."""
    return text if len(text) <= limit else "…" + text[len(text) - limit + 1:]


def limit_for(size: int, multiple: int) -> int:
    """The most characters a file of ``size`` bytes may produce at ``multiple``."""
    return multiple * size + SLACK_CHARS


def _over(what: str, used: int, size: int, multiple: int) -> SkipFile:
    return SkipFile(TOO_LARGE, f"{what} expands to over {used:,} characters, more than {multiple}x its "
                               f"{size:,} bytes (+{SLACK_CHARS // 1024} Ki); split it or convert the part "
                               "worth searching to text")


@dataclass
class Budget:
    """The characters a reader may still write for one file (header): `take` each piece as it is
    written; the piece that passes the bound raises `SkipFile` (too large)."""

    what: str
    size: int
    multiple: int
    used: int = 0

    @property
    def limit(self) -> int:
        """The most characters this file may produce."""
        return limit_for(self.size, self.multiple)

    def take(self, n: int) -> None:
        """Count ``n`` more characters; raises `SkipFile` past the limit."""
        self.used += n
        if self.used > self.limit:
            raise _over(self.what, self.used, self.size, self.multiple)


def output_chars(sections: list[Section]) -> int:
    """What sections cost: their text, and each heading up to `HEADING_CHARS` (what a chunk keeps)."""
    return sum(len(s.text) + min(len(s.heading), HEADING_CHARS) for s in sections)


def check_output(sections: list[Section], size: int, multiple: int, what: str = "the file") -> None:
    """Raise `SkipFile` (too large) when ``sections`` cost more than ``multiple`` times ``size``
    bytes plus `SLACK_CHARS`."""
    used = output_chars(sections)
    if used > limit_for(size, multiple):
        raise _over(what, used, size, multiple)
