"""The first `ask` and `chat` on a new machine: fresh processes, an empty model cache (issue 22).

With an empty ``SLIMRAG_HOME`` both caches are cold: the embedder is exported to ONNX on the main
thread while the LLM's GGUF is converted on the preload thread, and both go through transformers,
whose lazy module is not safe to import from two threads at once. Before `slimrag.hf` serialized
them, ``ask`` died with ``ImportError: cannot import name 'AutoModelForCausalLM'``. The two
commands run side by side, each with its own empty cache, so the test costs one cold start.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slimrag import Index
from slimrag.errors import ModelNotFoundError
from slimrag.llm.weights import default_gguf_path

SLIMRAG = Path(sys.executable).with_name("slimrag")


def cold_env(home: Path) -> dict[str, str]:
    env = dict(os.environ, SLIMRAG_HOME=str(home), OMP_NUM_THREADS="1")
    env.pop("PYTHONWARNINGS", None)
    return env


def test_first_ask_and_chat_with_an_empty_model_cache(tmp_path: Path) -> None:
    try:
        default_gguf_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "crates.txt").write_text("Crate 2 holds 17 gears. Crate 1 holds 3 gears.\n")
    index = tmp_path / "n.slimrag"
    Index.build(notes, index).close()

    question = "How many gears in crate 2?"
    ask = subprocess.Popen([str(SLIMRAG), "ask", str(index), question, "--max-tokens", "24"],
                           env=cold_env(tmp_path / "home-ask"), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    chat = subprocess.Popen([str(SLIMRAG), "chat", str(index), "--max-tokens", "24"],
                            env=cold_env(tmp_path / "home-chat"), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    chat_out, chat_err = chat.communicate(question + "\n\n", timeout=300)
    ask_out, ask_err = ask.communicate(timeout=300)

    for name, rc, out, err in (("ask", ask.returncode, ask_out, ask_err),
                               ("chat", chat.returncode, chat_out, chat_err)):
        assert rc == 0, f"{name} exited {rc}:\n{err[-3000:]}"
        assert "Traceback" not in out + err, f"{name}:\n{err[-3000:]}"
        # the default (grounded) answer leads with the passages' best sentences, each with its
        # label, so the evidence is the answer's first lines (a free answer prints it after)
        assert "gears" in out.lower(), f"{name} printed no answer:\n{out}"
        assert "[crates.txt#0]" in out, f"{name} showed no evidence or source:\n{out}"
