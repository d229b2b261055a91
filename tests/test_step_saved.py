"""The fused decode step saved on disk (``slimrag.llm.model.saved_step``): a later process loads it, a damaged entry is rebuilt.

Ground truth: the graph built in this process. A loaded entry must give bitwise its logits (the
same weights, packed by the same ONNX Runtime on the same CPU); a damaged entry must be a miss
(rebuilt, with a warning), never an error. The saving machinery is checked on a small real ONNX
graph (a MatMul over a 64 x 64 weight), and once on the embedded SmolLM2.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from slimrag.llm import weights
from slimrag.llm.model.qlinear import cpu_options
from slimrag.llm.model.saved_step import SavedSteps
from slimrag.llm.model.step import StepGraph

os.environ["HF_HUB_OFFLINE"] = "1"

W = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)


def _matmul_model(w: np.ndarray = W):  # noqa: ANN202  (an onnx ModelProto)
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
                              [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _session(saved: SavedSteps, key: str = "k1", w: np.ndarray = W) -> tuple[object, bool]:
    builds = []

    def build():  # noqa: ANN202
        builds.append(1)
        return _matmul_model(w), {}

    sess, loaded = saved.session(key, build, lambda weights: cpu_options(1, weights))
    assert loaded == (not builds)  # loaded exactly when nothing was built
    return sess, loaded


def _run(sess) -> np.ndarray:  # noqa: ANN001
    x = np.arange(64, dtype=np.float32).reshape(1, 64) / 64
    return sess.run(None, {"x": x})[0]


def test_a_saved_entry_is_loaded_by_the_next_session_and_computes_the_same(tmp_path: Path) -> None:
    saved = SavedSteps(tmp_path)
    first, loaded = _session(saved)
    assert not loaded
    assert sorted(p.name for p in (tmp_path / "k1").iterdir()) == ["manifest.json", "step.bin", "step.onnx"]
    second, loaded = _session(saved)
    assert loaded
    np.testing.assert_array_equal(_run(first), _run(second))
    np.testing.assert_allclose(_run(second), (np.arange(64, dtype=np.float32).reshape(1, 64) / 64) @ W, rtol=1e-5)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]  # nothing half-written left


def test_saving_an_entry_hashes_each_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A miss writes the entry's manifest (one hash per file) and loads what it wrote without
    hashing the files again; a later session checks them (one hash per file again)."""
    from slimrag.llm.model import saved_step

    hashed: list[str] = []
    real = saved_step._digest
    monkeypatch.setattr(saved_step, "_digest", lambda path: hashed.append(path.name) or real(path))
    saved = SavedSteps(tmp_path)
    _session(saved)
    assert sorted(hashed) == ["step.bin", "step.onnx"]
    hashed.clear()
    _, loaded = _session(saved)
    assert loaded and sorted(hashed) == ["step.bin", "step.onnx"]


@pytest.mark.parametrize("damage", ["truncate_bin", "overwrite_bin", "garbage_onnx", "no_manifest", "foreign_manifest"])
def test_a_damaged_entry_is_rebuilt_with_a_warning(tmp_path: Path, damage: str) -> None:
    saved = SavedSteps(tmp_path)
    want = _run(_session(saved)[0])
    entry = tmp_path / "k1"
    if damage == "truncate_bin":
        with (entry / "step.bin").open("r+b") as f:
            f.truncate((entry / "step.bin").stat().st_size // 2)
    elif damage == "overwrite_bin":  # same size, other bytes: caught by the strips' hashes
        (entry / "step.bin").write_bytes(b"\x7f" * (entry / "step.bin").stat().st_size)
    elif damage == "garbage_onnx":
        (entry / "step.onnx").write_bytes(b"not a model" * 10)
    elif damage == "no_manifest":
        (entry / "manifest.json").unlink()
    else:
        (entry / "manifest.json").write_text(json.dumps({"step.onnx": {"bytes": 1, "digest": "x"}}))
    with pytest.warns(UserWarning, match="damaged"):
        sess, loaded = _session(saved)
    assert not loaded
    np.testing.assert_array_equal(_run(sess), want)
    assert _session(saved)[1]  # the rebuilt entry is sound again


def test_only_the_most_recently_used_entries_are_kept(tmp_path: Path) -> None:
    saved = SavedSteps(tmp_path, keep=2)
    for i, key in enumerate(["a", "b", "c"]):
        _session(saved, key, W + i)
        os.utime(tmp_path / key, (1000 + i, 1000 + i))  # distinct times on a coarse clock
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "c"]


def test_an_unwritable_folder_builds_every_time(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the folder should be")
    with pytest.warns(UserWarning, match="cannot save"):
        sess, loaded = _session(SavedSteps(blocker / "steps"))
    assert not loaded
    np.testing.assert_array_equal(_run(sess), _run(_session(SavedSteps(tmp_path / "ok"))[0]))


def test_the_loaded_step_gives_bitwise_the_built_ones_logits(smollm: weights.LoadedModel, tmp_path: Path) -> None:
    """SmolLM2: the step built and saved, then loaded in a new StepGraph, and one built without
    saving: the same tokens on three caches give bitwise the same logits over 5 steps."""
    model = smollm.model
    built = StepGraph(model, threads=1, saved=SavedSteps(tmp_path))
    loaded = StepGraph(model, threads=1, saved=SavedSteps(tmp_path))
    plain = StepGraph(model, threads=1, saved=None)
    assert not built.loaded and loaded.loaded and not plain.loaded
    ids = list(range(500, 540))
    with torch.inference_mode():
        caches = []
        for _ in range(3):
            cache = model.new_cache()
            model.forward(torch.tensor(ids), torch.arange(len(ids)), cache)
            caches.append(cache)
        token = 1234
        for _ in range(5):
            a, b, c = (step(token, cache) for step, cache in zip((built, loaded, plain), caches, strict=True))
            assert torch.equal(a, b) and torch.equal(a, c)
            token = int(a.argmax())
        for (ka, va), (kb, vb) in zip(caches[0].layers(), caches[1].layers(), strict=True):
            assert torch.equal(ka, kb) and torch.equal(va, vb)


def test_a_prefill_loads_the_step_beside_it_where_a_core_is_free(smollm: weights.LoadedModel, tmp_path: Path) -> None:
    """With a core free of torch's threads, a prefill starts loading the saved step in a background
    thread; the first decoded token then finds it ready, and its logits are the built step's."""
    model = smollm.model
    if (os.cpu_count() or 1) <= torch.get_num_threads():
        pytest.skip("no core free of torch's threads here")
    built = StepGraph(model, threads=1, saved=SavedSteps(tmp_path))  # saves the entry
    before = (model.saved_steps, model._step, model._warming)
    model.saved_steps, model._step, model._warming = SavedSteps(tmp_path), None, None
    try:
        ids = list(range(700, 730))
        with torch.inference_mode():
            cache, other = model.new_cache(), model.new_cache()
            model.forward(torch.tensor(ids), torch.arange(len(ids)), cache)
            assert model._warming is not None
            model._warming.join(timeout=120)
            assert model._step is not None and model._step.loaded
            model.forward(torch.tensor(ids), torch.arange(len(ids)), other)
            got = model.forward(torch.tensor([42]), torch.tensor([len(ids)]), cache)
            assert got is not None and torch.equal(got, built(42, other))
    finally:
        model.saved_steps, model._step, model._warming = before
