"""The fast embedding paths against their references: length bucketing against file-order batches,
ONNX Runtime against torch (sentence-transformers), slim search's recomputation against the build's
vectors, and the runtime an index records and reopens with."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from slimrag.embed.base import BUCKET_TOLERANCE, Embedder
from slimrag.embed.local import LocalEmbedder
from slimrag.embed.registry import from_record
from slimrag.index.core import Index
from slimrag.index.store.slim import SlimConfig
from slimrag.index.store.slim.pq import PQConfig

onnxruntime = pytest.importorskip("onnxruntime")

WORDS = ("the json module parses strings into objects while the statistics module computes medians of "
         "numbers and pathlib joins paths on every platform").split()


def varied_texts(n: int, seed: int = 3) -> list[str]:
    """Texts from 1 to 120 words, in an order unrelated to their length (as files come)."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 120)))) for _ in range(n)]


class CharCounts(Embedder):
    """A real, deterministic embedder whose vector depends on the text alone: letter counts. It
    records every batch it is given, so the test can see what `embed` grouped together."""

    model_id, dim = "test:char-counts", 26

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        self.batches.append(list(texts))
        out = np.zeros((len(texts), 26), np.float32)
        for r, t in enumerate(texts):
            for ch in t.lower():
                if "a" <= ch <= "z":
                    out[r, ord(ch) - 97] += 1
            out[r, 0] += 1e-3  # never a zero row
        return out


def test_bucketing_groups_similar_lengths_and_restores_input_order() -> None:
    texts = varied_texts(100)
    emb = CharCounts()
    got = emb.embed(texts, batch_size=16)
    want = np.concatenate([emb.embed_batch([t]) for t in texts])
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    np.testing.assert_array_equal(got, want)  # row i is text i, whatever batch it ran in
    buckets = emb.batches[:7]  # the 7 calls of embed (100 texts / 16), before the one-by-one reference
    assert sum(len(b) for b in buckets) == 100
    ranges = [(min(map(len, b)), max(map(len, b))) for b in buckets]
    assert all(hi <= lo2 for (_, hi), (lo2, _) in zip(ranges, ranges[1:], strict=False)), ranges


def test_batch_cap_bounds_what_the_caller_asks_for() -> None:
    """An embedder fastest at small batches (ONNX here) gets no bigger ones than its cap."""
    emb = CharCounts()
    emb.batch_cap = 5
    got = emb.embed(varied_texts(23), batch_size=64)
    assert [len(b) for b in emb.batches] == [5, 5, 5, 5, 3] and got.shape == (23, 26)
    assert LocalEmbedder(runtime="onnx").batch_cap == 16 and LocalEmbedder(runtime="torch").batch_cap is None


def test_bucketing_rejects_a_bad_batch_size() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        CharCounts().embed(["a"], batch_size=0)


@pytest.fixture(scope="module")
def onnx_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private slimrag home, so the export below is the test's own (not a cached one)."""
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def runtimes(onnx_home: Path) -> dict[str, LocalEmbedder]:
    mp = pytest.MonkeyPatch()
    mp.setenv("SLIMRAG_HOME", str(onnx_home))
    embedders = {name: LocalEmbedder(runtime=name) for name in ("torch", "onnx")}
    for e in embedders.values():
        e.embed_batch(["load"])
    yield embedders  # type: ignore[misc]
    mp.undo()


@pytest.mark.parametrize("runtime", ["torch", "onnx"])
def test_bucketed_vectors_equal_file_order_batches(runtimes: dict[str, LocalEmbedder], runtime: str) -> None:
    """What `Index.build` now stores against what it stored before (batches in file order)."""
    emb, texts = runtimes[runtime], varied_texts(48)
    bucketed = emb.embed(texts, batch_size=8)
    file_order = np.concatenate([emb.embed_batch(texts[s:s + 8]) for s in range(0, len(texts), 8)])
    assert np.abs(bucketed - file_order).max() <= BUCKET_TOLERANCE
    assert (bucketed * file_order).sum(1).min() >= 1 - 1e-6


def test_onnx_matches_torch_and_is_cached_atomically(runtimes: dict[str, LocalEmbedder], onnx_home: Path) -> None:
    texts = varied_texts(32, seed=5)
    torch_v = runtimes["torch"].embed(texts, batch_size=16)
    onnx_v = runtimes["onnx"].embed(texts, batch_size=16)
    assert np.abs(onnx_v - torch_v).max() <= BUCKET_TOLERANCE
    models = onnx_home / "models"
    (folder,) = [p for p in models.iterdir() if p.is_dir()]
    assert folder.name.startswith("model-onnx-") and not list(models.glob(".tmp-*"))
    marker = json.loads((folder / "slimrag-onnx.json").read_text())
    assert marker["pooling"] == "mean" and marker["max_abs_diff_vs_torch"] <= 1e-4
    before = (folder / "model.onnx").stat().st_mtime_ns
    again = LocalEmbedder(runtime="onnx")  # a second embedder reuses the export, does not redo it
    np.testing.assert_allclose(again.embed(texts[:4]), onnx_v[:4], atol=1e-6)
    assert (folder / "model.onnx").stat().st_mtime_ns == before


def test_the_runtime_is_recorded_and_reopened() -> None:
    rec = LocalEmbedder(runtime="onnx").record()
    assert rec["runtime"] == "onnx"
    assert from_record(rec).record()["runtime"] == "onnx"  # type: ignore[attr-defined]
    old = {k: v for k, v in rec.items() if k != "runtime"}  # a manifest written before the key
    assert from_record(old).record()["runtime"] == "torch"
    with pytest.raises(ValueError, match="runtime"):
        LocalEmbedder(runtime="tensorrt")


def test_slim_recomputation_equals_the_build(runtimes: dict[str, LocalEmbedder], tmp_path: Path) -> None:
    """Slim search re-embeds candidates in other batches than the build did; the vectors must be
    the build's within BUCKET_TOLERANCE (here: a flat index's stored vectors of the same chunks)."""
    emb = runtimes["onnx"]
    data = [(f"d/{i:03d}.txt", t) for i, t in enumerate(varied_texts(160, seed=9))]
    flat = Index.build(data, tmp_path / "f", embedder=emb, storage="flat")
    slim = Index.build(data, tmp_path / "s", embedder=emb, storage="slim", slim=SlimConfig(pq=PQConfig(m=16)))
    assert slim.manifest["embedder"]["runtime"] == "onnx"
    f_ids, f_vecs = flat.vectors.live_vectors()
    s_ids, s_vecs = slim.vectors.live_vectors()  # every row recomputed from its text
    np.testing.assert_array_equal(f_ids, s_ids)
    assert np.abs(f_vecs - s_vecs).max() <= BUCKET_TOLERANCE
    flat.close()
    slim.close()


_PROBE = """
import sys
from slimrag.cli import main
sys.argv = ["slimrag", "search", sys.argv[1], "parse json", "--mode", sys.argv[2]]
try:
    main()
except SystemExit as e:
    assert not e.code, e.code
heavy = ("torch", "transformers", "sentence_transformers", "onnxruntime", "slimrag.llm.local", "slimrag.rag")
print("IMPORTED", *[m for m in heavy if m in sys.modules])
"""


@pytest.mark.parametrize(("mode", "allowed"), [("keyword", set()), ("vector", {"onnxruntime"})])
def test_one_shot_search_imports_only_what_it_runs(runtimes: dict[str, LocalEmbedder], onnx_home: Path,
                                                  tmp_path: Path, mode: str, allowed: set[str]) -> None:
    """A cold `slimrag search` process: no LLM stack ever, no torch for an ONNX-embedded index, and
    no model runtime at all for a keyword search."""
    import os
    import subprocess
    import sys

    data = [("a.txt", "The json module parses JSON strings into Python objects."),
            ("b.txt", "statistics.median returns the middle value of numeric data.")]
    Index.build(data, tmp_path / "i", embedder=runtimes["onnx"]).close()
    res = subprocess.run([sys.executable, "-c", _PROBE, str(tmp_path / "i"), mode], capture_output=True,
                         text=True, env={**os.environ, "SLIMRAG_HOME": str(onnx_home)}, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "a.txt#0" in res.stdout  # the search ran and found the JSON passage
    imported = set(res.stdout.split("IMPORTED", 1)[1].split())
    assert imported == allowed


def test_ask_reports_a_generator_that_fails_to_load(tmp_path: Path, runtimes: dict[str, LocalEmbedder]) -> None:
    """`ask` loads the generator on a background thread; its failure still ends the command with
    the one error line of any slimrag error, not a traceback or a hang."""
    from click.testing import CliRunner

    from slimrag.cli import cli

    Index.build([("a.txt", "Whiskers sleeps on the radiator.")], tmp_path / "i", embedder=runtimes["onnx"]).close()
    r = CliRunner().invoke(cli, ["ask", str(tmp_path / "i"), "Where does Whiskers sleep?", "--llm", "nope://x"])
    assert r.exit_code == 1 and r.output.startswith("error: "), r.output


@pytest.mark.slow
def test_int8_is_opt_in_recorded_and_lossy(runtimes: dict[str, LocalEmbedder]) -> None:
    """The int8 variant is never what "auto" picks and is recorded as itself, because its vectors
    are not fp32's: measured on these texts median cosine to fp32 0.946, min 0.906, recall@5 of
    self-queries 0.805. The test pins that it stays near (median cosine >= 0.9) and is not exact."""
    assert LocalEmbedder().runtime != "onnx-int8"
    int8 = LocalEmbedder(runtime="onnx-int8")
    assert int8.record()["runtime"] == "onnx-int8"
    texts = varied_texts(200, seed=13)
    x32, x8 = runtimes["onnx"].embed(texts), int8.embed(texts)
    cos = (x32 * x8).sum(1)
    assert np.median(cos) >= 0.9 and cos.min() >= 0.85, (np.median(cos), cos.min())
    assert np.abs(x32 - x8).max() > BUCKET_TOLERANCE  # not a silent stand-in for fp32
