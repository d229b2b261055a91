"""`slimrag demo`: a corpus every Python has (the standard library's own documentation, rendered
with `pydoc`), an index over it, and two questions answered with sources.

The corpus and index live under ``$SLIMRAG_HOME/demo`` (default ``~/.cache/slimrag/demo``), so a
second run reuses both, and the LLM's converted weights (see `slimrag.llm.weights`): the first run
pays for embedding and weight conversion, later runs only for loading and answering.
"""

from __future__ import annotations

import importlib
import os
import pydoc
import re
from pathlib import Path

#: Modules whose documentation makes the demo corpus: common, self-contained, moderate in size.
MODULES = (
    "json", "csv", "pathlib", "shutil", "glob", "fnmatch", "tempfile", "datetime", "time",
    "collections", "heapq", "bisect", "itertools", "functools", "operator", "string", "textwrap",
    "re", "math", "statistics", "random", "fractions", "hashlib", "base64", "secrets", "uuid",
    "sqlite3", "zipfile", "gzip", "argparse", "subprocess", "queue", "contextlib", "dataclasses",
    "copy", "pprint", "timeit", "html",
)

#: A default value's memory address in pydoc's text (``<built-in method match of re.Pattern object at
#: 0x7f91fd969630>``): removed, because it changes every run and its token count moves the chunk
#: boundaries after it, so two fresh demos indexed different chunks and answered differently.
ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")

QUESTIONS = (
    "How do I parse a JSON string into a Python object?",
    "How can I compute the median of a list of numbers?",
)


def home() -> Path:
    """slimrag's cache folder: ``$SLIMRAG_HOME`` or ``~/.cache/slimrag``."""
    return Path(os.environ.get("SLIMRAG_HOME") or Path.home() / ".cache" / "slimrag")


def write_corpus(folder: Path) -> int:
    """Render each module's pydoc text into ``folder/NAME.txt``; returns the number of files."""
    folder.mkdir(parents=True, exist_ok=True)
    n = 0
    for name in MODULES:
        target = folder / f"{name}.txt"
        if target.exists():
            n += 1
            continue
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue  # a Python built without this module (e.g. no sqlite3): the demo still works
        text = pydoc.render_doc(module, title="Python Library Documentation: %s", renderer=pydoc.plaintext)
        text = ADDRESS.sub("", text)
        tmp = target.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.rename(target)
        n += 1
    return n
