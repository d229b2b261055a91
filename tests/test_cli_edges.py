"""CLI edges (issue 20, item 4): an empty query is one error line, not five arbitrary hits; a busy
port stops ``serve``, ``route`` and ``mcp --http`` at once, in one line with exit status 2, before
any model or index is loaded.

The busy port is a real listening socket on 127.0.0.1; the commands run as real processes, which
report afterwards which heavy modules they had imported (none may be: the port comes first)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import DOCS, write_tree

from bench.crash import HashEmbedder
from slimrag.cli import cli
from slimrag.errors import RequestError
from slimrag.index.core import Index

REPO = Path(__file__).resolve().parents[1]
#: Modules that loading a model or opening an index imports; none may be loaded before the port is bound.
HEAVY = ("torch", "transformers", "slimrag.llm.backends", "slimrag.index.core", "slimrag.embed.local", "mcp")


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Index]:
    docs = write_tree(tmp_path_factory.mktemp("docs"), DOCS)
    with Index.build(docs, tmp_path_factory.mktemp("idx") / "edges.slimrag", embedder=HashEmbedder()) as idx:
        yield idx


@pytest.mark.parametrize("query", ["", "   ", "\t\n"])
@pytest.mark.parametrize("verb", ["search", "ask"])
def test_an_empty_query_is_one_error_line(index: Index, verb: str, query: str) -> None:
    result = CliRunner().invoke(cli, [verb, str(index.root), query])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "empty or white space" in lines[0], lines


@pytest.mark.parametrize("mode", ["vector", "keyword", "hybrid"])
def test_the_library_refuses_an_empty_query_for_every_front_end(index: Index, mode: str) -> None:
    """Index.search itself refuses it, so MCP's search tool and any script get the same rule."""
    with pytest.raises(RequestError, match="empty or white space"):
        index.search(" \t", mode=mode)
    with pytest.raises(RequestError, match="empty or white space"):
        index.search_batch(["office cat", ""])


def test_a_query_with_words_still_searches(index: Index) -> None:
    result = CliRunner().invoke(cli, ["search", str(index.root), "office cat", "--json", "--mode", "keyword"])
    assert result.exit_code == 0 and json.loads(result.output)[0]["source"] == "guide/cats.md"


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def run_cli(*args: str) -> tuple[int, str, list[str]]:
    """Run the CLI in a fresh process: its exit status, stderr, and the `HEAVY` modules it imported."""
    code = ("import sys\nfrom slimrag.cli import cli\ntry:\n    cli(sys.argv[1:], prog_name='slimrag')\n"
            "except SystemExit as e:\n    status = e.code\n"
            f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))\nsys.exit(status)\n")
    proc = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(REPO)!r})\n{code}", *args],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    return proc.returncode, proc.stderr, proc.stdout.split()


@pytest.mark.parametrize("verb", ["serve", "route", "mcp --http"])
def test_a_busy_port_is_one_line_and_status_2_before_anything_loads(index: Index, busy_port: int, verb: str) -> None:
    args = {"serve": ["serve", str(index.root)], "route": ["route", "--replica", "http://127.0.0.1:9"],
            "mcp --http": ["mcp", str(index.root), "--http"]}[verb]
    status, err, loaded = run_cli(*args, "--port", str(busy_port))
    assert status == 2, err
    assert err.strip() == f"error: port {busy_port} on 127.0.0.1 is in use by another program; stop it or give " \
                          "another --port (0 picks a free one)", err
    assert loaded == [], loaded


def test_an_address_not_of_this_machine_is_one_line_too(index: Index) -> None:
    status, err, loaded = run_cli("serve", str(index.root), "--host", "192.0.2.1", "--port", "0")
    assert status == 2 and err.strip().startswith("error: port 0 on 192.0.2.1 cannot be bound: the address is not "
                                                  "one of this machine's"), err
    assert loaded == []
