"""The int8 embedder variants against float32 on real text, and the manifest round trip that keeps a
query embedded the way its index was: a variant index embeds its queries with the variant, an old
index keeps float32.

``onnx-int8-fused`` (per-tensor dynamic activations) and ``onnx-int8-block`` (activations per block
of 128 values of a row) are held to what was measured on the README's paragraphs, with margin:
cosine to fp32 (lowest, median) and cosine of a text alone vs in a padded batch (lowest)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from slimrag.cpu import bf16_units
from slimrag.embed.local import CPU_BF16, CPU_DEFAULT, LocalEmbedder, cuda_usable
from slimrag.embed.registry import from_record
from slimrag.index.core import Index

pytest.importorskip("onnxruntime")

README = Path(__file__).resolve().parents[1] / "README.md"
#: runtime -> (lowest cosine to fp32, median cosine to fp32, lowest cosine alone vs in a batch).
#: Measured: int8-fused 0.97 / 0.99 / 0.989; int8-block 0.9995 / 0.9997 / 0.99992.
BOUNDS = {"onnx-int8-fused": (0.95, 0.98, 0.98), "onnx-int8-block": (0.998, 0.999, 0.9995)}
#: the variant of the round-trip tests: the CPU default when it is an int8 variant, else int8-block
ROUND_TRIP = CPU_DEFAULT if CPU_DEFAULT in BOUNDS else "onnx-int8-block"


def readme_paragraphs(n: int = 48) -> list[str]:
    """Real prose written by people: the README's paragraphs of at least 8 words."""
    paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", README.read_text())]
    return [p for p in paras if len(p.split()) >= 8][:n]


@pytest.fixture(scope="module")
def fp32() -> LocalEmbedder:
    return LocalEmbedder(runtime="onnx")


@pytest.fixture(scope="module")
def variants() -> dict[str, LocalEmbedder]:
    return {r: LocalEmbedder(runtime=r) for r in BOUNDS}


@pytest.mark.parametrize("runtime", sorted(BOUNDS))
def test_variant_is_close_to_fp32_on_real_text(fp32: LocalEmbedder, variants: dict[str, LocalEmbedder],
                                               runtime: str) -> None:
    texts = readme_paragraphs()
    assert len(texts) >= 24
    x32, xq = fp32.embed(texts), variants[runtime].embed(texts)
    cos = (x32 * xq).sum(1)
    low, median, _ = BOUNDS[runtime]
    assert cos.min() >= low and np.median(cos) >= median, (cos.min(), np.median(cos))
    assert np.abs(x32 - xq).max() > 1e-4  # really an int8 graph, not fp32 under another name


@pytest.mark.parametrize("runtime", sorted(BOUNDS))
def test_variant_ranks_like_fp32(fp32: LocalEmbedder, variants: dict[str, LocalEmbedder], runtime: str) -> None:
    """Each paragraph's first words as a query: the variant's top 3 holds fp32's top 1."""
    texts = readme_paragraphs()
    queries = [" ".join(t.split()[:8]) for t in texts]
    best32 = np.argmax(fp32.embed(queries) @ fp32.embed(texts).T, axis=1)
    var = variants[runtime]
    topq = np.argsort(-(var.embed(queries) @ var.embed(texts).T), axis=1)[:, :3]
    hits = np.mean([b in row for b, row in zip(best32.tolist(), topq.tolist(), strict=True)])
    assert hits >= 0.95, hits


@pytest.mark.parametrize("runtime", sorted(BOUNDS))
def test_batch_mates_and_a_vector(variants: dict[str, LocalEmbedder], runtime: str) -> None:
    """A text alone against the same text in a padded batch of 16. Dynamic int8 (int8-fused) takes
    one activation scale per tensor of a call, so batch mates move a vector about as much as int8
    moves it from fp32; int8-block scales each row by itself (quantize.py header)."""
    texts = readme_paragraphs(16)
    var = variants[runtime]
    alone = np.concatenate([var.embed_batch([t]) for t in texts])
    cos = (alone * var.embed_batch(texts)).sum(1)
    assert cos.min() >= BOUNDS[runtime][2], cos.min()


def test_an_index_built_with_the_variant_embeds_its_queries_with_it(tmp_path: Path, fp32: LocalEmbedder,
                                                                    variants: dict[str, LocalEmbedder]) -> None:
    variant = variants[ROUND_TRIP]
    data = [(f"d/{i:02d}.txt", t) for i, t in enumerate(readme_paragraphs(24))]
    Index.build(data, tmp_path / "v", embedder=variant).close()
    manifest = json.loads((tmp_path / "v" / "manifest.json").read_text())
    assert manifest["embedder"]["runtime"] == ROUND_TRIP
    query = "How do I build an index of a folder?"
    with Index.open(tmp_path / "v") as idx:  # no embedder given: rebuilt from the manifest
        assert idx.embedder.record()["runtime"] == ROUND_TRIP
        got = idx.embedder.embed([query])
        hits = idx.search(query, k=3, mode="vector")
    np.testing.assert_allclose(got, variant.embed([query]), atol=1e-6)
    assert np.abs(got - fp32.embed([query])).max() > 1e-4
    assert hits and hits[0].source.startswith("d/")


@pytest.mark.skipif(cuda_usable(), reason="with a CUDA GPU 'auto' takes torch")
def test_a_new_index_records_the_cpu_default(tmp_path: Path) -> None:
    Index.build([("a.txt", "Whiskers sleeps on the radiator all winter.")], tmp_path / "n").close()
    manifest = json.loads((tmp_path / "n" / "manifest.json").read_text())
    assert manifest["embedder"]["runtime"] == (CPU_BF16 if bf16_units() else CPU_DEFAULT)


def test_an_old_index_keeps_float32(tmp_path: Path, fp32: LocalEmbedder) -> None:
    """Indexes built before the variant existed recorded "onnx" (fp32) or no runtime (torch,
    fp32): they reopen with their own float32 graph, never the new default."""
    data = [(f"d/{i:02d}.txt", t) for i, t in enumerate(readme_paragraphs(8))]
    Index.build(data, tmp_path / "old", embedder=fp32).close()
    manifest = json.loads((tmp_path / "old" / "manifest.json").read_text())
    assert manifest["embedder"]["runtime"] == "onnx"
    with Index.open(tmp_path / "old") as idx:
        assert idx.embedder.record()["runtime"] == "onnx"
        np.testing.assert_allclose(idx.embedder.embed(["a query"]), fp32.embed(["a query"]), atol=1e-6)
    no_key = {k: v for k, v in manifest["embedder"].items() if k != "runtime"}
    assert from_record(no_key).record()["runtime"] == "torch"  # type: ignore[attr-defined]
