"""Nothing from a dependency on the user's screen (issue 20, item 2): `ask`, `chat` and `demo` print
slimrag's own output only, and the debugging switches bring the libraries' output back.

The commands run as a user runs them: the installed ``slimrag`` script in a fresh process, with an
empty ``SLIMRAG_HOME`` for the first of them, so the first-run work (the embedder's ONNX export, the
LLM's weights) happens here too, where its bars and warnings used to show. Their stdout and stderr
together must hold none of the marks a library leaves: a warning line (``…Warning:``, always
printed with the library's file path under ``site-packages``), a traceback, a tqdm bar (``%|``,
``it/s``), "Loading weights", or a library's name in a log line.

The switch test drives the real libraries (transformers' logger and its tqdm, uvicorn's logging
set-up, a warning raised from torch's module) in a child process after `quiet_dependencies`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from slimrag import Index
from slimrag.cli.quiet import QUIET_ENV
from slimrag.errors import ModelNotFoundError
from slimrag.llm.weights import default_gguf_path

SLIMRAG = Path(sys.executable).with_name("slimrag")

#: What a library leaves on the screen; slimrag's own output has none of these.
#: The line that heads an answer's sources (`slimrag.cli.feedback`).
SOURCES = re.compile(r"^Sources( used)?:", re.M)
NOISE = re.compile(r"Warning\b|warnings\.warn|Traceback|site-packages|%\||\d it/s|s/it\]|Loading weights|"
                   r"\b(transformers|torch|uvicorn|huggingface_hub|sentence_transformers|ray)\b[.:]", re.I)


def env_for(home: Path, **extra: str) -> dict[str, str]:
    """A child's environment without the switches: neither the user's nor the ones an in-process
    CLI test of this run left in ``os.environ`` (`quiet_dependencies` sets `QUIET_ENV` there)."""
    env = dict(os.environ, SLIMRAG_HOME=str(home), OMP_NUM_THREADS="1", **extra)
    for key in ("PYTHONWARNINGS", "SLIMRAG_LOG", *QUIET_ENV):
        if key not in extra:
            env.pop(key, None)
    return env


def assert_clean(name: str, out: str, err: str) -> None:
    noise = [line for line in (out + err).splitlines() if NOISE.search(line)]
    assert noise == [], f"{name} printed a dependency's output:\n" + "\n".join(noise[:20])


@pytest.fixture(scope="module")
def notes_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        default_gguf_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    notes = tmp_path_factory.mktemp("notes")
    (notes / "crates.txt").write_text("Crate 2 holds 17 gears. Crate 1 holds 3 gears.\n")
    (notes / "guide.md").write_text("# Guide\n\nThe gears are oiled every Monday by the night shift.\n")
    index = tmp_path_factory.mktemp("idx") / "n.slimrag"
    Index.build(notes, index).close()
    return index


def test_ask_and_chat_print_only_slimrag_output(notes_index: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"  # empty: ask does the first-run work, chat then runs warm
    question = "How many gears in crate 2?"
    ask = subprocess.run([str(SLIMRAG), "ask", str(notes_index), question, "--max-tokens", "24"],
                         env=env_for(home), capture_output=True, text=True, timeout=600)
    assert ask.returncode == 0, ask.stderr[-3000:]
    assert_clean("ask", ask.stdout, ask.stderr)
    assert "[crates.txt#0]" in ask.stdout, ask.stdout  # the grounded answer's lead cites it

    chat = subprocess.run([str(SLIMRAG), "chat", str(notes_index), "--max-tokens", "24"],
                          input=f"{question}\nWhen are the gears oiled?\n\n", env=env_for(home),
                          capture_output=True, text=True, timeout=600)
    assert chat.returncode == 0, chat.stderr[-3000:]
    assert_clean("chat", chat.stdout, chat.stderr)
    assert len(SOURCES.findall(chat.stdout)) == 2, chat.stdout


@pytest.mark.slow
def test_demo_prints_only_slimrag_output(tmp_path: Path) -> None:
    """The whole demo from an empty home: corpus, index, LLM load and two streamed answers."""
    try:
        default_gguf_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    demo = subprocess.run([str(SLIMRAG), "demo"], env=env_for(tmp_path / "home"), capture_output=True,
                          text=True, timeout=1200)
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert_clean("demo", demo.stdout, demo.stderr)
    assert demo.stdout.count("\nQ: ") == 2 and len(SOURCES.findall(demo.stdout)) == 2, demo.stdout
    assert all(line[3:].strip() for line in demo.stdout.splitlines() if line.startswith("A: ")), demo.stdout


#: A child process: silence as the CLI does, then let each library speak as it does when a model
#: loads or a server starts.
NOISY = """
import logging, sys, warnings
from slimrag.cli.quiet import quiet_dependencies
quiet_dependencies(verbose="-v" in sys.argv)
logging.basicConfig(level=logging.INFO)  # as the CLI's own set-up does with -v
warnings.warn_explicit("past_key_values is deprecated", FutureWarning, "torch/nn/modules/module.py", 1789,
                       module="torch.nn.modules.module")
from transformers.utils import logging as hf_logging
hf_logging.get_logger("transformers.modeling_utils").warning("a transformers warning")
for _ in hf_logging.tqdm(range(3), desc="Loading weights"):
    pass
import uvicorn
uvicorn.Config(lambda scope, receive, send: None, log_level="info")  # uvicorn sets its logging up here
logging.getLogger("uvicorn.access").info("127.0.0.1 - GET /v1/status 200")
logging.getLogger("uvicorn.error").error("an error of the server")
logging.getLogger("slimrag.index").warning("skipped a.bin: unsupported")
"""


def run_noisy(*args: str, **env: str) -> str:
    done = subprocess.run([sys.executable, "-c", NOISY, *args], env=env_for(Path("/nonexistent"), **env),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def test_libraries_are_quiet_and_the_switches_bring_them_back() -> None:
    quiet = run_noisy()
    for noise in ("past_key_values", "a transformers warning", "Loading weights", "GET /v1/status"):
        assert noise not in quiet
    assert "an error of the server" in quiet  # a library's error still shows
    assert "skipped a.bin" in quiet  # slimrag's own warnings are not touched

    verbose = run_noisy("-v")  # slimrag -v
    for noise in ("past_key_values", "a transformers warning", "Loading weights", "GET /v1/status"):
        assert noise in verbose
    logged = run_noisy(SLIMRAG_LOG="info")
    assert "a transformers warning" in logged and "GET /v1/status" in logged and "Loading weights" in logged
    warned = run_noisy(PYTHONWARNINGS="default")
    assert "FutureWarning: past_key_values is deprecated" in warned and "Loading weights" not in warned


def test_logging_after_a_captured_cli_run_reaches_the_live_stderr() -> None:
    """A verb run inside click's captured streams (as the CLI tests do) must not leave the root
    logger bound to that stream: once it is closed, the first library to log (torch at interpreter
    exit) printed ``--- Logging error ---`` at the end of ``make test``. A child process runs the
    CLI in a `CliRunner`, then logs as torch does after the runner has closed its stream."""
    code = (
        "import logging\n"
        "from click.testing import CliRunner\n"
        "from slimrag.cli import cli\n"
        "r = CliRunner().invoke(cli, ['-v', 'info', '/nonexistent-index'])\n"
        "assert r.exit_code != 0, r.output\n"
        "logging.getLogger('torch.late').error('logged after the runner closed its stream')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Logging error" not in done.stderr
    assert "logged after the runner closed its stream" in done.stderr
