"""The answer path imports neither transformers nor sentence-transformers (issue 21).

Each check runs in a fresh process, so nothing a test imported earlier can hide an import: one
process builds a small index into an empty ``SLIMRAG_HOME`` (the embedder's one-time ONNX export
may use transformers there), then new processes answer with ``RAG.ask``, a two-turn
``RAG.chat`` and the ``slimrag ask`` command, and print which of the two packages are in
``sys.modules`` afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slimrag.errors import ModelNotFoundError
from slimrag.llm import weights

FORBIDDEN = ("transformers", "sentence_transformers")

BUILD = """
import sys
from slimrag import Index
Index.build([("cats.md", "The office cat is named Whiskers. Whiskers sleeps on the radiator."),
             ("rain.md", "Rain is expected on Tuesday; sunny skies on Friday.")], sys.argv[1])
"""

LIBRARY = """
import json, sys
from slimrag import Index, RAG
from slimrag.config import GenerationConfig
rag = RAG(Index.open(sys.argv[1]), generation=GenerationConfig(max_new_tokens=6))
answer = rag.ask("What is the cat's name?", k=2)
chat = rag.chat()
chat.ask("Where does the cat sleep?", k=2)
chat.ask("And when does it rain?", k=2)
print(json.dumps({"text": answer.text, "loaded": [m for m in FORBIDDEN if m in sys.modules]}))
""".replace("FORBIDDEN", repr(FORBIDDEN))

CLI = """
import json, sys
from slimrag.cli import main
try:
    main()
except SystemExit as exc:
    assert not exc.code, exc.code
print(json.dumps({"loaded": [m for m in FORBIDDEN if m in sys.modules]}))
""".replace("FORBIDDEN", repr(FORBIDDEN))


def _run(code: str, *args: str, home: Path) -> str:
    env = {**os.environ, "SLIMRAG_HOME": str(home), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    try:
        weights.default_gguf_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    root = tmp_path_factory.mktemp("imports")
    home, index = root / "home", root / "idx.slimrag"
    _run(BUILD, str(index), home=home)
    return home, index


def test_library_ask_and_chat_answer_without_transformers(built: tuple[Path, Path]) -> None:
    home, index = built
    out = json.loads(_run(LIBRARY, str(index), home=home).strip().splitlines()[-1])
    assert out["text"].strip(), "no answer"
    assert out["loaded"] == []


def test_cli_ask_answers_without_transformers(built: tuple[Path, Path]) -> None:
    home, index = built
    out = _run(CLI, "ask", str(index), "What is the cat's name?", home=home)
    assert json.loads(out.strip().splitlines()[-1])["loaded"] == []
