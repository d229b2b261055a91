"""Reading rows of a vectors matrix that may be memory-mapped, with a bounded resident set.

A slim build reads the float32 vectors many times (partition gathers, the prune's candidate
gathers, PQ encoding). When the matrix is an ``np.memmap`` (the write path streams a build's
vectors to a file), every page touched stays mapped into the process and counts in its resident
set until unmapped: reading all rows of a 3M x 384 matrix once would add 4.6 GB of RSS although
nothing is copied. :func:`release` drops the process's mappings of those pages
(``madvise(MADV_DONTNEED)``; the kernel's page cache keeps them, so the next read is a minor
fault, not disk I/O), and the readers here call it every ``_RELEASE_BYTES`` of rows read. For
an in-memory matrix every function is a plain numpy read and :func:`release` does nothing.

Knob: ``_RELEASE_BYTES`` (256 MB): rows read between releases; the RSS a mapped matrix may add.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator

import numpy as np

_RELEASE_BYTES = 256 * 1024 * 1024


def _mapping(x: np.ndarray) -> mmap.mmap | None:
    """The ``mmap`` object under ``x`` (an ``np.memmap`` or any view of one), or None."""
    base = x
    while base is not None:
        if isinstance(base, mmap.mmap):
            return base
        base = getattr(base, "base", None)
    return None


def release(x: np.ndarray) -> None:
    """Unmap from this process the pages of ``x``'s file read so far (no-op in memory)."""
    mm = _mapping(x)
    if mm is not None and hasattr(mmap, "MADV_DONTNEED"):
        mm.madvise(mmap.MADV_DONTNEED)


class Reader:
    """Reads rows of ``x`` (n, d) as float32 copies, releasing a mapped file's pages every
    ``_RELEASE_BYTES`` read. Not thread-safe (one byte counter)."""

    def __init__(self, x: np.ndarray) -> None:
        self.x = x
        self.mapped = _mapping(x) is not None
        self._since = 0

    def _count(self, nbytes: int) -> None:
        if not self.mapped:
            return
        self._since += nbytes
        if self._since >= _RELEASE_BYTES:
            release(self.x)
            self._since = 0

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (any order, repeats allowed) as a float32 array in memory."""
        out = np.asarray(self.x[np.asarray(rows)], dtype=np.float32)
        self._count(out.nbytes)
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
