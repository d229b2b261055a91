"""MCP's ``ask`` chooses the answer mode (issue 29: ``--answer free|grounded`` everywhere): without
``answer`` the model's own (a remote model: free), with it the one asked for, and the result says which
(``mode``, with the check's verdict), as the API and the CLI send it (`slimrag.rag.wire`). A real
``slimrag mcp`` over stdio, the corpus of tests/test_mcp.py and its deterministic test model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mcp import ClientSession
from openai_server import OpenAIServer
from test_mcp import QUESTION, run_stdio, structured
from test_mcp import corpus as corpus  # noqa: F401  (the fixture, shared with the other MCP tests)


def test_ask_takes_the_answer_mode(corpus: tuple[Path, Path]) -> None:  # noqa: F811
    _, index = corpus

    async def scenario(s: ClientSession) -> dict[str, Any]:
        return {name: structured(await s.call_tool("ask", {"question": QUESTION, "k": 2, **args}))
                for name, args in (("default", {}), ("grounded", {"answer": "grounded"}), ("free", {"answer": "free"}))}

    with OpenAIServer() as srv:
        got = run_stdio(index, scenario, "--llm", srv.base_url, "--max-tokens", "32")
    assert {name: r["mode"] for name, r in got.items()} == {"default": "free", "grounded": "grounded", "free": "free"}
    grounded = got["grounded"]
    assert grounded["verdict"] in ("supported", "partial", "not_backed") and grounded["shown"]
    assert grounded["evidence"] and grounded["answer"].startswith(grounded["evidence"][0]["text"])  # the passages speak first
