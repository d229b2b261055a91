"""``slimrag serve --answer`` (issue 29 item 1: ``--answer free|grounded`` everywhere): the server's
answer mode for requests that name none, a request's own ``answer`` field over it. A real ``slimrag
serve`` process on 127.0.0.1 (port 0) over a real index, the deterministic OpenAI-compatible test
server (tests/openai_server.py) as its model: a remote model answers free-form unless told."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
from asgi_server import cli_server_url
from openai_server import OpenAIServer
from test_serve import index as index  # noqa: F401  (the fixture: the served test corpus, built once)

from slimrag.index.core import Index

QUESTION = "What is the office cat called?"


def served_mode(index: Index, echo: OpenAIServer, flags: list[str], bodies: list[dict[str, object]]) -> list[str]:
    """``slimrag serve`` with ``flags``; the ``slimrag.mode`` of a completion for each request body."""
    cmd = [sys.executable, "-c", "from slimrag.cli import main; main()", "serve", str(index.root), "--port", "0",
           "--llm", echo.base_url, *flags]
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        url = cli_server_url(proc)
        out = []
        with httpx.Client(base_url=url, timeout=60) as c:
            for body in bodies:
                r = c.post("/v1/chat/completions", json={"model": "slimrag", "messages": [
                    {"role": "user", "content": QUESTION}], **body})
                assert r.status_code == 200, r.text
                out.append(r.json()["slimrag"]["mode"])
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_serve_answer_sets_the_default_and_a_request_overrides_it(index: Index, echo: OpenAIServer) -> None:  # noqa: F811
    asks = [{}, {"answer": "free"}, {"answer": "grounded"}]
    assert served_mode(index, echo, [], asks) == ["free", "free", "grounded"]  # a remote model: free unless told
    assert served_mode(index, echo, ["--answer", "grounded"], asks) == ["grounded", "free", "grounded"]


def test_serve_refuses_an_unknown_answer_mode(index: Index) -> None:  # noqa: F811
    proc = subprocess.run([sys.executable, "-c", "from slimrag.cli import main; main()", "serve", str(index.root),
                           "--port", "0", "--answer", "clever"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2 and "--answer" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
