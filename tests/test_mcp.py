"""`slimrag mcp INDEX` driven by the official MCP SDK's own client, over stdio and streamable HTTP.

Each test starts the real command in a subprocess (``sys.executable -c 'from slimrag.cli import
main; main()' mcp INDEX``, what the ``slimrag`` script runs) against a small real index built in
``tmp_path`` with the real embedder, and talks to it with ``stdio_client`` + ``ClientSession``
(or ``streamable_http_client``). Ground truth is the library itself: what the tools return is
compared with `Index.search`, `Index.documents` and `Index.passage` on the same folder. ``ask``
runs against the suite's real local OpenAI-shaped server (`tests.openai_server`), so it is quick
and deterministic; answering with the embedded model is the library's own tests' business.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner
from conftest import DOCS, make_pdf, write_tree
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from openai_server import OpenAIServer

from slimrag.cli import cli
from slimrag.index.core import Index

TOOLS = {"search", "ask", "list_documents", "get_passage", "add_paths"}
CLI = [sys.executable, "-c", "from slimrag.cli import main; main()", "mcp"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
#: Seconds one whole client session may take (server start included) before the test fails.
SESSION_LIMIT_S = 120

#: A document long enough for several chunks, so a passage has neighbours on both sides.
STORY = "\n\n".join(f"Chapter {i}. The lighthouse log for night {i} records {w} ships passing the reef "
                    f"and a {c} sky over the harbour; the keeper trimmed the wick {i} times."
                    for i, (w, c) in enumerate(zip(["three", "five", "no", "eleven", "two", "seven"] * 6,
                                                   ["grey", "clear", "stormy", "red", "misty", "starry"] * 6, strict=True)))


Session = Callable[[ClientSession], Awaitable[Any]]


def run_stdio(index: Path, scenario: Session, *flags: str, limit_s: float = SESSION_LIMIT_S) -> Any:
    """Start ``slimrag mcp INDEX FLAGS`` and run ``scenario`` on an initialized client session."""
    params = StdioServerParameters(command=CLI[0], args=[*CLI[1:], str(index), *flags], env=ENV)

    async def main() -> Any:
        with anyio.fail_after(limit_s):
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                return await scenario(session)

    return anyio.run(main)


def structured(result: Any) -> dict[str, Any]:
    """A successful tool result's structured content; its text block says the same in JSON."""
    assert not result.is_error, result.content[0].text
    assert json.loads(result.content[0].text) == result.structured_content
    return result.structured_content


def error_text(result: Any) -> str:
    """A failed tool result's message."""
    assert result.is_error, f"expected a tool error, got {result.structured_content}"
    return result.content[0].text


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, embedder: Any) -> tuple[Path, Path]:
    """(folder, index): the shared small corpus, a PDF and a multi-chunk story, indexed once."""
    root = write_tree(tmp_path_factory.mktemp("mcp") / "docs", {**DOCS, "long/story.txt": STORY})
    (root / "papers").mkdir()
    (root / "papers" / "telescope.pdf").write_bytes(make_pdf("The telescope was pointed at the Andromeda galaxy."))
    out = root.parent / "idx"
    Index.build(root, out, embedder=embedder).close()
    return root, out


QUESTION = "What is the office cat called?"


@pytest.fixture(scope="module")
def session(corpus: tuple[Path, Path], embedder: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One stdio session (one server process: starting one costs seconds) that calls every tool,
    read-only calls first; what each call returned, and the library's answers to the same
    questions taken at the same moment (ground truth), by name. ``ask`` goes to the suite's local
    OpenAI-shaped server."""
    root, index = corpus
    new = write_tree(tmp_path_factory.mktemp("more"), {"b.md": "# Owls\n\nThe barn owl hunts voles at night.",
                                                       "blob.txt": "\x00\x01binary\x00" * 10})
    later = write_tree(tmp_path_factory.mktemp("later"), {"c.txt": "A quokka smiled at the ferry passengers."})

    async def scenario(s: ClientSession) -> dict[str, Any]:
        out: dict[str, Any] = {"tools": (await s.list_tools()).tools}
        with Index.open(index, embedder=embedder) as idx:
            out["truth"] = {"search": idx.search(QUESTION, k=3, mode="hybrid"),
                            "keyword": idx.search("Andromeda", k=5, mode="keyword"),
                            "docs": idx.documents()}
            story = sorted((h for h in idx.search("keeper trimmed the wick", k=20, mode="keyword")
                            if h.source == "long/story.txt"), key=lambda h: h.metadata["ordinal"])
            out["truth"]["excerpt"] = idx.passage(story[len(story) // 2].chunk_id, 1)
        call = s.call_tool
        out["search"] = await call("search", {"query": QUESTION, "k": 3})
        out["keyword"] = await call("search", {"query": "Andromeda", "mode": "keyword"})
        out["folder"] = await call("search", {"query": "ships", "k": 10, "source": "long"})
        out["docs"] = await call("list_documents", {})
        out["docs_glob"] = await call("list_documents", {"source": "guide/*", "limit": 1})
        out["passage"] = await call("get_passage", {"chunk_id": out["truth"]["excerpt"].chunk.chunk_id, "around": 1})
        pdf = out["truth"]["keyword"][0].chunk_id
        out["pdf_passage"] = await call("get_passage", {"chunk_id": pdf, "around": 0})
        out["bad_mode"] = await call("search", {"query": "cat", "mode": "fuzzy"})
        out["bad_k"] = await call("search", {"query": "cat", "k": 0})
        out["bad_source"] = await call("search", {"query": "cat", "source": "nowhere/"})
        out["bad_chunk"] = await call("get_passage", {"chunk_id": 10**9})
        out["bad_around"] = await call("get_passage", {"chunk_id": 0, "around": 99})
        out["bad_path"] = await call("add_paths", {"paths": ["/nonexistent/slimrag-mcp"]})
        out["ask"] = await call("ask", {"question": QUESTION, "k": 2})
        out["add"] = await call("add_paths", {"paths": [str(new)]})
        out["add_again"] = await call("add_paths", {"paths": [str(new / "b.md")]})
        out["owl"] = await call("search", {"query": "voles", "mode": "keyword"})
        with Index.open(index, embedder=embedder) as other:  # another writer, as `slimrag add` in a shell
            other.add(str(later / "c.txt"))
        out["quokka"] = await call("search", {"query": "quokka", "mode": "keyword"})
        out["docs_after"] = await call("list_documents", {})
        with Index.open(index, embedder=embedder) as idx:
            out["truth"]["docs_after"] = idx.documents()
        return out

    with OpenAIServer() as srv:
        out = run_stdio(index, scenario, "--llm", srv.base_url, "--max-tokens", "64", "--allow-add", str(new))
        out["chats"] = srv.requests_to("chat/completions")
    return out


def test_tools_are_listed_with_descriptions_and_schemas(session: dict[str, Any]) -> None:
    tools = session["tools"]
    assert {t.name for t in tools} == TOOLS
    for tool in tools:
        assert tool.description and len(tool.description) > 80, tool.name  # written for the model
        schema = tool.input_schema
        assert schema["type"] == "object" and schema["properties"], tool.name
        for name, prop in schema["properties"].items():
            assert prop.get("description"), f"{tool.name}.{name} has no description"
        assert tool.output_schema and tool.output_schema["type"] == "object", tool.name
    search = next(t for t in tools if t.name == "search")
    assert search.input_schema["required"] == ["query"]
    assert search.input_schema["properties"]["mode"]["enum"] == ["keyword", "vector", "hybrid"]
    assert search.annotations.read_only_hint is True


def test_search_returns_the_library_hits_with_sources(session: dict[str, Any]) -> None:
    truth = session["truth"]["search"]
    hits = structured(session["search"])["hits"]
    assert [h["chunk_id"] for h in hits] == [h.chunk_id for h in truth]
    assert hits[0]["source"] == "guide/cats.md" and "Whiskers" in hits[0]["text"]
    assert hits[0]["label"] == f"guide/cats.md#{truth[0].metadata['ordinal']}"
    assert [h["score"] for h in hits] == pytest.approx([h.score for h in truth], abs=1e-6)
    top, keyword = structured(session["keyword"])["hits"][0], session["truth"]["keyword"][0]
    assert top["source"] == "papers/telescope.pdf" == keyword.source
    assert top["page"] == keyword.metadata["page"] == 1  # the PDF reader's page travels with the hit
    assert {h["source"] for h in structured(session["folder"])["hits"]} == {"long/story.txt"}


def test_list_documents_and_get_passage_match_the_library(session: dict[str, Any]) -> None:
    docs, truth = structured(session["docs"]), session["truth"]["docs"]
    assert [d["source"] for d in docs["documents"]] == [d.source for d in truth]
    assert docs["total"] == len(truth) == len(DOCS) + 2
    glob = structured(session["docs_glob"])
    assert glob["total"] == 2 and len(glob["documents"]) == 1

    passage, excerpt = structured(session["passage"]), session["truth"]["excerpt"]
    assert passage["text"] == excerpt.chunk.text and passage["source"] == "long/story.txt"
    assert [c["chunk_id"] for c in passage["before"]] == [c.chunk_id for c in excerpt.before]
    assert [c["chunk_id"] for c in passage["after"]] == [c.chunk_id for c in excerpt.after]
    ordinal = excerpt.chunk.ordinal
    assert [c["ordinal"] for c in passage["before"] + passage["after"]] == [ordinal - 1, ordinal + 1]
    pdf = structured(session["pdf_passage"])
    assert (pdf["source"], pdf["page"], pdf["before"], pdf["after"]) == ("papers/telescope.pdf", 1, [], [])
    assert "Andromeda" in pdf["text"]


def test_bad_arguments_are_tool_errors_and_the_session_goes_on(session: dict[str, Any]) -> None:
    mode = error_text(session["bad_mode"])
    assert "keyword" in mode and "hybrid" in mode
    assert "greater than or equal to 1" in error_text(session["bad_k"])
    source = error_text(session["bad_source"])
    assert "no stored source matches 'nowhere/'" in source and "list_documents" in source
    assert "chunk 1000000000 is not in this index" in error_text(session["bad_chunk"])
    assert "around" in error_text(session["bad_around"])
    assert "/nonexistent/slimrag-mcp" in error_text(session["bad_path"])
    assert structured(session["ask"])["sources"], "calls after the errors are answered normally"


def test_ask_answers_through_the_configured_model(session: dict[str, Any]) -> None:
    got, chats = structured(session["ask"]), session["chats"]
    assert got["answer"] == f"echo: Question: {QUESTION}"  # the test server echoes the prompt's last line
    assert got["finish_reason"] == "stop" and not got["abstained"] and got["notice"] is None
    assert got["sources"][0]["source"] == "guide/cats.md"
    assert got["usage"]["prompt_tokens"] > 0 and got["usage"]["completion_tokens"] == len(got["answer"].split())
    assert len(chats) == 1 and chats[0]["body"]["max_tokens"] == 64
    assert "Whiskers" in "\n".join(m["content"] for m in chats[0]["body"]["messages"])  # the passage was sent


def test_add_paths_indexes_files_and_another_process_add_is_seen(session: dict[str, Any]) -> None:
    first = structured(session["add"])
    assert (first["added"], first["updated"], first["unchanged"]) == (1, 0, 0) and first["chunks"] >= 1
    assert [(s["kind"], s["source"].endswith("blob.txt")) for s in first["skipped"]] == [("binary", True)]
    again = structured(session["add_again"])
    assert (again["added"], again["unchanged"]) == (0, 1)
    assert structured(session["owl"])["hits"][0]["text"].endswith("The barn owl hunts voles at night.")
    assert "quokka" in structured(session["quokka"])["hits"][0]["text"]
    after, truth = structured(session["docs_after"]), session["truth"]["docs_after"]
    assert [d["source"] for d in after["documents"]] == [d.source for d in truth]
    assert after["total"] == len(DOCS) + 4


@pytest.mark.slow
def test_ask_with_the_embedded_model(corpus: tuple[Path, Path]) -> None:
    """The default generator (the embedded SmolLM2), loaded on the first ask inside the server:
    its load and generation must leave the protocol on stdout intact."""
    _, index = corpus

    async def scenario(s: ClientSession) -> dict[str, Any]:
        return structured(await s.call_tool("ask", {"question": QUESTION, "k": 2}, read_timeout_seconds=600))

    got = run_stdio(index, scenario, "--max-tokens", "32", limit_s=600)
    assert got["answer"].strip() and got["sources"][0]["source"] == "guide/cats.md"
    assert 0 < got["usage"]["completion_tokens"] <= 32 and got["usage"]["prompt_tokens"] > 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])



def wait_listening(proc: subprocess.Popen[str], port: int, timeout_s: float = 60) -> None:
    """Until ``slimrag mcp --http`` (``proc``) accepts connections on ``port``; fails the test when
    it exits first (with its stderr) or does not listen within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            pytest.fail(f"slimrag mcp --http exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                pytest.fail(f"slimrag mcp --http did not listen within {timeout_s:.0f} s")
            time.sleep(0.2)

def test_streamable_http_transport(corpus: tuple[Path, Path]) -> None:
    _, index = corpus
    port = _free_port()
    proc = subprocess.Popen([*CLI, str(index), "--http", "--port", str(port)], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_listening(proc, port)

        async def main() -> tuple[set[str], dict[str, Any]]:
            with anyio.fail_after(SESSION_LIMIT_S):
                async with streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (read, write), \
                        ClientSession(read, write) as s:
                    await s.initialize()
                    names = {t.name for t in (await s.list_tools()).tools}
                    return names, structured(await s.call_tool("search", {"query": "Whiskers", "mode": "keyword"}))

        names, found = anyio.run(main)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert names == TOOLS
    assert found["hits"][0]["source"] == "guide/cats.md"


def test_host_and_port_need_http(corpus: tuple[Path, Path]) -> None:
    _, index = corpus
    res = CliRunner().invoke(cli, ["mcp", str(index), "--port", "9000"])
    assert res.exit_code == 2 and "--port applies only with --http" in res.output


@pytest.mark.parametrize(("host", "local"), [("127.0.0.1", True), ("localhost", True), ("::1", True),
                                             ("0.0.0.0", False), ("192.168.1.5", False), ("box.lan", False)])
def test_what_counts_as_loopback(host: str, local: bool) -> None:
    from slimrag.mcp.http import is_loopback, needs_key

    assert is_loopback(host) is local
    assert (needs_key(host, None) is None) is local and needs_key(host, "k3y") is None


def test_source_filter_forms_against_sqlite_glob() -> None:
    """A stored name, a folder and a glob each become a GLOB that selects exactly what they mean,
    checked against SQLite's own GLOB (what the catalog filters with)."""
    import sqlite3

    from mcp.server.mcpserver.exceptions import ToolError

    from slimrag.mcp.server import source_pattern, sources_meant

    names = ["guide/cats.md", "guide/dogs.md", "guidebook.md", "notes/a[1].txt", "notes/b.txt"]
    db = sqlite3.connect(":memory:")

    def selected(value: str) -> list[str]:
        pattern = source_pattern(value, names)
        return [n for n in names if db.execute("SELECT ? GLOB ?", (n, pattern)).fetchone()[0]]

    assert selected("guide") == selected("guide/") == ["guide/cats.md", "guide/dogs.md"]
    assert selected("notes/a[1].txt") == ["notes/a[1].txt"]  # a name with glob characters, taken literally
    assert selected("*.md") == ["guide/cats.md", "guide/dogs.md", "guidebook.md"]
    for value in ("guide", "notes/a[1].txt", "*.md"):
        assert selected(value) == sources_meant(value, names)
    assert source_pattern(None, names) is None
    with pytest.raises(ToolError, match="no stored source matches 'gui'"):
        source_pattern("gui", names)


def test_readme_mcp_section_matches_the_command() -> None:
    """The README's Claude Desktop config is valid JSON that runs ``slimrag mcp``, and every flag
    its commands use is one ``slimrag mcp`` has."""
    import re

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## MCP \(Claude Code, Claude Desktop\)\n(.*?)(?=^## )", text, re.S | re.M)
    assert section, "README.md has no MCP section"
    config = json.loads(re.search(r"^```json\n(.*?)^```", section.group(1), re.S | re.M).group(1))  # type: ignore[union-attr]
    server = config["mcpServers"]["slimrag"]
    assert server["command"].endswith("slimrag") and server["args"][0] == "mcp"
    commands = [ln for ln in section.group(1).splitlines() if ln.startswith("claude mcp add slimrag -- slimrag mcp ")]
    assert commands, "no `claude mcp add` example"
    options = {o for p in cli.commands["mcp"].params for o in p.opts}
    used = {flag for ln in commands for flag in re.findall(r"(?<=\s)--[a-z-]+", ln.split(" -- ", 1)[1])}
    assert used <= options, used - options
