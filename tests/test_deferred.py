"""A generator built on a background thread (`slimrag.llm.deferred`, issue 28 item 5).

A one-shot ``ask`` hands its `RAG` a `Deferred`: the capability attributes come from what the
backend declares, the build (torch, the engine) runs on a thread, and a build's error is raised
where the model is first needed. The race between that thread's imports and the main thread's
(the RAG layer, the embedder's runtimes, torch itself for a ``torch-bf16`` index) runs here in
fresh processes, where the imports really happen, with the embedded model answering at the end.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slimrag.errors import ModelNotFoundError, RequestError
from slimrag.llm import backends
from slimrag.llm.backends import LOCAL, make_deferred
from slimrag.llm.deferred import Declared, Deferred
from slimrag.prompt import Prompt


def test_the_local_generator_has_the_capabilities_its_backend_declares() -> None:
    from slimrag.llm.local import LocalGenerator

    gen = LocalGenerator()
    assert (gen.thread_safe, gen.default_repetition_penalty, gen.shadows_prefix_cache, gen.default_answer_mode) == (
        LOCAL.thread_safe, LOCAL.default_repetition_penalty, LOCAL.shadows_prefix_cache, LOCAL.default_answer_mode)


def test_an_option_the_backend_does_not_declare_raises_at_once() -> None:
    with pytest.raises(RequestError, match="remote model only"):
        make_deferred(None, model="gpt-x")


def test_a_remote_spec_is_built_at_once() -> None:
    gen = make_deferred("http://127.0.0.1:9/v1", model="m")
    assert not isinstance(gen, Deferred) and gen.shadows_prefix_cache


def test_a_failed_build_is_raised_where_the_model_is_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(spec: str | None) -> backends.Generator:
        raise RequestError("no such model here")

    monkeypatch.setitem(backends.BACKENDS, "broken", broken)
    monkeypatch.setitem(backends.DECLARED, "broken", Declared(default_answer_mode="grounded"))
    gen = make_deferred("broken")
    assert isinstance(gen, Deferred) and gen.default_answer_mode == "grounded"  # known before the build
    for call in (gen.load, gen.planning_cache, lambda: gen.stream(Prompt("q"))):
        with pytest.raises(RequestError, match="no such model here"):
            call()


RACE = r"""
import sys, threading
first = {}
def hook(event, args):
    if event == "import" and args[0] == "torch" and "torch" not in first:
        first["torch"] = threading.current_thread().name
sys.addaudithook(hook)
from slimrag.llm.backends import make_deferred
gen = make_deferred(None, cache=None, bf16_prefill=False)
import slimrag.rag.session, slimrag.rag.pipeline, slimrag.embed.local, onnxruntime  # the main thread's side
main_thread_torch = first.get("torch") == "MainThread"
if sys.argv[1] == "bf16":
    import torch  # a torch-bf16 index: its embedder imports torch on the main thread, at the same time
from slimrag.config import GenerationConfig
from slimrag.prompt import Prompt
out = gen.generate(Prompt("What is 2 + 2?"), GenerationConfig(max_new_tokens=3))
print(first.get("torch"), main_thread_torch, out.usage.completion_tokens)
"""


@pytest.mark.parametrize("side", ["onnx", "bf16"])
def test_the_build_thread_and_the_main_thread_import_side_by_side(side: str, tmp_path: Path) -> None:
    """Three fresh processes per side: no import deadlock or half-initialized module, the model
    answers, and on the ONNX side torch is first imported by the build thread, not the main one."""
    from slimrag.llm.weights import default_gguf_path

    try:
        default_gguf_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", SLIMRAG_HOME=str(tmp_path))
    for _ in range(3):
        run = subprocess.run([sys.executable, "-c", RACE, side], env=env, capture_output=True, text=True,
                             timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        thread, main_thread_torch, tokens = run.stdout.split()
        assert int(tokens) >= 1
        if side == "onnx":
            assert (thread, main_thread_torch) == ("slimrag-deferred", "False")


def test_an_ask_that_never_needs_the_model_exits_cleanly(tmp_path: Path) -> None:
    """Below the relevance floor the answer never calls the model, so the process ends while the
    build thread still imports torch or loads the model: it must wait for it and exit 0 (it
    aborted with status 134, "terminate called without an active exception")."""
    from slimrag import Index
    from slimrag.llm.weights import default_gguf_path

    try:
        default_gguf_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    index = tmp_path / "n.slimrag"
    Index.build([("crates.txt", "Crate 2 holds 17 gears. Crate 1 holds 3 gears.\n")], index).close()
    slimrag = Path(sys.executable).with_name("slimrag")
    env = dict(os.environ, HF_HUB_OFFLINE="1", SLIMRAG_HOME=str(tmp_path / "home"))
    for _ in range(3):
        run = subprocess.run([str(slimrag), "ask", str(index), "What is the capital of Mongolia?"], env=env,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        assert "nothing in the indexed files" in run.stdout


def test_the_main_threads_modules_of_an_onnx_ask_do_not_import_torch() -> None:
    """What the main thread of an ``ask`` on an ONNX index imports leaves torch to the build's
    thread (the audit hook above sees only a module's first import; this sees none at all)."""
    code = ("import sys, slimrag.cli.asking, slimrag.rag.pipeline, slimrag.rag.session, slimrag.embed.local, "
            "slimrag.llm.backends; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"


def test_an_exit_during_the_build_starts_no_load() -> None:
    """The exit waits for a build under way, and the built generator is then not loaded."""
    import threading
    import time

    release, loads = threading.Event(), []

    class Built:
        name = "built"

        def load(self) -> None:
            loads.append(1)

    def build() -> Built:
        release.wait(10)
        return Built()

    gen = Deferred(build, Declared())  # type: ignore[arg-type]
    exiting = threading.Thread(target=gen._at_exit)
    exiting.start()
    deadline = time.monotonic() + 10
    while not gen._exiting.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)
    release.set()
    exiting.join(10)
    assert not exiting.is_alive() and gen.generator().name == "built" and loads == []
