"""The ``numpy`` runtime (`slimrag.embed.bert_numpy`) and query-compatible runtimes (issue 28 item 5).

The float32 numpy forward is the ONNX export's (the reference) to float rounding, padded batches
included; its ``erf`` is within its stated bound of ``math.erf``; a query-only process opening an
index recorded ``torch-bf16`` embeds with it (`slimrag.embed.registry.for_queries`), retrieves
what the bfloat16 queries retrieve on a real index, and imports no torch to do so.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_embed_variants import readme_paragraphs

from slimrag.embed.base import BUCKET_TOLERANCE, normalize
from slimrag.embed.bert_numpy import NumpyBertEncoder, erf
from slimrag.embed.local import QUERY_COMPATIBLE, LocalEmbedder, default_model_dir
from slimrag.embed.registry import for_queries, from_record
from slimrag.index.core import Index

pytest.importorskip("onnxruntime")


def test_erf_is_within_its_bound() -> None:
    x = np.linspace(-6, 6, 20001, dtype=np.float32)
    want = np.array([math.erf(float(v)) for v in x])
    assert np.abs(erf(x) - want).max() <= 5e-7  # the formula's 1.5e-7 and float32 rounding


def test_the_numpy_forward_is_the_onnx_export() -> None:
    texts = readme_paragraphs()
    fp32 = LocalEmbedder(runtime="onnx").embed(texts, batch_size=16)
    enc = NumpyBertEncoder(default_model_dir())
    got = np.concatenate([normalize(enc.encode(texts[s:s + 16])) for s in range(0, len(texts), 16)])
    assert np.abs(got - fp32).max() <= BUCKET_TOLERANCE


def test_for_queries_takes_the_compatible_runtime_and_only_for_local_records() -> None:
    rec = {"kind": "local", "id": "sentence-transformers/all-MiniLM-L6-v2", "dim": 384, "runtime": "torch-bf16"}
    assert QUERY_COMPATIBLE["torch-bf16"] == "numpy"
    assert for_queries(rec).runtime == "numpy"  # type: ignore[attr-defined]
    assert for_queries({**rec, "runtime": "onnx"}).runtime == "onnx"  # type: ignore[attr-defined]
    synthetic = {"kind": "synthetic", "id": "synthetic", "dim": 8, "topics": 4, "rank": 2, "seed": 0}
    assert type(for_queries(synthetic)) is type(from_record(synthetic))


def test_a_bf16_index_searched_with_numpy_queries_finds_the_same(tmp_path: Path) -> None:
    """Same passages, same top 3 for every question on a small bfloat16 index (the agreement on
    large sets is in docs/benchmarks.md); and the query-only embedder never imports torch."""
    pytest.importorskip("torch")
    data = [(f"d/{i:02d}.txt", t) for i, t in enumerate(readme_paragraphs(12))]
    Index.build(data, tmp_path / "n", embedder=LocalEmbedder(runtime="torch-bf16")).close()
    questions = ["how do I install it", "what does the index store", "how is a question answered",
                 "which models run locally", "how fast is search"]
    with Index.open(tmp_path / "n") as bf16, Index.open(tmp_path / "n", embedder=for_queries(
            bf16.embedder.record())) as fp32:
        for q in questions:
            assert [h.chunk_id for h in fp32.search(q, k=3, mode="vector")] == \
                [h.chunk_id for h in bf16.search(q, k=3, mode="vector")], q
    script = ("import sys; from slimrag.embed.registry import for_queries; "
              "e = for_queries({'kind': 'local', 'id': 'x', 'dim': 384, 'runtime': 'torch-bf16'}); "
              "v = e.embed(['a question']); print(v.shape[1], 'torch' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["384", "False"]
