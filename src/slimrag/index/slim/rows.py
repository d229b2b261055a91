"""Reading rows of a vectors matrix that may be memory-mapped, with a bounded resident set.

A slim build reads the float32 vectors many times (partition gathers, the prune's candidate
gathers, PQ encoding), and a compaction first streams them from the delta parts, each a
memory-mapped file. Every page of a mapped file that is read stays mapped into the process and
counts in its resident set until unmapped: reading all rows of a 3M x 384 matrix once adds 4.6 GB
of RSS although nothing is copied. Measured at 1M rows before this module released the delta
parts' pages too: 2,971 MiB of the build's 3,926 MiB peak were such file pages (the parts and the
build's scratch copy, both fully resident).

:func:`release` drops the process's mappings of a mapped array's pages
(``madvise(MADV_DONTNEED)``; the kernel's page cache keeps them, so the next read is a minor
fault, not disk I/O). It applies only to *shared read-only file mappings* (``r--s`` in
``/proc/self/maps``: ``np.memmap`` in mode "r", ``np.load(mmap_mode="r")``, the delta parts'
mappings of ``index/layout.py``), where dropping a page can never lose data; anonymous or private
memory is never touched. :func:`release_file_pages` does the same for every such mapping of the
process (what a compaction streaming many parts calls). `Reader` releases every ``RELEASE_BYTES``
of file it has mapped. A read maps more than it copies: on this machine's kernel (6.18) a fault on
a file in the page cache maps the whole large folio around it, ~2 MB (measured: 1.95 MB of RSS
per isolated row touched), so a gather of rows spread over the file maps the file's whole span.
Sorted gathers (a partition's rows, the k-means sample) are therefore read in chunks of
``GATHER_ROWS`` rows, each counted as the file span it covers plus one folio: their mapped pages
stay under ~``RELEASE_BYTES`` whatever n (at 1M rows the k-means sample alone used to map all of
the 1.4 GB file, and a partition's reads ~1.3 GB between releases). Unsorted gathers (the prune's
candidates) count the bytes they copy: each maps most of the file anyway, so their file pages are
bounded by the file, not by this knob (the limit left: see docs/benchmarks.md). For an
in-memory matrix everything is a plain numpy read and the releases do nothing.

Knobs: ``RELEASE_BYTES`` (256 MB): mapped bytes between releases; ``GATHER_ROWS`` (4,096): rows
per chunk of a sorted gather.
Linux only (``/proc/self/maps`` and ``madvise``); elsewhere releases are no-ops (correct, more RSS).
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Iterator

import numpy as np

RELEASE_BYTES = 256 * 1024 * 1024
GATHER_ROWS = 4096
#: what one fault may map around the row it reads (a large page-cache folio)
_FOLIO = 2 * 1024 * 1024
_MADV_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)
_PAGE = mmap.PAGESIZE


def _load_madvise():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.madvise
    except (OSError, AttributeError):  # no C library: releases become no-ops
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return fn


_madvise = _load_madvise() if _MADV_DONTNEED is not None else None


def shared_file_maps() -> list[tuple[int, int]]:
    """(start, end) addresses of this process's shared read-only file mappings (``r--s`` with an
    inode), from ``/proc/self/maps``; empty where that file does not exist."""
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or parts[1] != "r--s" or parts[4] == "0":
            continue
        lo, hi = parts[0].split("-")
        out.append((int(lo, 16), int(hi, 16)))
    return out


def _drop(lo: int, hi: int) -> None:
    lo -= lo % _PAGE
    if _madvise is not None and hi > lo and _madvise(lo, hi - lo, _MADV_DONTNEED) != 0:
        raise OSError(ctypes.get_errno(), f"madvise(MADV_DONTNEED) failed on {hi - lo} bytes at {lo:#x}")


def _extent(x: np.ndarray) -> tuple[int, int] | None:
    """Address range of the memory under ``x`` (its outermost numpy base), or None when that
    base is not a numpy array over foreign memory."""
    base = x
    while isinstance(getattr(base, "base", None), np.ndarray):
        base = base.base
    if not isinstance(base, np.ndarray) or base.base is None or base.size == 0:
        return None  # owns its data (anonymous memory) or empty
    lo = int(base.__array_interface__["data"][0])
    return lo, lo + int(base.nbytes)


def release(x: np.ndarray) -> None:
    """Unmap from this process the resident pages of ``x``'s memory where it is a shared
    read-only file mapping (no-op for anything else, and off Linux)."""
    if _madvise is None:
        return
    span = _extent(x)
    if span is None:
        return
    for lo, hi in shared_file_maps():
        a, b = max(lo, span[0]), min(hi, span[1])
        if a < b:
            _drop(a, b)


def release_file_pages() -> None:
    """Unmap from this process the resident pages of every shared read-only file mapping (all
    ``r--s`` regions): what a compaction that streamed every delta part calls, since each part is a
    mapping of its own. Mappings stay valid; their next read is a page-cache hit."""
    if _madvise is None:
        return
    for lo, hi in shared_file_maps():
        _drop(lo, hi)


def is_file_mapped(x: np.ndarray) -> bool:
    """True when ``x``'s memory lies in a shared read-only file mapping (the case `release` acts on)."""
    span = _extent(x)
    return span is not None and any(lo < span[1] and span[0] < hi for lo, hi in shared_file_maps())


class Reader:
    """Reads rows of ``x`` (n, d) as float32 copies, releasing a mapped file's pages every
    ``RELEASE_BYTES`` read. Not thread-safe (one byte counter)."""

    def __init__(self, x: np.ndarray) -> None:
        self.x = x
        self.mapped = is_file_mapped(x)
        self._since = 0

    def _count(self, nbytes: int) -> None:
        if not self.mapped:
            return
        self._since += nbytes
        if self._since >= RELEASE_BYTES:
            release(self.x)
            self._since = 0

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (any shape and order, repeats allowed) as a float32 array of shape
        ``rows.shape + (d,)`` in memory."""
        rows = np.asarray(rows)
        if not self.mapped or rows.ndim != 1 or len(rows) < 2 or np.any(rows[1:] < rows[:-1]):
            out = np.asarray(self.x[rows], dtype=np.float32)
            self._count(out.nbytes)
            return out
        out = np.empty((len(rows), *self.x.shape[1:]), dtype=np.float32)
        row_bytes = int(self.x.strides[0])
        for start in range(0, len(rows), GATHER_ROWS):
            part = rows[start : start + GATHER_ROWS]
            out[start : start + len(part)] = self.x[part]
            self._count((int(part[-1]) - int(part[0]) + 1) * row_bytes + _FOLIO)
        return out

    def block(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` as a contiguous float32 array in memory."""
        out = np.array(self.x[start:stop], dtype=np.float32, copy=True)
        self._count(out.nbytes)
        return out

    def blocks(self, step: int) -> Iterator[tuple[int, np.ndarray]]:
        """``(start, rows start:start+step)`` over the whole matrix."""
        for start in range(0, len(self.x), step):
            yield start, self.block(start, min(len(self.x), start + step))

    def done(self) -> None:
        """Release what is still mapped."""
        if self.mapped:
            release(self.x)
            self._since = 0
