"""What a cold load of the embedded model reads, and what it leaves out (issue 28 item 5).

The GGUF reader answers the block sizes of the usual types and F32 tensors itself, so loading the
embedded model never imports the ``gguf`` package (its import is a share of a cold start); the
tables it keeps must equal the package's, and the vocabulary parsed in one loop must equal the
package's own reader's.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from slimrag.errors import ModelNotFoundError
from slimrag.llm.model.gguf import BLOCK_SIZES, FAST_DEQUANT, GGUFFile
from slimrag.llm.weights import default_gguf_path


@pytest.fixture(scope="module")
def gguf_path() -> str:
    try:
        return str(default_gguf_path())
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))


def test_block_sizes_equal_the_gguf_package() -> None:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    for kind, sizes in BLOCK_SIZES.items():
        assert GGML_QUANT_SIZES[GGMLQuantizationType(kind)] == sizes, kind


def test_f32_reads_as_gguf_quants_does() -> None:
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    raw = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32).view(np.uint8)
    got = FAST_DEQUANT[0](raw)
    assert got.flags.writeable and np.array_equal(got, dequantize(raw, GGMLQuantizationType.F32))


def test_metadata_equals_the_gguf_reader(gguf_path: str) -> None:
    """Every metadata value (the 49k-token vocabulary and its merges included) as the ``gguf``
    package's reader gives it."""
    from gguf import GGUFReader

    ours = GGUFFile(gguf_path).metadata
    reader = GGUFReader(gguf_path)
    assert set(ours) == {f.name for f in reader.fields.values() if not f.name.startswith("GGUF.")}
    for name in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        assert ours[name] == list(reader.fields[name].contents()), name


def test_loading_the_embedded_model_does_not_import_gguf(gguf_path: str) -> None:
    code = ("import sys\nfrom slimrag.llm.weights import load_model\nload_model()\n"
            "print(sorted(m for m in sys.modules if m == 'gguf' or m.startswith('gguf.')))")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"
