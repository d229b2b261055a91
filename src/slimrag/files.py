"""Atomic file writes and fsync, shared by the index folder (`index.layout`) and the model cache
(`llm.weights`).

Both keep one rule for crash safety: a file or folder that a reader may look at is never modified
in place. It is written under a temporary name in the same folder, fsynced, and renamed over the
old one; then the folder itself is fsynced so the rename survives a power loss. A reader sees the
old file or the new one, never half of either.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
    """fsync a folder, so a rename inside it survives a crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    """fsync every file directly inside ``folder``, then the folder (before renaming it into place)."""
    for f in folder.iterdir():
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fsync_dir(folder)


def write_json_atomic(path: Path, data: dict[str, Any], indent: int = 2) -> None:
    """Replace ``path`` with ``data`` so a reader sees either the old or the new file, never half.
    Creates the parent folder when missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=indent, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def slimrag_home() -> Path:
    """Root of slimrag's caches (converted LLM weights, the ONNX embedder): ``$SLIMRAG_HOME`` or
    ``~/.cache/slimrag``."""
    env = os.environ.get("SLIMRAG_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "slimrag"


def read_json_or_empty(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``, or ``{}`` when it is missing or unreadable: for caches, which
    rebuild what they cannot read."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def sweep_stale_tmp(parent: Path, max_age_s: float = 3600.0) -> None:
    """Delete ``.tmp-*`` folders in ``parent`` older than ``max_age_s``: what a writer killed
    before its rename left (a live writer's temp folder is younger)."""
    now = time.time()
    for tmp in parent.glob(".tmp-*"):
        try:
            if now - tmp.stat().st_mtime > max_age_s:
                shutil.rmtree(tmp)
        except FileNotFoundError:
            continue  # another process swept it first

