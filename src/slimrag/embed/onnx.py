"""The local embedder on ONNX Runtime: a one-time export of the model folder, cached by content hash.

Why: on a CPU, ONNX Runtime runs MiniLM faster than torch (fused attention and GELU kernels, no
Python per layer; `bench/ingest.py` measures both in one run), and a process that only embeds a
query imports ``onnxruntime`` + ``tokenizers`` (~0.2 s) instead of torch + transformers +
sentence-transformers (~3-5 s cold): this is what keeps a one-shot ``slimrag search`` short.

Export (once per model folder, offline)
    1. Hash the model folder: SHA-256 over every file's relative name and bytes, remembered in a
       side file (``models/embed-sha256.json``) keyed by the folder and each file's (size,
       mtime_ns), so a later process only stats the files.
    2. Look for ``$SLIMRAG_HOME/models/<folder name>-onnx-<sha[:16]>/`` (``SLIMRAG_HOME`` defaults
       to ``~/.cache/slimrag``) holding ``model.onnx`` and the marker ``slimrag-onnx.json``.
    3. On a miss: load the folder with transformers (eager attention), wrap it with the pooling
       of the folder's sentence-transformers config (``1_Pooling/config.json``: mean or CLS), trace
       it with ``torch.onnx.export`` on a padded example (so the attention mask stays a real
       input of the graph), check the result against torch on a padded probe batch
       (`EXPORT_TOLERANCE`), then write it into a temporary sibling folder, fsync and rename into
       place, as `slimrag.llm.weights` does for the GGUF conversion. A crash never leaves a
       half-written entry; of two concurrent exports the first rename wins.
    4. Later processes open the cached file; torch is not imported.

Variants: ``fp32`` (the exported graph as is) and the graphs `slimrag.embed.quantize` builds from
it on first use (``fused``: ONNX Runtime's BERT fusions, same vectors; ``int8``: per-tensor dynamic
int8, opt-in; ``int8-fused``: fusions + per-channel dynamic int8, what a new index embeds with by
default on the CPU, see `slimrag.embed.local`). An index records its variant, so its queries are
embedded the way its chunks were; `bench/ingest.py` measures each variant's speed and quality.

Threads: ONNX Runtime's intra-op pool (the physical cores unless ``threads``), its idle threads
blocking rather than spinning between parallel sections, as the LLM engine's sessions do
(`slimrag.llm.model.qlinear`): a one-shot ``ask`` embeds its evidence sentences while the
model loads on another thread, and a spinning pool takes CPU from it. Measured here (load 9-11
from other work, alternating sessions in one process): the 33 texts of an evidence ranking
0.62 s without spinning against 1.09 s with it (1.48 against 2.17 s beside a busy torch
thread), and 64 notes of the cold-ask index at batch 16, 7.45 against 10.87 s.

Tokenization uses the folder's ``tokenizer.json`` with the `tokenizers` library, truncated at the
model's ``max_seq_length`` and padded to the longest text of the batch: what sentence-transformers
does, so both runtimes see the same ids. Measured difference between the two runtimes on padded
batches of Python-doc paragraphs: max abs 2e-7 per component (cosine 1 - 1e-7).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from slimrag.embed.quantize import BUILDERS
from slimrag.errors import ModelNotFoundError, SlimragError
from slimrag.files import (
    fsync_dir,
    fsync_tree,
    read_json_or_empty,
    slimrag_home,
    sweep_stale_tmp,
    write_json_atomic,
)
from slimrag.hf import using_transformers

log = logging.getLogger("slimrag.embed")

#: Written last into an export folder; its presence (with this format) marks the entry complete.
MARKER = "slimrag-onnx.json"
#: Bumped when the exported graph's inputs, outputs or pooling change, so old entries are redone.
EXPORT_FORMAT = 1
#: Max abs difference per component between the exported graph and torch on the probe batch.
EXPORT_TOLERANCE = 1e-4
#: Graph variants: file name inside the export folder (all but fp32 built by `slimrag.embed.quantize`).
VARIANTS = {"fp32": "model.onnx"} | {name: file for name, (file, _) in BUILDERS.items()}
_HASH_INDEX = "embed-sha256.json"
_STALE_TMP_S = 3600.0
_BLOCK = 1 << 20


def onnxruntime_available() -> bool:
    """True when the ``onnxruntime`` package is installed (checked without importing it)."""
    import importlib.util

    return importlib.util.find_spec("onnxruntime") is not None


def pooling_mode(model_dir: Path) -> str:
    """The pooling of a sentence-transformers folder: "mean" or "cls" (the two this module
    exports); raises SlimragError for another mode, so the caller can keep torch."""
    cfg_path = model_dir / "1_Pooling" / "config.json"
    if not cfg_path.is_file():
        return "mean"  # sentence-transformers' own default for a bare transformers folder
    cfg = json.loads(cfg_path.read_text())
    modes = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v is True]
    supported = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}
    if len(modes) == 1 and modes[0] in supported:
        return supported[modes[0]]
    raise SlimragError(f"{model_dir}: pooling {modes} is not exportable to ONNX by slimrag (mean or cls "
                       "only); use runtime='torch' for this model")


def max_seq_length(model_dir: Path) -> int:
    """Tokens the model reads: ``sentence_bert_config.json``'s ``max_seq_length``, else 512."""
    path = model_dir / "sentence_bert_config.json"
    if path.is_file():
        value = json.loads(path.read_text()).get("max_seq_length")
        if isinstance(value, int) and value > 0:
            return value
    return 512


def load_tokenizer(model_dir: Path) -> Any:
    """The folder's fast tokenizer, truncating at `max_seq_length`, padding to the batch's longest."""
    from tokenizers import Tokenizer

    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise ModelNotFoundError(f"{model_dir} has no tokenizer.json; use runtime='torch' for this model")
    tok = Tokenizer.from_file(str(path))
    tok.enable_truncation(max_seq_length(model_dir))
    pad_id = tok.token_to_id("[PAD]")
    tok.enable_padding(pad_id=pad_id if pad_id is not None else 0)
    return tok


def folder_sha256(model_dir: Path, home: Path | None = None) -> str:
    """SHA-256 over the relative names and bytes of every file of ``model_dir``, remembered in a
    side file keyed by the folder and each file's (size, mtime_ns)."""
    model_dir = model_dir.resolve()
    files = sorted(p for p in model_dir.rglob("*") if p.is_file())
    stamp = [[p.relative_to(model_dir).as_posix(), p.stat().st_size, p.stat().st_mtime_ns] for p in files]
    index_path = (home or slimrag_home()) / "models" / _HASH_INDEX
    index = read_json_or_empty(index_path)
    entry = index.get(str(model_dir))
    if isinstance(entry, dict) and entry.get("files") == stamp and isinstance(entry.get("sha256"), str):
        return str(entry["sha256"])
    digest = hashlib.sha256()
    for p in files:
        digest.update(p.relative_to(model_dir).as_posix().encode() + b"\0")
        with p.open("rb") as f:
            while block := f.read(_BLOCK):
                digest.update(block)
    sha = digest.hexdigest()
    index[str(model_dir)] = {"files": stamp, "sha256": sha}
    write_json_atomic(index_path, index)
    return sha


def export_dir_for(model_dir: Path, home: Path | None = None) -> Path:
    """The folder ``model_dir`` exports into: ``<home>/models/<name>-onnx-<sha[:16]>``."""
    sha = folder_sha256(model_dir, home)
    return (home or slimrag_home()) / "models" / f"{model_dir.name}-onnx-{sha[:16]}"


def is_exported(folder: Path, variant: str = "fp32") -> bool:
    """True when ``folder`` is a complete export of the current format holding ``variant``."""
    marker = read_json_or_empty(folder / MARKER)
    return marker.get("format") == EXPORT_FORMAT and (folder / VARIANTS[variant]).is_file()


def ensure_exported(model_dir: Path, variant: str = "fp32", home: Path | None = None) -> Path:
    """The cached ONNX file of ``model_dir`` in ``variant``, exporting (and quantizing) on a miss."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {sorted(VARIANTS)}, got {variant!r}")
    folder = export_dir_for(model_dir, home)
    if not is_exported(folder):
        export(model_dir, folder)
    path = folder / VARIANTS[variant]
    if variant != "fp32" and not path.is_file():
        t0 = time.perf_counter()
        BUILDERS[variant][1](folder / VARIANTS["fp32"], path, model_dir)
        log.info("built the %s variant of %s in %.1fs", variant, model_dir, time.perf_counter() - t0)
    return path


def export(model_dir: Path, dest: Path) -> None:
    """Trace ``model_dir`` with its pooling into ``dest/model.onnx``, checked, atomically (see header)."""
    with using_transformers():
        _export(model_dir, dest)


def _export(model_dir: Path, dest: Path) -> None:
    import torch
    from transformers import AutoModel

    pooling = pooling_mode(model_dir)
    dest.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_tmp(dest.parent, _STALE_TMP_S)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{dest.name}-", dir=dest.parent))
    t0 = time.perf_counter()
    try:
        model = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()
        wrapped = _pooled_module(model, pooling)
        names = _input_names(model)
        probe = _probe_batch(load_tokenizer(model_dir), names)
        example = tuple(torch.from_numpy(probe[n]) for n in names)
        with torch.no_grad():  # before tracing: the model's torch outputs are wrong after export
            want = wrapped(*example).numpy()
        axes = {n: {0: "batch", 1: "seq"} for n in names} | {"embedding": {0: "batch"}}
        with warnings.catch_warnings():  # the tracer's warnings concern branches that do not apply here
            warnings.simplefilter("ignore")
            torch.onnx.export(wrapped, example, str(tmp / VARIANTS["fp32"]), input_names=list(names),
                              output_names=["embedding"], dynamic_axes=axes, opset_version=17, dynamo=False)
        got = _session(tmp / VARIANTS["fp32"]).run(None, probe)[0]
        err = float(np.abs(got - want).max())
        if err > EXPORT_TOLERANCE:
            raise SlimragError(f"the ONNX export of {model_dir} differs from torch by {err:.2e} "
                               f"(> {EXPORT_TOLERANCE}); use runtime='torch'")
        marker = {"format": EXPORT_FORMAT, "source": str(model_dir.resolve()), "pooling": pooling,
                  "inputs": list(names), "max_abs_diff_vs_torch": err, "created": time.time()}
        (tmp / MARKER).write_text(json.dumps(marker, indent=1))
        fsync_tree(tmp)
        try:
            tmp.rename(dest)
        except OSError:
            if not is_exported(dest):  # not another process's finished export: a real failure
                raise
            shutil.rmtree(tmp, ignore_errors=True)
        fsync_dir(dest.parent)
        log.info("exported %s to ONNX in %.1fs (max abs diff vs torch %.1e)", model_dir, time.perf_counter() - t0, err)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class OnnxEncoder:
    """One ONNX Runtime session over an exported graph plus the folder's tokenizer.

    threads: intra-op threads (default: ONNX Runtime's own, the physical cores). Not re-entrant
    on its own: `LocalEmbedder` serializes calls."""

    def __init__(self, model_dir: Path, variant: str = "fp32", home: Path | None = None,
                 threads: int | None = None) -> None:
        self.path = ensure_exported(model_dir, variant, home)
        self.variant = variant
        self.tokenizer = load_tokenizer(model_dir)
        self.session = _session(self.path, threads)
        self.inputs = [i.name for i in self.session.get_inputs()]

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Pooled, unnormalized float32 embeddings of one batch, padded to its longest text."""
        enc = self.tokenizer.encode_batch(list(texts))
        feed = {"input_ids": np.array([e.ids for e in enc], dtype=np.int64),
                "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
                "token_type_ids": np.array([e.type_ids for e in enc], dtype=np.int64)}
        return np.asarray(self.session.run(None, {n: feed[n] for n in self.inputs})[0], dtype=np.float32)


def _session(path: Path, threads: int | None = None) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
    # idle pool threads block instead of spinning (module header, "Threads")
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3  # ORT warns about unused initializers of traced graphs: noise
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _input_names(model: Any) -> tuple[str, ...]:
    """The inputs the traced graph takes: BERT-like models also read token_type_ids."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return ("input_ids", "attention_mask") + (("token_type_ids",) if "token_type_ids" in params else ())


def _probe_batch(tokenizer: Any, names: Sequence[str]) -> dict[str, np.ndarray]:
    """A padded batch (two lengths), so the trace keeps the mask and the check covers padding."""
    enc = tokenizer.encode_batch(["A short probe.", "A longer probe sentence, so that the first row of the "
                                  "batch is padded and the attention mask matters for the trace."])
    feed = {"input_ids": [e.ids for e in enc], "attention_mask": [e.attention_mask for e in enc],
            "token_type_ids": [e.type_ids for e in enc]}
    return {n: np.array(feed[n], dtype=np.int64) for n in names}


def _pooled_module(model: Any, pooling: str) -> Any:
    """The transformer plus sentence-transformers' pooling as one traceable module (the class is
    made here because torch is imported only when exporting)."""
    import torch

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any = None) -> Any:
            kw = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
            h = self.model(input_ids=input_ids, attention_mask=attention_mask, **kw).last_hidden_state
            if pooling == "cls":
                return h[:, 0]
            w = attention_mask.unsqueeze(-1).to(h.dtype)
            return (h * w).sum(1) / w.sum(1).clamp(min=1e-9)

    return Pooled()
