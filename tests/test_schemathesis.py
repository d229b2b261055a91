"""Schemathesis against ``slimrag serve``: the published schema (``/openapi.json``) and the
server's behaviour agree, with every check on (no 5xx, every status and content type declared,
schema-valid bodies accepted, schema-invalid ones refused, the API key enforced).

A real uvicorn on 127.0.0.1 over a real index with an API key; the language model is the
deterministic test server (tests/openai_server.py), the cheapest real generator. Schemathesis runs
as its command, seeded and bounded in examples and time; the default suite runs a short pass, the
slow suite a longer one. On failure the test prints schemathesis' report (each failure with a
``curl`` line that reproduces it)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from asgi_server import running
from conftest import DOCS, write_tree
from openai_server import OpenAIServer

from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.rag.pipeline import RAG
from slimrag.serve.app import create_app

KEY = "schemathesis-key"
SEED = 20261123


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[str]:
    docs = write_tree(tmp_path_factory.mktemp("docs"), DOCS)
    with Index.build(docs, tmp_path_factory.mktemp("idx") / "fuzz.slimrag", embedder=embedder) as idx, \
            OpenAIServer() as echo, running(create_app(RAG(idx, echo.base_url), api_key=KEY)) as url:
        yield url


#: 413 is how the server refuses a body over its size limit, which JSON schema cannot state: a
#: refusal for invalid data, and an answer a schema-valid body may get. 404 is a well-formed
#: lookup of a chunk id that is not in the index (``GET /v1/passages/{chunk_id}``): almost every
#: id schemathesis draws.
CONFIG = """
[checks.negative_data_rejection]
expected-statuses = [400, 401, 404, 413]
[checks.positive_data_acceptance]
expected-statuses = ["2xx", 401, 404, 413]
"""


def schemathesis(url: str, examples: int, max_time_s: int, report: Path) -> subprocess.CompletedProcess[str]:
    config = report.with_name("schemathesis.toml")
    config.write_text(CONFIG)
    cmd = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run", f"{url}/openapi.json", "--checks", "all",
           "--phases", "examples,coverage,fuzzing", "--max-examples", str(examples), "--seed", str(SEED),
           "--max-time", str(max_time_s), "--header", f"Authorization: Bearer {KEY}", "--workers", "1",
           "--generation-database", "none", "--request-timeout", "30", "--no-color",
           "--report", "junit", "--report-junit-path", str(report)]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "", "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=max_time_s + 60)


def assert_no_failures(run: subprocess.CompletedProcess[str], report: Path) -> None:
    out = run.stdout + run.stderr
    failures = out[out.find("FAILURES"):out.find("SUMMARY")]
    assert run.returncode == 0, "\n".join(line[:400] for line in failures.splitlines())[-15_000:]
    assert "No issues found" in out and "8 selected / 8 total" in out, out[-5_000:]
    junit = report.read_text()
    assert 'failures="0"' in junit and 'errors="0"' in junit, junit[-3_000:]


def test_schema_and_server_agree(served: str, tmp_path: Path) -> None:
    """A short pass (5 examples per operation and phase, at most 30 s) in the default suite."""
    report = tmp_path / "junit.xml"
    assert_no_failures(schemathesis(served, examples=5, max_time_s=30, report=report), report)


@pytest.mark.slow
def test_schema_and_server_agree_long(served: str, tmp_path: Path) -> None:
    """50 examples per operation and phase, at most 10 minutes."""
    report = tmp_path / "junit.xml"
    assert_no_failures(schemathesis(served, examples=50, max_time_s=600, report=report), report)
