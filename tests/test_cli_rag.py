"""The CLI (click's CliRunner, real index on disk) and the RAG pipeline against a real OpenAI-compatible
server on 127.0.0.1 (tests/openai_server.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from openai_server import OpenAIServer

from slimrag.cli import cli
from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.rag.pipeline import RAG
from slimrag.types import Answer


@pytest.fixture()
def index(docs_dir: Path, tmp_path: Path, embedder: LocalEmbedder) -> Index:
    return Index.build(docs_dir, tmp_path / "cli.slimrag", embedder=embedder)


def test_cli_build_search_add_remove_info(docs_dir: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    out = str(tmp_path / "c.slimrag")
    r = runner.invoke(cli, ["build", str(docs_dir), "-o", out, "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output.strip().splitlines()[-1])
    assert rep["added"] == 9 and rep["chunks"] >= 9
    r = runner.invoke(cli, ["search", out, "office cat", "-k", "2", "--json"])
    hits = json.loads(r.output)
    assert hits[0]["source"] == "guide/cats.md" and len(hits) == 2
    r = runner.invoke(cli, ["add", out, str(docs_dir), "--json"])
    assert json.loads(r.output.strip().splitlines()[-1])["chunks"] == 0
    r = runner.invoke(cli, ["remove", out, "guide/cats.md"])
    assert r.exit_code == 0 and "removed" in r.output
    r = runner.invoke(cli, ["info", out, "--json", "--docs"])
    info = json.loads(r.output)
    assert info["index"]["counts"]["documents"] == 8
    assert "guide/cats.md" not in [d["source"] for d in info["documents"]]
    r = runner.invoke(cli, ["search", out, "office cat", "--mode", "keyword"])
    assert r.exit_code == 0 and "cats.md" not in r.output


def test_cli_reports_missing_index_clearly(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["search", str(tmp_path), "x"])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.exc_info  # no traceback
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1 and r.stdout == ""
    assert f"{tmp_path} is not a slimrag index" in r.stderr and "slimrag build" in r.stderr


def test_rag_ask_with_remote_llm_cites_sources(index: Index) -> None:
    with OpenAIServer() as srv:
        rag = RAG(index, llm=srv.base_url)
        ans = rag.ask("What is the office cat called?", k=3)
        assert isinstance(ans, Answer)
        assert ans.text.startswith("echo: Question: What is the office cat called?")
        assert ans.sources[0].source == "guide/cats.md" and len(ans.sources) == 3
        assert ans.usage.prompt_tokens > 0 and ans.usage.ttft_s > 0 and ans.usage.total_s >= ans.usage.ttft_s
        # the passages reach the model labelled by source, never by rank number
        user = srv.requests_to("/v1/chat/completions")[-1]["body"]["messages"][-1]["content"]
        assert "[guide/cats.md#0]" in user and "Whiskers" in user
        # the same question again: identical bytes, so the server's prefix cache hits fully
        again = rag.ask("What is the office cat called?", k=3)
        assert again.usage.cached_tokens == again.usage.prompt_tokens
        pieces = list(rag.stream("What is the office cat called?", k=3))
        assert "".join(pieces).strip() == ans.text


def test_chat_keeps_history(index: Index) -> None:
    with OpenAIServer() as srv:
        conv = RAG(index, llm=srv.base_url).chat()
        conv.ask("Where does Whiskers sleep?")
        second = conv.ask("And in summer?")
        assert second.text.endswith("And in summer?")
        msgs = srv.requests_to("/v1/chat/completions")[-1]["body"]["messages"]
        assert [m["role"] for m in msgs] == ["system", "user"]  # earlier questions ride in the user message
        assert "- Where does Whiskers sleep?" in msgs[1]["content"] and "echo:" not in msgs[1]["content"]


def test_cli_ask_streams_then_lists_sources(index: Index) -> None:
    index.close()
    with OpenAIServer() as srv:
        r = CliRunner().invoke(cli, ["ask", str(index.root), "How do I bake bread?", "--llm", srv.base_url])
        assert r.exit_code == 0, r.output
        assert "echo: Question: How do I bake bread?" in r.output
        assert "Sources used:" in r.output and "notes/recipes.rst#" in r.output


def test_cli_ask_shows_evidence_and_sources_used(index: Index) -> None:
    index.close()
    with OpenAIServer() as srv:
        r = CliRunner().invoke(cli, ["ask", str(index.root), "How do I bake bread?", "--llm", srv.base_url])
        assert r.exit_code == 0, r.output
        evidence = r.output.split("Evidence:\n")[1].splitlines()
        assert "Bake at 230 degrees" in r.output.split("Evidence:")[1].split("Sources")[0]
        assert evidence[0].startswith('  "') and evidence[0].endswith("[notes/recipes.rst#0]")
        assert "Sources used:" in r.output and "Also retrieved:" in r.output


def test_cli_ask_no_llm_answers_with_evidence_alone(index: Index) -> None:
    index.close()
    r = CliRunner().invoke(cli, ["ask", str(index.root), "How long should lentil soup simmer?", "--no-llm"])
    assert r.exit_code == 0, r.output
    first = r.output.splitlines()[0]
    assert "half an hour" in first and first.endswith("[notes/recipes.rst#0]")
    assert "evidence only, no model" in r.output and "Sources used:" in r.output
    r = CliRunner().invoke(cli, ["ask", str(index.root), "How long should lentil soup simmer?", "--no-llm", "--json"])
    ans = json.loads(r.output)
    assert ans["evidence"][0]["label"] == "notes/recipes.rst#0" and ans["usage"]["completion_tokens"] == 0
    assert set(ans["used"]) <= {s["source"] + "#" + str(s["metadata"].get("ordinal", 0)) for s in ans["sources"]}


def test_cli_ask_says_when_the_answer_is_not_backed(index: Index) -> None:
    """A remote model answers freely by default; an answer no passage backs is followed by the
    verdict and the passages' sentences, cited, so it is not the last thing the reader sees."""
    from slimrag.rag.verdict import NOT_BACKED

    index.close()
    with OpenAIServer() as srv:
        r = CliRunner().invoke(cli, ["ask", str(index.root), "How do I bake bread?", "--llm", srv.base_url])
        assert r.exit_code == 0, r.output
        after = r.output.split("echo: Question: How do I bake bread?", 1)[1]
        assert NOT_BACKED in after and "Bake at 230 degrees" in after.split(NOT_BACKED)[1].split("Evidence:")[0]
        r = CliRunner().invoke(cli, ["ask", str(index.root), "How do I bake bread?", "--llm", srv.base_url, "--json"])
        ans = json.loads(r.output)
        assert ans["mode"] == "free" and ans["verdict"] == "not_backed" and ans["shown"].startswith(NOT_BACKED)


def test_cli_ask_grounded_streams_the_passages_first(index: Index) -> None:
    from slimrag.rag.attribution import UNSUPPORTED_MARK
    from slimrag.rag.grounded import IN_SHORT

    index.close()
    with OpenAIServer() as srv:
        r = CliRunner().invoke(cli, ["ask", str(index.root), "How do I bake bread?", "--llm", srv.base_url,
                                     "--answer", "grounded"])
        assert r.exit_code == 0, r.output
        lead, rest = r.output.split(IN_SHORT, 1)
        assert "Bake at 230 degrees" in lead and lead.splitlines()[0].endswith("]")
        assert rest.splitlines()[0].endswith(UNSUPPORTED_MARK)  # the echo is no answer: marked where it stands
        assert "is not backed by the passages" in rest and "Evidence:" not in r.output  # the lead was the evidence
        asked = srv.requests[-1]["body"]["messages"][-1]["content"]
        assert "Bake at 230 degrees" in asked and "Soup" not in asked  # evidence sentences, not whole passages
