"""The folder-of-files QA set (issue 29): the Python 3.11 documentation sources, 497 reST files, as a
user would index them (``slimrag build`` over the folder, default settings: about 20.6k chunks),
and questions written by reading those files.

The questions (`FIXTURE`, ``bench/pydocs_qa.json``) were written by hand from the files' text, not by
a model: each has its gold answer string (SQuAD-normalised, it occurs in its file) and its gold file
(the index's name for it, relative to the folder: ``library/json.rst.txt``). They are the questions a
user asks of the docs ("How do I copy an entire directory tree?", "What is the default pickle
protocol?"): most answers are an identifier or a value, a few a phrase. The two questions of
``slimrag demo`` are among them; the demo's corpus is another one (pydoc's rendering of 38 modules),
and nothing was tuned on this set.

The index is built on first use into `INDEX` (``bench/data/pydocs-497.slimrag``; a link to an index
built elsewhere serves as well), from `bench.datasets.python_docs_dir`. Building it embeds every
chunk: about 10 minutes on 2 cores.

``pydocs_html`` asks the same questions of the same documentation as a user more often has it: the
built HTML pages (``html/``, 530 pages, the navigation and search pages among them), indexed with the
same defaults into `INDEX_HTML`, its reST sources (``_sources/``, the other set) left out by a
``.slimragignore`` written there. A gold file ``library/json.rst.txt`` is ``library/json.html`` there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.datasets import DATA, python_docs_dir, saved_index
from bench.qa_sets import Item

#: The questions, their gold answers and gold files.
FIXTURE = Path(__file__).resolve().with_name("pydocs_qa.json")
#: Where the set's index lives.
INDEX = DATA / "pydocs-497.slimrag"
#: Where the HTML pages' index lives (``pydocs_html``).
INDEX_HTML = DATA / "pydocs-html.slimrag"


def items() -> list[Item]:
    """The set's questions, in the fixture's order."""
    return [Item(r["question"], r["answer"], r["source"]) for r in json.loads(FIXTURE.read_text())]


def pydocs() -> tuple[Any, list[Item]]:
    """The Python docs folder index (built on first use) and the set's items."""
    return saved_index(INDEX, python_docs_dir), items()


def pydocs_html() -> tuple[Any, list[Item]]:
    """The same questions over the built HTML pages (module header), the index built on first use."""
    asked = [Item(it.question, it.answer, it.source.removesuffix(".rst.txt") + ".html") for it in items()]
    return saved_index(INDEX_HTML, _html_folder), asked


def _html_folder() -> Path:
    """The built HTML pages, their reST sources (the other set) left out by a ``.slimragignore``."""
    html = python_docs_dir().parent
    (html / ".slimragignore").write_text("# the reST sources are the other set (pydocs)\n_sources/\n")
    return html
