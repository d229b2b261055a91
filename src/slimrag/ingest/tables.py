"""The reader of delimited tables (``.csv``, ``.tsv``): rows made readable by their header.

A row of a CSV means nothing without its header: ``1987,Oslo,4.2`` answers no question, while
``year: 1987 / city: Oslo / rainfall: 4.2`` does, and embeds like the sentence it is. So:

- the first row is the header (a column without a name is called ``column N``, N from 1; a row
  longer than the header names its extra cells the same way);
- each later row becomes lines of ``name: value``, empty cells left out, rows apart by a blank
  line. A column name is written before every cell of its column, so it is cut to its first
  `HEADER_NAME_CHARS` (64) characters, and the rows written are counted against
  `TABLE_EXPANSION` (32) times the file's size (`slimrag.ingest.bounds`): a header of long names
  over rows of one-character cells is skipped as ``too large`` one row past the bound, before
  its text is built;
- rows are grouped into sections of at most `GROUP_CHARS` characters (a row longer than that is
  a section alone), headed ``rows A-B`` by the file lines the rows start on (the header is line 1),
  so a citation says where in the table to look. At 1,000 characters a group is about 200-300
  MiniLM tokens of ``name: value`` text, so the chunker keeps most groups whole in one chunk and
  merges none across them: a row is cut only when it alone is longer than a chunk. Smaller groups
  mean more, shorter chunks; larger ones more rows cut between two chunks.

Delimiter: ``.tsv`` is tab-separated with Excel's quoting (the ``excel-tab`` dialect, what Excel
and Python's `csv` write: a cell holding a tab, a quote or a line break is quoted; a ``"`` inside an
unquoted cell is an ordinary character, so plain IANA-style TSV reads the same). ``.csv`` is sniffed by `csv.Sniffer` among
``, ; tab |`` on its first `SNIFF_CHARS` characters (Excel writes ``;`` in many locales), with
RFC 4180 quoting; when the sniffer cannot tell, it is a comma. The sample is kept small because
the sniffer's quote patterns scan ahead from every quote (quadratic in the sample, harmless at
4 K characters). A malformed file (a NUL, a field over the csv module's 128 KiB limit) is a
parse error.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from pathlib import Path

from slimrag.ingest.bounds import HEADER_NAME_CHARS, TABLE_EXPANSION, Budget, head_of
from slimrag.ingest.outcome import PARSE_ERROR, SkipFile
from slimrag.ingest.text import Section, decode

#: the most characters of rows in one section (see the module header)
GROUP_CHARS = 1000
#: characters of a .csv file shown to the delimiter sniffer
SNIFF_CHARS = 4096
#: delimiters the sniffer may choose for a .csv file
CSV_DELIMITERS = ",;\t|"


def _dialect(text: str, suffix: str) -> dict[str, str]:
    """`csv.reader` arguments for a file of this suffix (see the module header)."""
    if suffix == ".tsv":
        return {"dialect": "excel-tab"}
    sample = text[:SNIFF_CHARS]
    cut = sample.rfind("\n")
    try:
        found = csv.Sniffer().sniff(sample[:cut] if cut > 0 else sample, delimiters=CSV_DELIMITERS)
    except csv.Error:  # "Could not determine delimiter": one column, or too little text
        return {"delimiter": ","}
    return {"delimiter": found.delimiter}


def _row_text(header: list[str], row: list[str]) -> str:
    """A row as ``name: value`` lines (empty cells left out; cells past the header named
    ``column N``)."""
    if len(row) > len(header):
        header = header + [f"column {i}" for i in range(len(header) + 1, len(row) + 1)]
    return "\n".join([f"{name}: {value}" for name, cell in zip(header, row, strict=False) if (value := cell.strip())])


def _groups(rows: Iterator[tuple[int, str]]) -> Iterator[Section]:
    """Rows ``(line number, text)`` packed into sections of at most `GROUP_CHARS` characters."""
    first = last = 0
    buf: list[str] = []
    size = 0
    for line, text in rows:
        if buf and size + len(text) > GROUP_CHARS:
            yield Section(f"rows {first}-{last}" if last > first else f"row {first}", "\n\n".join(buf))
            buf, size = [], 0
        if not buf:
            first = line
        buf.append(text)
        size += len(text) + 2
        last = line
    if buf:
        yield Section(f"rows {first}-{last}" if last > first else f"row {first}", "\n\n".join(buf))


def read_table(data: bytes, path: Path) -> list[Section]:
    """CSV or TSV: each row as ``header: value`` lines, rows grouped into sections."""
    text = decode(data)
    # newline="" hands line ends to the csv module, so a quoted cell may hold a line break
    reader = csv.reader(io.StringIO(text, newline=""), **_dialect(text, path.suffix.lower()))
    try:
        header = next(reader, None)
        if header is None:
            return []
        header = [head_of(" ".join(h.split()), HEADER_NAME_CHARS) or f"column {i}" for i, h in enumerate(header, 1)]
        budget = Budget("table", len(data), TABLE_EXPANSION)

        def rows() -> Iterator[tuple[int, str]]:
            start = reader.line_num + 1
            for row in reader:
                if (body := _row_text(header, row)):
                    budget.take(len(body) + 2)
                    yield start, body
                start = reader.line_num + 1

        return list(_groups(rows()))
    except csv.Error as e:
        raise SkipFile(PARSE_ERROR, f"malformed table on line {reader.line_num}: {e}") from e
