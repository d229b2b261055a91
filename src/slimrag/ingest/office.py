"""Readers of Office Open XML documents: Word (``.docx``, python-docx) and PowerPoint (``.pptx``,
python-pptx).

- docx: paragraphs and tables in document order. A paragraph styled ``Title`` or ``Heading N``
  starts a section headed by its text, so an answer cites "report.docx › Results"; a table row is
  one line of its cells joined by `` | ``. A merged cell is written once: in its first row, and
  once across the columns it spans. The rows are read from the table's XML cells (``w:tc``), not
  from python-docx's ``row.cells``, which repeats a vertically merged cell in every row below it
  (a one-line continuation cell in the XML, so a small file could ask for its top cell's text
  thousands of times) and finds it by recursion through the rows above (quadratic, and a
  RecursionError past about a thousand rows). Headers, footers, comments and text boxes are not
  read.
- pptx: one section per slide, headed ``slide N: title``, holding the text of every shape with
  text (shapes inside groups included), table rows as in docx, and the speaker notes, which are
  often where a deck says what it means. A slide is a page (a deck prints one slide a page): its
  number is the section's ``page``, so the chunker never merges two slides into one chunk and a
  citation reads ``deck.pptx#1 (p. 2)``, as for a PDF.

Both libraries read every part of the package into memory, so the zip is checked first
(`slimrag.ingest.rawfile.open_zip`: no bomb, no XML member over its bound, no password-protected
file), and the text written is counted against `slimrag.ingest.bounds.PACKED_EXPANSION` (100)
times the file's size as it is written (`Budget`): over it, the file is skipped as too large. A corrupt document
(bad XML, a missing part, a zip that is not an Office package) raises `SkipFile` with a parse
error, one warning, like a corrupt PDF. The libraries are imported inside the readers, so
``import slimrag`` does not pay for them.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from slimrag.ingest.bounds import PACKED_EXPANSION, Budget
from slimrag.ingest.outcome import PARSE_ERROR, SkipFile
from slimrag.ingest.rawfile import open_zip
from slimrag.ingest.text import Section


def _failed(what: str, e: Exception) -> SkipFile:
    return SkipFile(PARSE_ERROR, f"corrupt or unreadable {what} ({type(e).__name__}: {str(e)[:200]})")


def _row_lines(rows: Iterable[Any]) -> Iterator[str]:
    """One line per PowerPoint table row: its cells' text joined by `` | ``, empty rows dropped
    (and empty cells at a row's end). A merged cell is written once: python-pptx marks the cells
    it covers ``is_spanned``."""
    for row in rows:
        cells: list[str] = []
        last = None
        for cell in row.cells:
            if (last is not None and cell == last) or getattr(cell, "is_spanned", False):
                continue
            last = cell
            cells.append(" ".join(cell.text.split()))
        while cells and not cells[-1]:  # trailing empty cells say nothing
            cells.pop()
        if cells:
            yield " | ".join(cells)


def _docx_row_lines(table: Any) -> Iterator[str]:
    """One line per row of a Word table, from its XML cells: a vertically merged cell only in its
    first row, a horizontally merged one once (module header)."""
    from docx.table import _Cell

    for tr in table._tbl.tr_lst:
        cells = [" ".join(_Cell(tc, table).text.split()) for tc in tr.tc_lst if tc.vMerge != "continue"]
        while cells and not cells[-1]:
            cells.pop()
        if cells:
            yield " | ".join(cells)


def _is_heading(paragraph: Any) -> bool:
    name = paragraph.style.name if paragraph.style is not None else ""
    return bool(name) and (name == "Title" or name.startswith("Heading"))


def read_docx(data: bytes, path: Path) -> list[Section]:
    """Word: paragraphs and tables in order, split at Title and Heading paragraphs."""
    open_zip(data, "Word document").close()
    from docx import Document

    sections: list[Section] = []
    heading, lines = "", []
    budget = Budget("Word document", len(data), PACKED_EXPANSION)
    # python-docx raises a zoo on a damaged package (KeyError for a missing part, ValueError for
    # a wrong content type, lxml's XMLSyntaxError, PackageNotFoundError): each means "unreadable"
    try:
        for block in Document(io.BytesIO(data)).iter_inner_content():
            if hasattr(block, "rows"):  # a table
                for line in _docx_row_lines(block):
                    budget.take(len(line) + 1)
                    lines.append(line)
                continue
            text = block.text.strip()
            budget.take(len(text) + 1)
            if text and _is_heading(block):
                if any(line.strip() for line in lines):
                    sections.append(Section(heading, "\n".join(lines)))
                heading, lines = " ".join(text.split()), [text]
            elif text:
                lines.append(text)
    except SkipFile:
        raise
    except Exception as e:  # noqa: BLE001
        raise _failed("Word document", e) from e
    if any(line.strip() for line in lines):
        sections.append(Section(heading, "\n".join(lines)))
    return sections


def _shape_lines(shapes: Any) -> list[str]:
    """Text of the shapes of a slide, in their order, groups opened (with an explicit stack)."""
    lines: list[str] = []
    stack = list(reversed(list(shapes)))
    while stack:
        shape = stack.pop()
        inner = getattr(shape, "shapes", None)  # a group shape holds shapes
        if inner is not None:
            stack.extend(reversed(list(inner)))
        elif shape.has_text_frame:
            text = shape.text_frame.text.strip()
            if text:
                lines.append(text)
        elif getattr(shape, "has_table", False):
            lines.extend(_row_lines(shape.table.rows))
    return lines


def read_pptx(data: bytes, path: Path) -> list[Section]:
    """PowerPoint: one section per slide (title as heading), its shapes' text and its notes."""
    open_zip(data, "PowerPoint presentation").close()
    from pptx import Presentation

    sections: list[Section] = []
    budget = Budget("PowerPoint presentation", len(data), PACKED_EXPANSION)
    try:
        for n, slide in enumerate(Presentation(io.BytesIO(data)).slides, 1):
            title_shape = slide.shapes.title
            title = " ".join(title_shape.text_frame.text.split()) if title_shape is not None else ""
            lines = _shape_lines(slide.shapes)
            if slide.has_notes_slide and slide.notes_slide.notes_text_frame is not None:
                notes = slide.notes_slide.notes_text_frame.text.strip()
                if notes:
                    lines.append(notes)
            budget.take(sum(len(line) + 1 for line in lines))
            if lines:
                heading = f"slide {n}: {title}" if title else f"slide {n}"
                sections.append(Section(heading, "\n".join(lines), page=n))
    except SkipFile:
        raise
    except Exception as e:  # noqa: BLE001  (as in read_docx: any failure means unreadable)
        raise _failed("PowerPoint presentation", e) from e
    return sections
