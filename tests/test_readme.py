"""The README's "Python API" example, run for real.

The ```python block under "## Python API" is read from README.md and executed verbatim, one
top-level statement at a time, with the working directory set to a temporary folder that holds
``docs/``: the example's relative paths (``docs/``, ``docs.slimrag``, ``docs/new.md``) then point
there, and nothing in the code is rewritten. A renamed function, a changed signature or a field
that ``Hit``, ``Answer`` or ``Usage`` no longer has fails here, with the README's line number in
the traceback.

- Index half (everything before ``RAG(idx)``): build, open, search, add, remove, compact, stats.
  About 12 s on the 2-core development machine, most of it loading the embedder (the code builds
  its own, so the session's ``embedder`` fixture cannot be passed in): default suite.
- LLM half (``RAG(idx)`` with the embedded SmolLM2, one ``ask`` and one ``stream``, each up to
  the default 256 new tokens): 157 s on that machine, so it is marked slow.
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import DOCS, write_tree

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example() -> tuple[ast.Module, str]:
    """The parsed ```python block of the "Python API" section (line numbers as in README.md) and
    its source text."""
    text = README.read_text(encoding="utf-8")
    section = re.search(r"^## Python API\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert section, "README.md has no '## Python API' section"
    block = re.search(r"^```python\n(.*?)^```", section.group(1), re.S | re.M)
    assert block, "the '## Python API' section of README.md has no ```python block"
    code = block.group(1)
    tree = ast.parse(code, filename=str(README))
    ast.increment_lineno(tree, text[: section.start(1) + block.start(1)].count("\n"))
    return tree, code


def split_at_rag(tree: ast.Module) -> tuple[list[ast.stmt], list[ast.stmt]]:
    """The statements before the first one that calls ``RAG(...)`` (the index half) and the rest."""
    for i, stmt in enumerate(tree.body):
        if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "RAG"
               for n in ast.walk(stmt)):
            assert i > 0, "the README example calls RAG(...) before building an index"
            return tree.body[:i], tree.body[i:]
    raise AssertionError("the README example never calls RAG(...)")


def run(statements: list[ast.stmt], namespace: dict[str, Any], before: Any = None) -> str:
    """Execute ``statements`` in ``namespace``; ``before(stmt)`` is called ahead of each one.
    Returns what they printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for stmt in statements:
            if before is not None:
                before(stmt)
            exec(compile(ast.Module([stmt], type_ignores=[]), str(README), "exec"), namespace)
    return out.getvalue()


def calls_method(stmt: ast.stmt, name: str) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == name
               for n in ast.walk(stmt))


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The index half, run once in a folder holding ``docs/install.md`` and ``docs/old.md``;
    ``docs/new.md`` is written just before the statement that adds it, so the add is real.
    Yields the example's namespace plus ``printed`` (its output) and ``tail`` (the LLM half)."""
    root = tmp_path_factory.mktemp("readme")
    write_tree(root / "docs", {"install.md": DOCS["guide/install.md"], "old.md": DOCS["guide/cats.md"]})

    def before(stmt: ast.stmt) -> None:
        if calls_method(stmt, "add") and not (root / "docs" / "new.md").exists():
            write_tree(root / "docs", {"new.md": DOCS["notes/weather.txt"]})

    head, tail = split_at_rag(readme_example()[0])
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        namespace: dict[str, Any] = {"__name__": "readme_example"}
        namespace["printed"] = run(head, namespace, before)
        namespace["tail"] = tail
        yield namespace
        namespace["idx"].close()


def test_index_half_runs_and_does_what_it_says(example: dict[str, Any]) -> None:
    idx, hits = example["idx"], example["hits"]
    assert hits[0].source == "install.md" and len(hits) <= 5
    assert {"chunk_id", "score", "text", "source", "metadata"} <= set(dir(hits[0]))
    sources = [d.source for d in idx.documents()]
    assert "install.md" in sources and "new.md" in sources  # idx.add(["docs/new.md"]) indexed it
    printed = ast.literal_eval(example["printed"].strip().splitlines()[-1])
    assert printed["total"] > 0  # print(idx.stats()["bytes"])


def test_index_half_removes_the_old_file(example: dict[str, Any]) -> None:
    """``idx.remove(["docs/old.md"])`` is a path as typed from the current folder; the index stores
    the file as ``old.md`` (relative to the folder it was built from), and remove reads the path."""
    sources = [d.source for d in example["idx"].documents()]
    assert "old.md" not in sources and "install.md" in sources


@pytest.mark.slow
def test_llm_half_answers_with_sources_and_streams(example: dict[str, Any]) -> None:
    from slimrag.errors import ModelNotFoundError
    from slimrag.llm.weights import default_gguf_path

    try:
        default_gguf_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    printed = run(example["tail"], example)
    ans = example["ans"]
    assert ans.text.strip() and ans.text in printed
    assert ans.sources[0].source == "install.md"
    assert ans.usage.prompt_tokens > 0 and 0 < ans.usage.ttft_s <= ans.usage.total_s
    assert {"prompt_tokens", "cached_tokens", "ttft_s", "total_s"} <= set(dir(ans.usage))
    streamed = printed.split(repr(ans.usage), 1)[1]
    assert streamed.strip(), "rag.stream(...) printed nothing"
