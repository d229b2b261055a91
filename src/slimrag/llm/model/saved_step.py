"""The fused decode step saved on disk once per model, so a later process loads it instead of building it.

Why. Building the one-token step graph (:mod:`slimrag.llm.model.step`) costs 1-2 s on the
embedded SmolLM2 (converting 121 weights' blocks, writing a ~100 MB protobuf, then ONNX Runtime
parsing it and packing every ``MatMulNBits`` weight into MLAS's layout), and it happens in every
process at its first decoded token. ONNX Runtime can write a session's model *with its weights
already packed* (``session.save_external_prepacked_constant_initializers``); loading that file maps
it and skips both the conversion and the packing.

Layout. ``folder/<key>/`` holds ``step.onnx`` (the graph, ~150 KB), ``step.bin`` (the weights and
their packed forms, memory-mapped by ONNX Runtime at load: ~2.5x the quantized weights, 241 MB for
SmolLM2) and ``manifest.json`` (sizes and hashes, below). The key (:func:`step_key`) names
everything the files depend on: the step's :data:`VERSION`, the ONNX Runtime version, the CPU's
instruction-set flags (MLAS packs per ISA), the model's config and a sample of its weights.

Safety. A folder is written under ``.tmp-*`` beside it, fsynced and renamed into place, so a reader
sees a whole entry or none. Before loading, the manifest's file sizes and hashes are checked
(``step.onnx`` hashed whole, ``step.bin`` by :data:`STRIPS` strips spread over it: a truncated or
overwritten file is caught, not every flipped bit); an entry that fails the check or that ONNX
Runtime refuses is deleted and rebuilt, never an error. A folder that cannot be written (read-only
home) only costs the build, with a warning.

Knobs: :data:`KEEP` = 4 entries (the most recently used; each is ~2.5x a model's quantized
weights on disk), ``folder`` default ``$SLIMRAG_HOME/steps``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from slimrag.cpu import cpu_flags
from slimrag.files import fsync_tree, slimrag_home, sweep_stale_tmp

#: Bump when the graph :mod:`slimrag.llm.model.step` builds changes: old entries stop matching.
VERSION = 2
#: Entries kept in the folder (least recently used deleted first).
KEEP = 4
#: Strips of ``step.bin`` hashed to check it (4 KiB each).
STRIPS = 64
_STRIP = 4096
_FILES = ("step.onnx", "step.bin")


def default_folder() -> Path:
    """``$SLIMRAG_HOME/steps``."""
    return slimrag_home() / "steps"


def _cpu_flags() -> str:
    """The CPU's instruction-set flags (MLAS picks its kernels and packed layouts by them); where
    none can be read (not Linux), the platform's name stands in."""
    flags = cpu_flags()
    if flags:
        return " ".join(sorted(flags))
    import platform

    return platform.processor() or platform.machine()


def step_key(config: object, arrays: list[tuple[str, np.ndarray]]) -> str:
    """The entry name for a step graph of ``config`` over weights ``arrays`` (name, array): a hash
    of :data:`VERSION`, ONNX Runtime's version, the CPU flags, the config and, per weight, its
    shape, type and 16 strips of its bytes (cheap; another model differs in every strip)."""
    import onnxruntime as ort

    h = hashlib.blake2b(digest_size=16)
    h.update(f"{VERSION}|{ort.__version__}|{_cpu_flags()}|{config!r}".encode())
    for name, a in arrays:
        flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        h.update(f"{name}:{a.dtype}:{a.shape}".encode())
        for at in np.linspace(0, max(flat.size - 64, 0), 16).astype(np.int64):
            h.update(flat[at : at + 64].tobytes())
    return h.hexdigest()


def _digest(path: Path) -> str:
    """A hash of ``path``: whole for a small file, :data:`STRIPS` strips spread over a large one."""
    size = path.stat().st_size
    h = hashlib.blake2b(digest_size=16)
    with path.open("rb") as f:
        if size <= STRIPS * _STRIP:
            h.update(f.read())
        else:
            for at in np.linspace(0, size - _STRIP, STRIPS).astype(np.int64):
                f.seek(int(at))
                h.update(f.read(_STRIP))
    return h.hexdigest()


def _manifest(folder: Path) -> dict[str, Any]:
    """Size and :func:`_digest` of each of the entry's files that exists (``step.bin`` is absent
    when no weight is large enough to go there)."""
    files = [folder / name for name in _FILES if (folder / name).is_file()]
    return {f.name: {"bytes": f.stat().st_size, "digest": _digest(f)} for f in files}


def _ort_errors() -> tuple[type[BaseException], ...]:
    from onnxruntime.capi import onnxruntime_pybind11_state as s

    return (s.Fail, s.InvalidArgument, s.NoSuchFile, s.InvalidProtobuf, s.InvalidGraph, s.RuntimeException)


def _built(model: Any, opts: Any, weights: dict[str, np.ndarray]) -> Any:
    """A session of the built ``model``. ONNX Runtime reads the external ``weights`` in place and
    does not own them, so the session keeps a reference to them: they live as long as it does (as
    in `slimrag.llm.model.qlinear.cpu_session`)."""
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    session.slimrag_weights = weights
    return session


class SavedSteps:
    """The saved step graphs in ``folder`` (see the module header). Safe across processes; one
    instance may be used from several threads (each call works on its own files)."""

    def __init__(self, folder: str | os.PathLike[str] | None = None, *, keep: int = KEEP) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.folder = Path(folder) if folder is not None else default_folder()
        self.keep = keep

    def session(self, key: str, build: Callable[[], tuple[Any, dict[str, np.ndarray]]],
                options: Callable[[dict[str, np.ndarray] | None], Any]) -> tuple[Any, bool]:
        """An ONNX Runtime session of the entry ``key``: loaded when it is saved and sound, else
        built from ``build()`` (an ONNX ``ModelProto`` and the weights it reads from memory,
        :func:`slimrag.llm.model.qlinear.onnx_model`), saved, and loaded from what was saved (the
        packed weights then map the file instead of holding memory). ``options(weights)`` makes
        fresh ``SessionOptions`` (threads, spinning: nothing that changes the saved files).
        Returns the session and whether it came from an entry saved before this call."""
        entry = self.folder / key
        if entry.is_dir():
            try:
                return self._load(entry, options), True
            except (OSError, ValueError, *_ort_errors()) as exc:
                warnings.warn(f"saved decode step {entry} is damaged ({exc}); rebuilding it", stacklevel=2)
                shutil.rmtree(entry, ignore_errors=True)
        model, weights = build()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            sweep_stale_tmp(self.folder)
            tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.folder))
        except OSError as exc:
            warnings.warn(f"cannot save the decode step under {self.folder} ({exc}); building it in every process",
                          stacklevel=2)
            return _built(model, options(weights), weights), False
        opts = options(weights)
        opts.optimized_model_filepath = str(tmp / "step.onnx")
        opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", "step.bin")
        opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        opts.add_session_config_entry("session.save_external_prepacked_constant_initializers", "1")
        built = _built(model, opts, weights)
        ours = False  # whether the entry is the one written here (its files hashed once, just now)
        try:
            (tmp / "manifest.json").write_text(json.dumps(_manifest(tmp)))
            fsync_tree(tmp)
            os.rename(tmp, entry)
            ours = True
        except OSError:  # another process saved the same entry first, or the disk is full: ours is not needed
            shutil.rmtree(tmp, ignore_errors=True)
        self._prune()
        try:
            return self._load(entry, options, check=not ours), False
        except (OSError, ValueError, *_ort_errors()):
            return built, False  # the disk is full or another process's entry was pruned: keep ours

    @staticmethod
    def _load(entry: Path, options: Callable[[dict[str, np.ndarray] | None], Any], *, check: bool = True) -> Any:
        """The session of a saved entry, after checking its files against its manifest (``check``;
        not for the entry this process has just written and hashed)."""
        import onnxruntime as ort

        if check and json.loads((entry / "manifest.json").read_text()) != _manifest(entry):
            raise ValueError("sizes or hashes differ from its manifest")
        sess = ort.InferenceSession(str(entry / "step.onnx"), options(None), providers=["CPUExecutionProvider"])
        os.utime(entry)  # most recently used
        return sess

    def _prune(self) -> None:
        """Delete all but the :attr:`keep` most recently used entries."""
        entries = []
        for p in self.folder.iterdir():
            if p.is_dir() and not p.name.startswith(".tmp-"):
                try:
                    entries.append((p.stat().st_mtime, p))
                except FileNotFoundError:
                    continue  # another process pruned it
        for _, p in sorted(entries, reverse=True)[self.keep :]:
            shutil.rmtree(p, ignore_errors=True)
