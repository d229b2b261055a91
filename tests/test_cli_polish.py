"""Every rough edge of a new user's first hour with the CLI (issue 13): no traceback for a user
error, a message in the CLI's words that names the flag, paths as typed, a status line, shell
completion. Real index on disk, click's CliRunner, a real OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import io
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from slimrag.cli import cli
from slimrag.cli.feedback import StatusLine, until_first_piece
from slimrag.cli.sources import escape_glob, match_sources, source_glob
from slimrag.config import GenerationConfig
from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.llm.base import Delta, Generator
from slimrag.prompt import Prompt
from slimrag.rag.pipeline import RAG
from slimrag.types import Usage


def no_traceback(r: Result, code: int) -> str:
    """The error output of a run that must end with ``code`` and a message, not a traceback."""
    assert r.exit_code == code, (r.output, r.exc_info)
    assert isinstance(r.exception, SystemExit), r.exc_info
    assert "Traceback" not in r.output
    return r.stderr


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> tuple[Path, Path]:
    """The test corpus and its index, built once through the library with the session's embedder
    (tests that change the index get a copy: `built`)."""
    from conftest import DOCS, write_tree

    root = tmp_path_factory.mktemp("polish")
    docs = write_tree(root / "docs", DOCS)
    Index.build(docs, root / "docs.slimrag", embedder=embedder).close()
    return docs, root / "docs.slimrag"


@pytest.fixture()
def docs_dir(shared: tuple[Path, Path]) -> Path:
    """The corpus the shared index was built from (read it, do not change it: copies of the index
    still name this folder as theirs)."""
    return shared[0]


@pytest.fixture()
def built(shared: tuple[Path, Path], tmp_path: Path) -> Path:
    """A copy of the shared index, free to change."""
    out = tmp_path / "docs.slimrag"
    shutil.copytree(shared[1], out)
    return out


def documents(index: Path) -> list[str]:
    with Index.open(index) as idx:
        return sorted(d.source for d in idx.documents())


# -- flags named in errors ------------------------------------------------------------------------
def test_build_config_errors_name_the_flag(docs_dir: Path, tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["build", str(docs_dir), "-o", str(tmp_path / "x"), "--chunk-tokens", "64",
                                 "--chunk-overlap", "64"])
    assert "--chunk-overlap must be >= 0 and smaller than --chunk-tokens" in no_traceback(r, 2)
    r = CliRunner().invoke(cli, ["build", str(docs_dir), "-o", str(tmp_path / "x"), "--chunk-tokens", "8"])
    assert "--chunk-tokens must be >= 16, got 8" in no_traceback(r, 2)
    r = CliRunner().invoke(cli, ["build", str(docs_dir), "-o", str(tmp_path / "x"), "--embedder-url", "localhost:8000"])
    assert no_traceback(r, 1).startswith("error: --embedder-url: 'localhost:8000' is not an http(s) URL")
    r = CliRunner().invoke(cli, ["build", str(docs_dir), "-o", str(tmp_path / "x"), "--embedder-model", "m"])
    assert "give --embedder-url too" in no_traceback(r, 2)
    assert not (tmp_path / "x").exists()


def test_build_over_an_existing_index_speaks_the_cli(docs_dir: Path, built: Path) -> None:
    err = no_traceback(CliRunner().invoke(cli, ["build", str(docs_dir), "-o", str(built)]), 2)
    assert "--out" in err and "already exists; pass --force to replace it" in err
    assert f"slimrag add {built}" in err and "overwrite=True" not in err
    other = built.parent / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    err = no_traceback(CliRunner().invoke(cli, ["build", str(docs_dir), "-o", str(other), "--force"]), 2)
    assert "not an index and not empty" in err and (other / "keep.txt").exists()


def test_info_without_arguments_explains_itself() -> None:
    err = no_traceback(CliRunner().invoke(cli, ["info"]), 2)
    assert "INDEX" in err and "--llm" in err and "slimrag info docs.slimrag" in err
    assert "--docs lists" in no_traceback(CliRunner().invoke(cli, ["info", "--docs"]), 2)


# -- remove and --source take paths as typed -----------------------------------------------------
def test_remove_accepts_paths_as_typed(built: Path, docs_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(docs_dir.parent)  # the user stands beside the indexed folder
    runner = CliRunner()
    r = runner.invoke(cli, ["remove", str(built), "docs/guide/cats.md"])  # relative to here
    assert r.exit_code == 0 and r.stdout.startswith("removed 1 documents"), r.output
    r = runner.invoke(cli, ["remove", str(built), str(docs_dir / "code" / "fib.py")])  # absolute
    assert r.exit_code == 0 and "removed 1 documents" in r.stdout
    r = runner.invoke(cli, ["remove", str(built), "notes/weather.txt"])  # as stored (relative to the folder)
    assert r.exit_code == 0 and "removed 1 documents" in r.stdout
    r = runner.invoke(cli, ["remove", str(built), "data/*.json*"])  # a glob
    assert r.exit_code == 0 and "removed 2 documents" in r.stdout
    r = runner.invoke(cli, ["remove", str(built), "docs/site"])  # a folder, relative to here
    assert r.exit_code == 0 and "removed 1 documents" in r.stdout
    assert documents(built) == ["guide/install.md", "notes/recipes.rst"]


def test_remove_warns_and_fails_when_nothing_matched(built: Path) -> None:
    r = CliRunner().invoke(cli, ["remove", str(built), "upd/pg.txt", "guide/cats.md"])
    assert r.exit_code == 1 and "removed 1 documents" in r.stdout
    assert "warning: nothing in" in r.stderr and "'upd/pg.txt'" in r.stderr and "stored names look like" in r.stderr
    assert "guide/cats.md" not in documents(built)


def test_source_matching_rules(tmp_path: Path) -> None:
    names = ["a/b.md", "a/c[1].md", "dpkg/x.txt", "/elsewhere/y.txt"]
    root = tmp_path / "docs"
    assert source_glob("dpkg", names, root, tmp_path) == "dpkg/*"
    assert source_glob("dpkg/", names, root, tmp_path) == "dpkg/*"
    assert source_glob("docs/dpkg", names, root, tmp_path) == "dpkg/*"  # typed from the parent folder
    assert source_glob("a/c[1].md", names, root, tmp_path) == escape_glob("a/c[1].md") == "a/c[[]1].md"
    assert source_glob("a/*.md", names, root, tmp_path) == "a/*.md"
    assert source_glob("nothing", names, root, tmp_path) is None
    m = match_sources(["/elsewhere/y.txt", "a", "zzz"], names, root, tmp_path)
    assert (m.sources, m.nothing) == (["/elsewhere/y.txt", "a/b.md", "a/c[1].md"], ["zzz"])


# -- feedback while waiting -----------------------------------------------------------------------
class _Slow(Generator):
    def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
        yield Delta("Whiskers.")
        yield Delta("", usage=Usage(), finish_reason="stop")


def test_status_line_names_each_stage_and_is_gone_at_the_first_token(built: Path) -> None:
    out = io.StringIO()
    status = StatusLine(out, enabled=True)
    with Index.open(built) as idx:
        rag = RAG(idx, _Slow(), progress=status.show)
        seen = []
        for piece in until_first_piece(rag.stream_answer("Where does Whiskers sleep?", k=2), status):
            seen.append((piece, out.getvalue()))
    first_text, shown = seen[0]
    assert first_text == "Whiskers."
    assert shown == "\r\033[Kretrieving passages...\r\033[Kprefilling the prompt...\r\033[K"
    assert not status.shown
    quiet = StatusLine(io.StringIO())  # not a terminal: nothing is drawn
    quiet.show("retrieving")
    assert quiet.stream.getvalue() == "" and not quiet.shown


def test_shell_completion_script_is_generated() -> None:
    r = CliRunner().invoke(cli, [], prog_name="slimrag", env={"_SLIMRAG_COMPLETE": "bash_source"})
    assert r.exit_code == 0 and "_slimrag_completion" in r.stdout
    r = CliRunner().invoke(cli, [], prog_name="slimrag",
                           env={"_SLIMRAG_COMPLETE": "bash_complete", "COMP_WORDS": "slimrag re", "COMP_CWORD": "1"})
    assert "remove" in r.stdout


