"""A real uvicorn server for an ASGI app, on 127.0.0.1 in a thread: what the HTTP tests serve
slimrag's own apps (``slimrag serve``, ``slimrag route``) with; the check of OpenAI's error
shape that both apps must answer bad requests with; and `Endless`, the generator that tests of a
client leaving mid-answer serve."""

from __future__ import annotations

import hashlib
import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn

from slimrag.config import GenerationConfig
from slimrag.llm.base import Delta, Generator
from slimrag.prompt import Prompt
from slimrag.types import Usage


@contextmanager
def running(app: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn from a thread on an ephemeral 127.0.0.1 port; yields the base
    URL; stops the server (and closes its socket) on exit."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def assert_error(response: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    """Assert ``response`` is an OpenAI-shaped error with ``status`` (and ``param``); its body."""
    assert response.status_code == status, response.text
    err = response.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["type"] == ("invalid_request_error" if status < 500 else "server_error")
    if param is not None:
        assert err["param"] == param
    return err


def cli_server_url(proc: subprocess.Popen[str]) -> str:
    """The base URL a ``slimrag serve``/``route`` subprocess (started with ``stderr=PIPE``,
    ``text=True`` and ``--port 0``) reports in its start-up line (it binds the port first, so it
    names the port the system chose; uvicorn's own "running on" line is kept off the screen)."""
    assert proc.stderr is not None
    for line in proc.stderr:
        if m := re.search(r"(?:running on|is at|are at) (http://127\.0\.0\.1:\d+)", line):
            return m.group(1)
    raise AssertionError("no start-up line naming the server's address")


class Endless(Generator):
    """A generator that would run for 5 s: a distinct piece every 10 ms, 500 at most (distinct, so
    the loop guard never stops it); records how many it made and when its stream was closed."""

    thread_safe = True

    def __init__(self) -> None:
        self.closed = threading.Event()
        self.pieces = 0

    def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
        try:
            for i in range(500):
                time.sleep(0.01)
                self.pieces += 1
                yield Delta(hashlib.sha1(str(i).encode()).hexdigest()[:6] + " ")
            yield Delta("", usage=Usage(), finish_reason="length")
        finally:
            self.closed.set()


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0, every: float = 0.02) -> None:
    """Poll ``condition`` every ``every`` seconds until it holds; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)
