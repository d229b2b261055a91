"""The int8 embedder variant (``onnx-int8-fused``: BERT fusions + per-channel dynamic int8) against
float32 on real text, and the manifest round trip that keeps a query embedded the way its index
was: a variant index embeds its queries with the variant, an old index keeps float32."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from slimrag.embed.local import CPU_DEFAULT, LocalEmbedder, cuda_usable
from slimrag.embed.registry import from_record
from slimrag.index.core import Index

pytest.importorskip("onnxruntime")

README = Path(__file__).resolve().parents[1] / "README.md"
VARIANT = "onnx-int8-fused"
#: Measured on the README's paragraphs (bench/ingest.py --variants measures it on disfl_qa and
#: nq_conflicts passages): median cosine to fp32 ~0.99, lowest ~0.97.
MIN_COSINE = 0.95
MEDIAN_COSINE = 0.98


def readme_paragraphs(n: int = 48) -> list[str]:
    """Real prose written by people: the README's paragraphs of at least 8 words."""
    paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", README.read_text())]
    return [p for p in paras if len(p.split()) >= 8][:n]


@pytest.fixture(scope="module")
def fp32() -> LocalEmbedder:
    return LocalEmbedder(runtime="onnx")


@pytest.fixture(scope="module")
def variant() -> LocalEmbedder:
    return LocalEmbedder(runtime=VARIANT)


def test_default_variant_is_close_to_fp32_on_real_text(fp32: LocalEmbedder, variant: LocalEmbedder) -> None:
    texts = readme_paragraphs()
    assert len(texts) >= 24
    x32, xq = fp32.embed(texts), variant.embed(texts)
    cos = (x32 * xq).sum(1)
    assert cos.min() >= MIN_COSINE and np.median(cos) >= MEDIAN_COSINE, (cos.min(), np.median(cos))
    assert np.abs(x32 - xq).max() > 1e-4  # really the int8 graph, not fp32 under another name


def test_default_variant_ranks_like_fp32(fp32: LocalEmbedder, variant: LocalEmbedder) -> None:
    """Each paragraph's first words as a query: the variant's top 3 holds fp32's top 1."""
    texts = readme_paragraphs()
    queries = [" ".join(t.split()[:8]) for t in texts]
    best32 = np.argmax(fp32.embed(queries) @ fp32.embed(texts).T, axis=1)
    topq = np.argsort(-(variant.embed(queries) @ variant.embed(texts).T), axis=1)[:, :3]
    hits = np.mean([b in row for b, row in zip(best32.tolist(), topq.tolist(), strict=True)])
    assert hits >= 0.95, hits


def test_batch_mates_change_a_vector_only_slightly(variant: LocalEmbedder) -> None:
    """Dynamic int8 takes one activation scale per tensor of a call (quantize.py header), so a text
    alone and the same text in a padded batch of 16 differ about as much as int8 and fp32 do:
    measured cosine 0.989-0.995 on these paragraphs. The bound pins that it stays there."""
    texts = readme_paragraphs(16)
    alone = np.concatenate([variant.embed_batch([t]) for t in texts])
    together = variant.embed_batch(texts)
    cos = (alone * together).sum(1)
    assert cos.min() >= 0.98 and cos.max() < 1 - 1e-4, (cos.min(), cos.max())


def test_an_index_built_with_the_variant_embeds_its_queries_with_it(tmp_path: Path, fp32: LocalEmbedder,
                                                                    variant: LocalEmbedder) -> None:
    data = [(f"d/{i:02d}.txt", t) for i, t in enumerate(readme_paragraphs(24))]
    Index.build(data, tmp_path / "v", embedder=variant).close()
    manifest = json.loads((tmp_path / "v" / "manifest.json").read_text())
    assert manifest["embedder"]["runtime"] == VARIANT
    query = "How do I build an index of a folder?"
    with Index.open(tmp_path / "v") as idx:  # no embedder given: rebuilt from the manifest
        assert idx.embedder.record()["runtime"] == VARIANT
        got = idx.embedder.embed([query])
        hits = idx.search(query, k=3, mode="vector")
    np.testing.assert_allclose(got, variant.embed([query]), atol=1e-6)
    assert np.abs(got - fp32.embed([query])).max() > 1e-4
    assert hits and hits[0].source.startswith("d/")


@pytest.mark.skipif(cuda_usable(), reason="with a CUDA GPU 'auto' takes torch")
def test_a_new_index_records_the_cpu_default(tmp_path: Path) -> None:
    Index.build([("a.txt", "Whiskers sleeps on the radiator all winter.")], tmp_path / "n").close()
    manifest = json.loads((tmp_path / "n" / "manifest.json").read_text())
    assert manifest["embedder"]["runtime"] == CPU_DEFAULT


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
