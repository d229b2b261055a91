"""The ``torch-bf16`` runtime (`slimrag.embed.bert`): its float32 forward is the ONNX export's to
float rounding (the forward is right), its bfloat16 vectors stay close to float32 and barely move
with their batch mates, "auto" takes it only where the CPU has AMX bfloat16 tiles, and an index
built with it embeds its queries with it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_embed_variants import readme_paragraphs

from slimrag.cpu import bf16_units
from slimrag.embed.base import BUCKET_TOLERANCE, normalize
from slimrag.embed.bert import BertEncoder, check_folder
from slimrag.embed.local import CPU_BF16, LocalEmbedder, cuda_usable, default_model_dir
from slimrag.errors import SlimragError
from slimrag.index.core import Index

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

#: measured on the README's paragraphs: cosine to fp32 lowest 0.99994, median 0.99996; a text
#: alone vs in a padded batch of 16, lowest 0.99996
LOW, MEDIAN, ALONE = 0.9998, 0.9999, 0.9998


@pytest.fixture(scope="module")
def fp32() -> np.ndarray:
    return LocalEmbedder(runtime="onnx").embed(readme_paragraphs(), batch_size=16)


@pytest.fixture(scope="module")
def bf16() -> LocalEmbedder:
    return LocalEmbedder(runtime="torch-bf16")


def test_the_float32_forward_is_the_onnx_export(fp32: np.ndarray) -> None:
    enc = BertEncoder(default_model_dir(), dtype=torch.float32)
    texts = readme_paragraphs()
    got = np.concatenate([normalize(enc.encode(texts[s:s + 16])) for s in range(0, len(texts), 16)])
    assert np.abs(got - fp32).max() <= BUCKET_TOLERANCE


def test_bf16_is_close_to_fp32_and_really_bf16(fp32: np.ndarray, bf16: LocalEmbedder) -> None:
    x = bf16.embed(readme_paragraphs(), batch_size=16)
    cos = (x * fp32).sum(1)
    assert cos.min() >= LOW and np.median(cos) >= MEDIAN, (cos.min(), np.median(cos))
    assert np.abs(x - fp32).max() > 1e-4  # bfloat16 products, not float32 under another name


def test_batch_mates_barely_move_a_bf16_vector(bf16: LocalEmbedder) -> None:
    texts = readme_paragraphs()[:16]  # lengths differ, so most rows are padded in the batch
    batch = bf16.embed_batch(texts)
    alone = np.concatenate([bf16.embed_batch([t]) for t in texts])
    assert (batch * alone).sum(1).min() >= ALONE


def test_bf16_units_reads_the_cpu_flags(tmp_path: Path) -> None:
    with_amx, without = tmp_path / "amx", tmp_path / "avx2"
    with_amx.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile amx_int8\n")
    without.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert bf16_units(with_amx) and not bf16_units(without)
    assert not bf16_units(tmp_path / "missing")


def test_a_folder_that_is_not_bert_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(SlimragError, match="not a BERT"):
        check_folder(tmp_path)
    assert check_folder(default_model_dir())["model_type"] == "bert"


@pytest.mark.skipif(cuda_usable() or not bf16_units(), reason="'auto' takes torch-bf16 on a CPU with AMX only")
def test_auto_takes_bf16_on_this_cpu_and_the_index_keeps_it(tmp_path: Path, bf16: LocalEmbedder) -> None:
    data = [(f"d/{i:02d}.txt", t) for i, t in enumerate(readme_paragraphs(8))]
    Index.build(data, tmp_path / "n").close()
    manifest = json.loads((tmp_path / "n" / "manifest.json").read_text())
    assert manifest["embedder"]["runtime"] == CPU_BF16
    with Index.open(tmp_path / "n") as idx:
        query = "how do I install it"
        np.testing.assert_allclose(idx.embedder.embed([query]), bf16.embed([query]), atol=1e-6)
        assert idx.search(query, k=3, mode="vector")
