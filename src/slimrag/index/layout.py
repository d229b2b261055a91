"""The index folder on disk: manifest, immutable generations, delta parts, atomic switches.

```
NAME.slimrag/
  manifest.json     format, embedder, build config, current generation, delta parts, counts
  catalog.sqlite    documents, chunks, FTS5 (see slimrag.catalog)
  writer.lock       the writer lock (slimrag.index.lock): holder's pid and command while held
  gen-NNNNNN/       immutable once written: vectors or graph + codes, and row -> chunk id
  delta/part-NNNNNN.npz   vectors of chunks added since the last compaction
```

Row -> chunk id arrays (``ids.npy`` of a generation, ``ids`` of a delta part) are written in the
smallest unsigned type that holds the largest id (:func:`narrow_ids`: uint8, uint16 or uint32,
1-4 bytes per row instead of int64's 8; int64 past 2^32) and widened to int64 on read, so
folders written with int64 ids read the same.

Crash safety comes from one rule: nothing the manifest points at is ever modified. A new
generation or delta part is written under a temporary name, fsynced, and renamed into place; then
the manifest is replaced by write-temp + fsync + rename. A crash at any point leaves the previous
manifest, which names only complete files. Files that no manifest names (from a crash, or from
before a compaction) are deleted by :func:`collect_garbage` after a successful switch.

Chunk ids are handed out from ``next_chunk_id`` in the manifest, which only grows: a vector
written by an interrupted `add` can never be mistaken for a later chunk that reused its id.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from slimrag.errors import IndexFormatError
from slimrag.files import fsync_dir

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
CATALOG = "catalog.sqlite"
DELTA = "delta"


def read_manifest(root: Path) -> dict[str, Any]:
    """Read and check the manifest of an index folder."""
    path = Path(root) / MANIFEST
    if not path.is_file():
        raise IndexFormatError(f"{root} is not a slimrag index (no {MANIFEST}); build one with `slimrag build`")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise IndexFormatError(f"{path} is corrupt ({e.msg}); rebuild the index") from e
    if data.get("format") != FORMAT_VERSION:
        raise IndexFormatError(
            f"{root} has format {data.get('format')!r}; this slimrag reads format {FORMAT_VERSION}. Rebuild it.")
    return data


def gen_dir(root: Path, generation: int) -> Path:
    return Path(root) / f"gen-{generation:06d}"


def next_generation(root: Path, current: int) -> int:
    """A generation number above the current one and above any folder left by an interrupted
    compaction (those are debris, deleted by `collect_garbage` after the next switch)."""
    found = [int(p.name[4:]) for p in Path(root).glob("gen-*") if p.name[4:].isdigit()]
    return max([current, *found]) + 1


def narrow_ids(ids: np.ndarray) -> np.ndarray:
    """``ids`` (non-negative chunk ids) in the smallest of uint8/16/32 that holds them all; int64
    when an id is negative or >= 2^32. Readers widen back with ``np.asarray(ids, np.int64)``."""
    ids = np.asarray(ids)
    if len(ids) == 0:
        return ids.astype(np.uint8)
    if int(ids.min()) >= 0:
        hi = int(ids.max())
        for dtype in (np.uint8, np.uint16, np.uint32):
            if hi <= np.iinfo(dtype).max:
                return ids.astype(dtype)
    return ids.astype(np.int64)


def write_generation(root: Path, generation: int, arrays: dict[str, np.ndarray],
                     writer: Callable[[Path], None] | None = None) -> Path:
    """Write ``arrays`` as ``NAME.npy`` files (and whatever ``writer(folder)`` adds) into a new
    generation folder, atomically: temp folder, fsync every file, rename."""
    final = gen_dir(root, generation)
    if final.exists():
        raise IndexFormatError(f"{final} already exists; refusing to overwrite an immutable generation")
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=root))
    try:
        for name, arr in arrays.items():
            with open(tmp / f"{name}.npy", "wb") as f:
                np.save(f, np.ascontiguousarray(arr), allow_pickle=False)
                f.flush()
                os.fsync(f.fileno())
        if writer is not None:
            writer(tmp)
            for p in tmp.iterdir():
                with open(p, "rb") as f:
                    os.fsync(f.fileno())
        fsync_dir(tmp)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(Path(root))
    return final


def read_generation(root: Path, generation: int, mmap: bool = True) -> dict[str, np.ndarray]:
    """Load every array of a generation (memory-mapped by default: opening costs no copy)."""
    d = gen_dir(root, generation)
    if not d.is_dir():
        raise IndexFormatError(f"{d} is missing; the index is damaged, rebuild it")
    mode = "r" if mmap else None
    return {p.stem: np.load(p, mmap_mode=mode, allow_pickle=False) for p in sorted(d.glob("*.npy"))}


def part_name(seq: int) -> str:
    """The file name of delta part number ``seq``."""
    return f"part-{seq:06d}.npz"


def next_part(root: Path, current: int) -> int:
    """A delta part number at or above the manifest's ``next_part`` whose file does not exist: a
    part written by an add killed before its manifest switch keeps its number until the next
    compaction collects it, and must not be reused (`write_delta_part` never overwrites)."""
    found = [int(p.name[5:11]) for p in (Path(root) / DELTA).glob("part-*.npz") if p.name[5:11].isdigit()]
    return max([current - 1, *found]) + 1


def write_delta_part(root: Path, seq: int, ids: np.ndarray, vectors: np.ndarray) -> str:
    """Write one delta part (ids + vectors) atomically; returns its file name for the manifest.
    The part is created exclusively (a hard link of the fsynced temp file, which fails when the
    name exists): a part file is never overwritten, so a writer working from a stale manifest
    cannot destroy another's vectors; it gets an `IndexFormatError` instead."""
    d = Path(root) / DELTA
    d.mkdir(exist_ok=True)
    name = part_name(seq)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, ids=narrow_ids(ids), vectors=vectors)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, d / name)
        except FileExistsError:
            raise IndexFormatError(f"{d / name} already exists; refusing to overwrite a delta part "
                                   "(was the index written without its writer lock?)") from None
    finally:
        Path(tmp).unlink(missing_ok=True)
    fsync_dir(d)
    return name


def read_delta_parts(root: Path, names: list[str]) -> tuple[np.ndarray, np.ndarray | None]:
    """Concatenate the delta parts named by the manifest: (ids, vectors or None when empty)."""
    ids, vecs = [], []
    for name in names:
        path = Path(root) / DELTA / name
        if not path.is_file():
            raise IndexFormatError(f"{path} is named by the manifest but missing; "
                                  "run `slimrag check --repair` to re-embed its chunks")
        part_ids, part_vecs = read_delta_part(path)
        ids.append(part_ids)
        vecs.append(part_vecs)
    if not ids:
        return np.zeros(0, dtype=np.int64), None
    return np.concatenate(ids), np.concatenate(vecs)


def read_delta_part(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One delta part file: (int64 chunk ids, vectors). Raises `IndexFormatError` when it cannot
    be read (truncated, not a zip, arrays missing)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            ids = z["ids"].astype(np.int64)  # narrowed on write (or int64 in old parts)
            vecs = z["vectors"]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as e:
        raise IndexFormatError(f"{path} is unreadable ({e}); run `slimrag check --repair`") from e
    if len(ids) != len(vecs):
        raise IndexFormatError(f"{path} holds {len(ids)} ids but {len(vecs)} vectors; run `slimrag check --repair`")
    return ids, vecs


def collect_garbage(root: Path, manifest: dict[str, Any]) -> list[str]:
    """Delete generations, delta parts and temp files the manifest does not name. Returns them."""
    root = Path(root)
    keep_gen = gen_dir(root, manifest["generation"]).name
    keep_parts = set(manifest.get("delta_parts", []))
    removed = []
    for p in root.iterdir():
        if (p.name.startswith("gen-") and p.name != keep_gen) or p.name.startswith(".tmp-gen-"):
            shutil.rmtree(p)
            removed.append(p.name)
    d = root / DELTA
    if d.is_dir():
        for p in d.iterdir():
            if p.name not in keep_parts:
                p.unlink()
                removed.append(f"{DELTA}/{p.name}")
    return removed


def folder_bytes(path: Path) -> int:
    """Total size of the files under ``path``."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
