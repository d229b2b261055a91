"""The index folder on disk: manifest, immutable generations, delta parts, atomic switches.

```
NAME.slimrag/
  manifest.json     format, embedder, build config, current generation, delta parts, counts
  catalog.sqlite    documents, chunks, keyword postings (see slimrag.catalog)
  writer.lock       the writer lock (slimrag.index.store.lock): holder's pid and command while held
  gen-NNNNNN/       immutable once written: vectors or graph + codes, and row -> chunk id
  delta/part-NNNNNN.npz   vectors of chunks added since the last compaction
```

The manifest's fields, and its reading, checking and migration, are `slimrag.index.store.manifest`'s.
A delta part is an uncompressed zip of two ``.npy`` arrays; an open index maps its vectors in
place (`map_delta_vectors`) rather than reading them, and a compaction writes a generation's
matrix block by block (`write_npy`), so neither needs the vectors in memory.

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

import ctypes
import mmap
import os
import shutil
import struct
import tempfile
import weakref
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from slimrag.errors import IndexFormatError
from slimrag.files import fsync_dir
from slimrag.index.store.manifest import FORMAT_VERSION, MANIFEST, Manifest  # noqa: F401  (the folder's names in one place)

CATALOG = "catalog.sqlite"
DELTA = "delta"
#: prefix of the scratch file a slim rebuild streams its float32 rows to (deleted after, or by
#: `collect_garbage` when the compaction was killed)
SCRATCH = ".tmp-vectors-"


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
    """The first delta part number from the manifest's ``next_part`` on whose file does not exist:
    a part written by an add killed before its manifest switch keeps its number until the next
    compaction collects it, and must not be reused (`write_delta_part` never overwrites). Such
    parts sit at ``next_part`` and just above it (each killed add leaves at most one), so this
    probes a few names: a commit's cost does not grow with the parts already written."""
    d = Path(root) / DELTA
    seq = max(current, 0)
    while (d / part_name(seq)).exists():
        seq += 1
    return seq


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


def read_delta_part(path: Path, mmap: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """One delta part file: (int64 chunk ids, vectors). With ``mmap`` the vectors are a read-only
    view of the file's bytes (`map_delta_vectors`) instead of a copy in memory. Raises
    `IndexFormatError` when it cannot be read (truncated, not a zip, arrays missing)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            ids = z["ids"].astype(np.int64)  # narrowed on write (or int64 in old parts)
            vecs = map_delta_vectors(path) if mmap else z["vectors"]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError, struct.error) as e:
        raise IndexFormatError(f"{path} is unreadable ({e}); run `slimrag check --repair`") from e
    if len(ids) != len(vecs):
        raise IndexFormatError(f"{path} holds {len(ids)} ids but {len(vecs)} vectors; run `slimrag check --repair`")
    return ids, vecs


def map_delta_vectors(path: Path) -> np.ndarray:
    """The ``vectors`` array of a delta part, memory-mapped in place. A part is an uncompressed
    zip (``np.savez``), so the array's bytes lie contiguous in the file after the member's local
    header and its ``.npy`` header: mapping them costs no read, and the pages stay the kernel's
    cache (an open index holds many parts without holding their bytes, or a file descriptor
    each: `_Mapping`). A compressed member
    (never written by slimrag) is read into memory instead. Raises ValueError/OSError/KeyError
    for a damaged file (`read_delta_part` turns them into `IndexFormatError`)."""
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("vectors.npy")
    if info.compress_type != zipfile.ZIP_STORED:
        with np.load(path, allow_pickle=False) as z:
            return np.asarray(z["vectors"])
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        head = f.read(30)
        if len(head) < 30 or head[:4] != b"PK\x03\x04":
            raise ValueError("no local file header where the zip directory points")
        name_len, extra_len = struct.unpack("<HH", head[26:30])
        f.seek(info.header_offset + 30 + name_len + extra_len)
        version = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(f)
        offset = f.tell()
    if fortran or dtype.hasobject:
        with np.load(path, allow_pickle=False) as z:
            return np.asarray(z["vectors"])
    if offset + int(np.prod(shape)) * dtype.itemsize > os.path.getsize(path):
        raise ValueError("the vectors run past the end of the file")
    if int(np.prod(shape)) == 0:
        return np.zeros(shape, dtype)
    return _map_readonly(path, offset, dtype, tuple(shape))


class _Mapping:
    """A read-only ``mmap`` of part of a file that holds no file descriptor (Python's ``mmap`` and
    ``np.memmap`` keep one open per mapping, and an open index maps one part per commit: a 2M-chunk
    delta would pass the usual limit of 1,024 descriptors). numpy keeps this object alive as the
    array's base through ``__array_interface__``; the region is unmapped when it is collected."""

    def __init__(self, path: Path, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        page = mmap.ALLOCATIONGRANULARITY
        start = offset - offset % page
        length = offset - start + int(np.prod(shape)) * dtype.itemsize
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = _libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, start)
        finally:
            os.close(fd)  # the mapping stays valid without it
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
        weakref.finalize(self, _libc.munmap, addr, length)
        self.__array_interface__ = {"shape": shape, "typestr": dtype.str, "version": 3,
                                    "data": (addr + offset - start, True)}


def _map_readonly(path: Path, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    if _libc is None:  # no C library to call: one descriptor per mapping after all
        return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)
    return np.asarray(_Mapping(path, offset, dtype, shape))


def _load_libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.munmap.restype = ctypes.c_int
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    except (OSError, AttributeError):
        return None
    return libc


_libc = _load_libc()


def write_npy(path: Path, dtype: np.dtype | str, shape: tuple[int, int], blocks: Iterable[np.ndarray]) -> None:
    """Write an ``.npy`` file of ``shape`` from row ``blocks`` given in order, fsynced, without
    holding the matrix: each block is converted to ``dtype`` and written, then dropped. Writing
    through ``write`` and not a writable memory map keeps the written pages out of the process's
    resident set (they are the kernel's cache). Raises ValueError when the blocks do not add up
    to ``shape``."""
    dtype = np.dtype(dtype)
    rows = 0
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": tuple(shape)})
        for block in blocks:
            block = np.ascontiguousarray(block, dtype=dtype)
            if block.ndim != 2 or block.shape[1] != shape[1]:
                raise ValueError(f"block of shape {block.shape} in a matrix of shape {shape}")
            rows += len(block)
            f.write(block.data)
        if rows != shape[0]:
            raise ValueError(f"{rows} rows written for a matrix of {shape[0]}")
        f.flush()
        os.fsync(f.fileno())


def collect_garbage(root: Path, manifest: Manifest) -> list[str]:
    """Delete generations, delta parts, scratch and temp files the manifest does not name.
    Returns them."""
    root = Path(root)
    keep_gen = gen_dir(root, manifest.generation).name
    keep_parts = set(manifest.delta_parts)
    removed = []
    for p in root.iterdir():
        if (p.name.startswith("gen-") and p.name != keep_gen) or p.name.startswith(".tmp-gen-"):
            shutil.rmtree(p)
            removed.append(p.name)
        elif p.name.startswith(SCRATCH):
            p.unlink()
            removed.append(p.name)
    d = root / DELTA
    if d.is_dir():
        for p in d.iterdir():
            if p.name not in keep_parts:
                p.unlink()
                removed.append(f"{DELTA}/{p.name}")
    return removed


def stored(path: Path) -> bool:
    """False for SQLite's ``-shm`` file: an index of the WAL that exists only while a connection
    is open (a reader measuring the folder holds one), so it is no part of what the index stores."""
    return not path.name.endswith("-shm")


def folder_bytes(path: Path) -> int:
    """Total size of the files under ``path`` that the index stores (see `stored`). A file or
    folder that a concurrent compaction's garbage collection deletes while it is counted is
    skipped (`os.walk` ignores a folder that vanished), so a count never fails for that; the total
    is then off by what was being freed."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    total = 0
    for folder, _, names in os.walk(path):
        for name in names:
            if not stored(Path(name)):
                continue
            try:
                total += os.stat(os.path.join(folder, name), follow_symlinks=False).st_size
            except FileNotFoundError:
                continue
    return total
