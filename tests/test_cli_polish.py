"""Every rough edge of a new user's first hour with the CLI (issue 13): no traceback for a user
error, a message in the CLI's words that names the flag, paths as typed, a status line, shell
completion. Real index on disk, click's CliRunner, a real OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result
from openai_server import OpenAIServer

from slimrag.cli import cli
from slimrag.cli.feedback import StatusLine, until_first_piece
from slimrag.cli.options import llm_spec
from slimrag.config import GenerationConfig
from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.index.sources import escape_glob, match_sources, source_glob
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
    assert r.exit_code == 0 and r.stdout.startswith("removed 1 document ("), r.output
    r = runner.invoke(cli, ["remove", str(built), str(docs_dir / "code" / "fib.py")])  # absolute
    assert r.exit_code == 0 and "removed 1 document (" in r.stdout
    r = runner.invoke(cli, ["remove", str(built), "notes/weather.txt"])  # as stored (relative to the folder)
    assert r.exit_code == 0 and "removed 1 document (" in r.stdout
    r = runner.invoke(cli, ["remove", str(built), "data/*.json*"])  # a glob
    assert r.exit_code == 0 and "removed 2 documents" in r.stdout
    r = runner.invoke(cli, ["remove", str(built), "docs/site"])  # a folder, relative to here
    assert r.exit_code == 0 and "removed 1 document (" in r.stdout
    assert documents(built) == ["guide/install.md", "notes/recipes.rst"]


def test_remove_warns_and_fails_when_nothing_matched(built: Path) -> None:
    r = CliRunner().invoke(cli, ["remove", str(built), "upd/pg.txt", "guide/cats.md"])
    assert r.exit_code == 1 and "removed 1 document (" in r.stdout
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


# -- ask, chat and search ----------------------------------------------------------------------
# -- flags named in errors ------------------------------------------------------------------------
@pytest.mark.parametrize("verb", [["ask", "{index}", "q"], ["chat", "{index}"]])
def test_llm_that_is_not_a_url_names_the_flag(built: Path, verb: list[str]) -> None:
    args = [a.format(index=built) for a in verb] + ["--llm", "notaurl"]
    err = no_traceback(CliRunner().invoke(cli, args), 1)
    assert err.startswith("error: --llm: 'notaurl' is not an http(s) URL") and "11434/v1" in err
    assert err.count("\n") == 1

def test_remote_only_flags_need_llm(built: Path) -> None:
    err = no_traceback(CliRunner().invoke(cli, ["ask", str(built), "q", "--llm-model", "llama3"]), 2)
    assert "--llm-model" in err and "--llm" in err
    err = no_traceback(CliRunner().invoke(cli, ["ask", str(built), "q", "--api-key", "k"]), 2)
    assert "--api-key is for the --llm server" in err

@pytest.mark.parametrize(("args", "flag"), [
    (["-k", "0"], "'-k'"),
    (["--max-tokens", "0"], "'--max-tokens'"),
])
def test_out_of_range_numbers_name_the_flag(built: Path, args: list[str], flag: str) -> None:
    err = no_traceback(CliRunner().invoke(cli, ["ask", str(built), "q", *args]), 2)
    assert flag in err and "0 is not in the range" in err

def test_source_accepts_a_folder_name(built: Path) -> None:
    r = CliRunner().invoke(cli, ["search", str(built), "planets and people", "--source", "data", "--json"])
    assert r.exit_code == 0, r.output
    assert {h["source"] for h in json.loads(r.stdout)} == {"data/planets.json", "data/people.jsonl"}
    err = no_traceback(CliRunner().invoke(cli, ["search", str(built), "x", "--source", "dpkg"]), 2)
    assert "--source" in err and "no stored source matches 'dpkg'" in err

# -- remote model flags ---------------------------------------------------------------------------
def test_llm_model_and_api_key_reach_the_server(built: Path) -> None:
    with OpenAIServer(models=("other", "tiny")) as srv:
        srv.api_key = "sekrit"
        base = ["ask", str(built), "Where does Whiskers sleep?", "--llm", srv.base_url, "--llm-model", "tiny"]
        r = CliRunner().invoke(cli, base)
        assert "401" in no_traceback(r, 1) and r.stderr.startswith("error: ")
        r = CliRunner().invoke(cli, [*base, "--api-key", "sekrit"])
        assert r.exit_code == 0 and "echo: Question: Where does Whiskers sleep?" in r.stdout, r.output
        r = CliRunner().invoke(cli, base, env={"OPENAI_API_KEY": "sekrit"})
        assert r.exit_code == 0, r.output
        assert {q["body"]["model"] for q in srv.requests_to("/v1/chat/completions")} == {"tiny"}

def test_cut_answer_shows_a_notice_and_empty_index_the_fixed_reply(built: Path, tmp_path: Path,
                                                                   embedder: LocalEmbedder) -> None:
    with OpenAIServer() as srv:
        r = CliRunner().invoke(cli, ["ask", str(built), "Where does Whiskers sleep?", "--llm", srv.base_url,
                                     "--max-tokens", "2"])
        assert r.exit_code == 0 and "echo: Question:" in r.stdout and "cut off at the token limit" in r.stdout
        Index.create(tmp_path / "empty.slimrag", embedder=embedder).close()
        sent = len(srv.requests_to("/v1/chat/completions"))
        r = CliRunner().invoke(cli, ["ask", str(tmp_path / "empty.slimrag"), "Where does Whiskers sleep?",
                                     "--llm", srv.base_url])
        assert r.exit_code == 0 and "I found nothing in the indexed files" in r.stdout
        assert "Sources: none" in r.stdout and len(srv.requests_to("/v1/chat/completions")) == sent

def test_ask_output_has_no_status_line_when_not_a_terminal(built: Path) -> None:
    with OpenAIServer() as srv:
        r = CliRunner().invoke(cli, ["ask", str(built), "Where does Whiskers sleep?", "--llm", srv.base_url])
    assert r.exit_code == 0 and "\r" not in r.output and "retrieving" not in r.output

def test_openai_api_key_alone_is_ignored_without_llm() -> None:
    # OPENAI_API_KEY is often set for other tools: without --llm it is ignored, while an explicit
    # --api-key without --llm is a usage error.
    ctx = click.Context(cli)
    ctx.set_parameter_source("api_key", click.core.ParameterSource.ENVIRONMENT)
    with ctx:
        assert llm_spec(None, None, "from-the-environment") == {"llm": None}
    with click.Context(cli), pytest.raises(click.UsageError, match="--api-key is for the --llm server"):
        llm_spec(None, None, "typed")
    assert llm_spec("http://h/v1", "m", "k") == {"llm": "http://h/v1", "model": "m", "api_key": "k"}


# -- one retrieval default --------------------------------------------------------------------------
def test_one_search_default_for_the_library_the_cli_and_rag(shared: tuple[Path, Path]) -> None:
    from slimrag.config import SearchConfig

    assert SearchConfig().mode == "hybrid"  # chosen by bench.retrieval (docs/benchmarks.md)
    q = "Where does Whiskers sleep?"
    with Index.open(shared[1]) as idx:
        hybrid = [(h.chunk_id, h.score) for h in idx.search(q, k=4, mode="hybrid")]
        assert [(h.chunk_id, h.score) for h in idx.search(q, k=4)] == hybrid
        assert [(h.chunk_id, h.score) for h in RAG(idx, _Slow()).retrieve(q, k=4)] == hybrid
        # a config's mode is the default of that call; an explicit mode still wins
        keyword = [h.chunk_id for h in idx.search(q, k=4, mode="keyword")]
        assert [h.chunk_id for h in idx.search(q, config=SearchConfig(k=4, mode="keyword"))] == keyword
        assert [h.chunk_id for h in idx.search(q, mode="hybrid", config=SearchConfig(k=4, mode="keyword"))] \
            == [cid for cid, _ in hybrid]
        with pytest.raises(ValueError, match="mode must be one of"):
            idx.search(q, mode="sql")
    r = CliRunner().invoke(cli, ["search", str(shared[1]), q, "-k", "4", "--json"])
    assert r.exit_code == 0, r.output
    assert [(h["chunk_id"], h["score"]) for h in json.loads(r.stdout)] == hybrid
    assert "[default: hybrid]" in CliRunner().invoke(cli, ["search", "--help"]).output


@pytest.mark.parametrize("mode", ["keyword", "vector"])
def test_ask_mode_picks_the_passages(built: Path, mode: str) -> None:
    """``ask --mode`` retrieves as ``Index.search`` does in that mode: the same chunks with the same
    scores (BM25 and cosine scores differ, so a mode that did not reach the search would show)."""
    question = "Where does Whiskers sleep?"
    with Index.open(built) as idx:
        expected = {(h.chunk_id, round(h.score, 4)) for h in idx.search(question, k=2, mode=mode)}
    with OpenAIServer() as srv:
        r = CliRunner().invoke(cli, ["ask", str(built), question, "-k", "2", "--mode", mode,
                                     "--llm", srv.base_url, "--json"])
    assert r.exit_code == 0, r.output
    answer = json.loads(r.stdout.strip().splitlines()[-1])
    assert {(s["chunk_id"], round(s["score"], 4)) for s in answer["sources"]} == expected


@pytest.mark.parametrize("replay", [False, True])
def test_chat_shows_earlier_answers_only_with_replay(built: Path, replay: bool) -> None:
    """``slimrag chat`` keeps earlier answers out of the prompt (a small model copies them) unless
    ``--replay`` asks for the whole transcript."""
    with OpenAIServer() as srv:
        args = ["chat", str(built), "--llm", srv.base_url, *(["--replay"] if replay else [])]
        r = CliRunner().invoke(cli, args, input="Where does Whiskers sleep?\nAnd what does he eat?\n\n")
        assert r.exit_code == 0, r.output
        second = srv.requests_to("/v1/chat/completions")[1]["body"]["messages"]
    roles = [m["role"] for m in second]
    assert roles == (["system", "user", "assistant", "user"] if replay else ["system", "user"])
