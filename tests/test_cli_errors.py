"""CLI errors for an index this slimrag cannot read: a catalog of an unknown format (another
slimrag version's) or a catalog file that is not SQLite at all. Every verb that opens an index
ends in one ``error:`` line on stderr and exit status 1, not a traceback, and ``serve`` and
``mcp`` never start serving.

The index is real (built with the real embedder), then damaged on disk the way it happens: the
catalog's ``user_version`` set to a format number no slimrag reads, or its bytes replaced. The
CLI runs as a real process through its entry point (``python -m slimrag``), with a timeout, so a
server that did start ends the test as a failure instead of hanging it."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DOCS, write_tree

from slimrag.catalog import schema
from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.index.store import layout

#: the catalog format after this slimrag's newest, as a newer slimrag would write it
UNKNOWN_FORMAT = schema.COMPACT + 1


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tree(tmp_path_factory.mktemp("docs"), DOCS)


@pytest.fixture(scope="module")
def built(docs: Path, tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Path:
    with Index.build(docs, tmp_path_factory.mktemp("idx") / "good.slimrag", embedder=embedder) as idx:
        return Path(idx.root)


def damaged_copy(built: Path, dest: Path, how: str) -> Path:
    """A copy of ``built`` whose catalog is of an unknown format (``how="format"``) or not a
    database (``how="junk"``)."""
    root = Path(shutil.copytree(built, dest))
    catalog = root / layout.CATALOG
    if how == "format":
        db = sqlite3.connect(catalog)
        try:
            db.execute(f"PRAGMA user_version={UNKNOWN_FORMAT}")
            db.commit()
        finally:
            db.close()
    else:
        for side in root.glob(f"{layout.CATALOG}-*"):  # WAL and shared memory of the real catalog
            side.unlink()
        catalog.write_bytes(b"not a catalog\n" * 512)
    return root


@pytest.fixture(scope="module")
def unknown_format(built: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return damaged_copy(built, tmp_path_factory.mktemp("bad") / "format.slimrag", "format")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it, offline, stdin closed (chat and mcp read it), stopped after 120 s."""
    return subprocess.run([sys.executable, "-m", "slimrag", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})


def assert_one_error_line(proc: subprocess.CompletedProcess[str], reason: str, before: str = "") -> None:
    """Exit status 1, nothing on stdout, and on stderr one ``error:`` line with ``reason``,
    after a status line starting with ``before`` where the verb prints one first."""
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    if before:
        assert lines[0].startswith(before), lines
        lines = lines[1:]
    assert len(lines) == 1 and lines[0].startswith("error: cannot read the index: "), lines
    assert reason in lines[0], lines
    assert proc.stdout == "", proc.stdout


def test_the_built_index_itself_is_readable(built: Path) -> None:
    """The damage, not the fixture, is what the other tests see."""
    proc = run_cli("search", str(built), "office cat", "--mode", "keyword", "--json")
    assert proc.returncode == 0 and "guide/cats.md" in proc.stdout, proc.stderr


@pytest.mark.parametrize("verb", ["serve", "mcp", "search", "ask", "chat", "info", "check", "compact",
                                  "add", "remove", "sync", "watch"])
def test_every_verb_on_an_unknown_catalog_format_is_one_error_line(unknown_format: Path, docs: Path,
                                                                   verb: str) -> None:
    index = str(unknown_format)
    args = {"serve": [index, "--port", "0"], "mcp": [index], "search": [index, "office cat"],
            "ask": [index, "where is the office cat?", "--no-llm"], "chat": [index], "info": [index],
            "check": [index], "compact": [index], "add": [index, str(docs / "guide")],
            "remove": [index, "guide/cats.md"], "sync": [str(docs), index], "watch": [str(docs), index]}[verb]
    proc = run_cli(verb, *args)
    # watch says what it watches before its worker thread opens the index
    before = f"watching {docs} for {index}" if verb == "watch" else ""
    assert_one_error_line(proc, f"catalog format {UNKNOWN_FORMAT} is not one this slimrag reads", before)
    assert "rebuild the index" in proc.stderr


@pytest.mark.parametrize("verb", ["serve", "search"])
def test_a_catalog_that_is_not_a_database_is_one_error_line(built: Path, tmp_path: Path, verb: str) -> None:
    index = str(damaged_copy(built, tmp_path / "junk.slimrag", "junk"))
    proc = run_cli(verb, index, *(["--port", "0"] if verb == "serve" else ["office cat"]))
    assert_one_error_line(proc, "catalog.sqlite is damaged (file is not a database); rebuild the index")
