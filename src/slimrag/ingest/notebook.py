"""The Jupyter notebook reader (``.ipynb``): markdown and code cells, in order, without outputs.

Outputs are left out on purpose: they are what the code printed (tracebacks, tables of numbers,
base64 images), large and rarely what a question is about, and they change on every run, which
would re-index an unchanged notebook's meaning. Raw cells (nbconvert directives) are left out too.

Markdown cells split at their ``#`` headings (`slimrag.ingest.text.markdown_sections`), and a
heading carries over to the cells below it until the next one, so a code cell is cited under
the heading of the part of the notebook it sits in. A code cell is kept as a fenced block tagged
with the kernel's language, so a passage shows it as code.

Both notebook formats in use are read: nbformat 4 (``cells``; a cell's ``source`` is a string or
a list of lines) and nbformat 3 (``worksheets[].cells``, code in ``input``, ``heading`` cells with
a ``level``). JSON is loaded with the same guards as the JSON reader (`slimrag.ingest.text.load_json`);
a file that is JSON but not a notebook is a parse error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slimrag.ingest.outcome import PARSE_ERROR, SkipFile
from slimrag.ingest.text import Section, decode, load_json, markdown_sections


def _text(value: object) -> str:
    """A cell field as text: nbformat stores it as one string or as a list of lines."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(v for v in value if isinstance(v, str))
    return ""


def _cells(nb: dict[str, Any]) -> list[dict[str, Any]]:
    """The cells of an nbformat 4 or 3 notebook, as dicts; raises `SkipFile` for another shape."""
    if isinstance(nb.get("cells"), list):
        cells = nb["cells"]
    elif isinstance(nb.get("worksheets"), list):
        cells = [c for ws in nb["worksheets"] if isinstance(ws, dict) and isinstance(ws.get("cells"), list)
                 for c in ws["cells"]]
    else:
        raise SkipFile(PARSE_ERROR, "not a Jupyter notebook: no 'cells' (nbformat 4) or 'worksheets' (nbformat 3)")
    return [c for c in cells if isinstance(c, dict)]


def _language(nb: dict[str, Any]) -> str:
    """The kernel's language for code fences (``python`` when the notebook does not say)."""
    meta = nb.get("metadata") if isinstance(nb.get("metadata"), dict) else {}
    for key in ("language_info", "kernelspec"):
        info = meta.get(key)
        name = info.get("name" if key == "language_info" else "language") if isinstance(info, dict) else None
        if isinstance(name, str) and name.isidentifier():
            return name
    return "python"


def read_notebook(data: bytes, path: Path) -> list[Section]:
    """Jupyter notebook: markdown cells split at headings, code cells as fenced blocks, no outputs."""
    nb = load_json(decode(data))
    if not isinstance(nb, dict):
        raise SkipFile(PARSE_ERROR, "not a Jupyter notebook: the JSON is not an object")
    language = _language(nb)
    sections: list[Section] = []
    heading = ""
    for cell in _cells(nb):
        kind = cell.get("cell_type")
        if kind == "markdown":
            parts = markdown_sections(_text(cell.get("source")), heading)
            sections.extend(parts)
            heading = parts[-1].heading if parts else heading
        elif kind == "heading":  # nbformat 3
            heading = " ".join(_text(cell.get("source")).split())
            if heading:
                sections.append(Section(heading, heading))
        elif kind == "code":
            code = _text(cell.get("source", cell.get("input"))).strip("\n")
            if code.strip():
                sections.append(Section(heading, f"```{language}\n{code}\n```"))
    return sections
