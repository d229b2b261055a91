"""A dropped generator frees its model without the garbage collector (issue 32, item 4).

``LocalGenerator`` hands its decode loop, its prefill runner and its KV strategy ways back to it
(the model, one forward, the cache namespace). Held strongly they made a cycle, so a dropped
generator kept its model file mapped until a collection ran; they hold it weakly now. Ground truth:
``/proc/self/maps`` and ``/proc/self/fd`` with ``gc.disable()``, as the index's own test does.
"""

from __future__ import annotations

import gc
import shutil
from pathlib import Path

import pytest
from test_index_state import _held  # descriptors and mappings under a folder, as the index's test reads them

from slimrag.llm import weights
from slimrag.llm.local import LocalGenerator
from slimrag.llm.reference import greedy_ids
from slimrag.prompt import Passage, Prompt


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps (Linux)")
def test_a_dropped_generator_unmaps_its_model_without_the_collector(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLIMRAG_HOME", str(tmp_path / "home"))
    models = tmp_path / "models"
    models.mkdir()
    path = Path(shutil.copy(weights.default_gguf_path(), models / "m.gguf"))
    prompt = Prompt("Which stone is it?", (Passage("p0", "a.md#0", "The stone is a grey granite block."),))
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        gen = LocalGenerator(path, device="cpu")
        ids, _ = greedy_ids(gen, prompt, 3)
        assert ids and _held(models), "the loaded generator maps its model file"
        gen.close()
        del gen
        assert _held(models) == [], f"a dropped generator still holds {_held(models)}"
    finally:
        if was:
            gc.enable()
