"""A cold ``ask`` streams what needs no model before the model is loaded (issue 28 item 5).

A grounded answer leads with the passages' best sentences (`slimrag.rag.grounded`): retrieval and
that lead need the index and the embedder only. ``slimrag ask`` loads the model on a background
thread and starts the answer at once, so the lead must not wait for the load. The check here uses
a generator whose model file does not exist: the lead streams, and only the model's own sentence
fails, with the loader's message. A free answer's passages are planned against the model's cache,
so it needs the model before its first piece.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slimrag import RAG, Index
from slimrag.errors import ModelNotFoundError
from slimrag.llm.local import LocalGenerator

NOTES = {
    "crates.txt": "Crate 2 holds 17 gears. Crate 1 holds 3 gears. The gears are made of brass.",
    "rain.txt": "Rain is expected on Tuesday. Friday will be sunny and warm.",
}
QUESTION = "How many gears are in crate 2?"
SLIMRAG = Path(sys.executable).with_name("slimrag")


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cold") / "n.slimrag"
    Index.build(list(NOTES.items()), path).close()
    return path


def test_grounded_lead_streams_without_the_model(index: Path, tmp_path: Path) -> None:
    missing = LocalGenerator(tmp_path / "absent.gguf")
    with Index.open(index) as idx:
        stream = iter(RAG(idx, missing, answer="grounded").respond(QUESTION, k=2))
        lead = next(stream)
        assert "17 gears" in lead and "[crates.txt#0]" in lead
        with pytest.raises(ModelNotFoundError, match="absent.gguf"):
            next(stream)


def test_free_answer_needs_the_model_first(index: Path, tmp_path: Path) -> None:
    missing = LocalGenerator(tmp_path / "absent.gguf")
    with Index.open(index) as idx, pytest.raises(ModelNotFoundError):
        next(iter(RAG(idx, missing, answer="free").respond(QUESTION, k=2)))


def test_cli_ask_leads_with_the_evidence(index: Path, tmp_path: Path) -> None:
    """The whole command, in a new process with an empty home: the first line out is an evidence
    sentence with its label, and the command ends cleanly after the model's sentence."""
    from slimrag.llm.weights import default_gguf_path

    try:
        default_gguf_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    env = dict(os.environ, SLIMRAG_HOME=str(tmp_path / "home"), OMP_NUM_THREADS="1")
    done = subprocess.run([str(SLIMRAG), "ask", str(index), QUESTION, "-k", "2", "--max-tokens", "16"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    first = done.stdout.splitlines()[0]
    assert "17 gears" in first and first.endswith("[crates.txt#0]"), done.stdout
    assert "Sources used:" in done.stdout, done.stdout
