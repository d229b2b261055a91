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
mappings of ``index/store/layout.py``), where dropping a page can never lose data; anonymous or private
memory is never touched. :func:`release_file_pages` does the same for every such mapping of the
process (what a compaction streaming many parts calls). `RowReader` releases every ``RELEASE_BYTES``
of file it may have mapped. A read maps more than it copies: on this machine's kernel (6.18) a
fault on a file in the page cache maps the whole large folio around it, ~2 MB (measured: 1.95 MB
of RSS per isolated row touched), so a gather of rows spread over the file maps the file's whole
span. `RowReader` therefore counts the distinct 2 MB windows of the file each read touches (an upper
bound of what it maps: folios are at most that size and aligned to it), cuts every gather,
sorted first, into chunks of at most a quarter of the budget of windows, and releases when the
windows touched since the last release reach the budget. So whatever the rows, sorted or not,
one RowReader keeps at most ``RELEASE_BYTES`` plus one chunk of its file mapped. The price is
faults: a gather spread thin over a large file re-maps a folio for a few rows, so callers that
gather many rows at random (the prune) first read the union of a batch's rows once into memory
(``prune.py``). Before this accounting, unsorted gathers counted only the bytes they copied and
mapped nearly the whole 1.4 GB file at 1M rows (4.4 GB at 3M). A mapping of at most
``RELEASE_BYTES`` (or an in-memory matrix) is read directly: mapped whole, it is within budget.

Knob: ``RELEASE_BYTES`` (256 MB): file bytes a RowReader may map between releases.
Linux only (``/proc/self/maps`` and ``madvise``); elsewhere releases are no-ops (correct, more RSS).
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Iterator

import numpy as np

RELEASE_BYTES = 256 * 1024 * 1024
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


class RowReader:
    """Reads rows of ``x`` (n, d) as float32 copies with a bounded mapped set: when ``x`` is a
    shared read-only file mapping larger than ``RELEASE_BYTES``, every read counts the 2 MB file
    windows it may map (a fault maps the large folio around the row, see the module header), and
    the RowReader releases ``x``'s pages whenever the windows counted since the last release reach
    ``RELEASE_BYTES``. A gather is read in sorted chunks cut so that no chunk's windows pass a
    quarter of that, so the bound holds within one call too, whatever the rows: at most
    ``RELEASE_BYTES`` plus one chunk of ``x``'s file is mapped by this RowReader at any time. A
    mapping that fits the budget whole (or an in-memory matrix) is read directly. Not thread-safe
    (one window counter)."""

    def __init__(self, x: np.ndarray) -> None:
        self.x = x
        self.mapped = is_file_mapped(x)
        #: True when reads are counted and released (a mapping larger than the budget)
        self.bounded = self.mapped and x.nbytes > RELEASE_BYTES
        self._row_bytes = int(x.strides[0]) if x.ndim else 0
        self._offset = _file_offset(x) if self.bounded else 0
        self._seen = np.zeros(0, dtype=bool)
        self._since = 0

    def _windows(self, rows: np.ndarray, span: bool = False) -> np.ndarray:
        """Sorted 2 MB file windows the rows ``rows`` (sorted) touch: each row's first and last
        byte; with ``span``, every window from the first row's to the last row's (a slice)."""
        first = (self._offset + rows * self._row_bytes) // _FOLIO
        last = (self._offset + (rows + 1) * self._row_bytes - 1) // _FOLIO
        if span:
            return np.arange(first[0], last[-1] + 1)
        return np.unique(np.concatenate([first, last]))

    def _count(self, windows: np.ndarray) -> None:
        """Add ``windows`` (just read) to the mapped set; release once it reaches the budget."""
        if len(self._seen) <= int(windows[-1]):
            self._seen = np.concatenate([self._seen, np.zeros(int(windows[-1]) + 1 - len(self._seen), dtype=bool)])
        fresh = windows[~self._seen[windows]]
        self._seen[fresh] = True
        self._since += len(fresh) * _FOLIO
        if self._since >= RELEASE_BYTES:
            release(self.x)
            self._seen[:] = False
            self._since = 0

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (any shape and order, repeats allowed) as a float32 array of shape
        ``rows.shape + (d,)`` in memory."""
        rows = np.asarray(rows)
        if not self.bounded or rows.size == 0:
            return np.asarray(self.x[rows], dtype=np.float32)
        flat = rows.reshape(-1).astype(np.int64, copy=False)
        if len(flat) > 1 and np.any(flat[1:] <= flat[:-1]):
            uniq, inverse = np.unique(flat, return_inverse=True)
            return self._sorted(uniq)[inverse].reshape(*rows.shape, -1)
        return self._sorted(flat).reshape(*rows.shape, -1)

    def _sorted(self, rows: np.ndarray) -> np.ndarray:
        """Strictly increasing ``rows``, read in chunks of at most ``RELEASE_BYTES / 4`` of windows."""
        out = np.empty((len(rows), *self.x.shape[1:]), dtype=np.float32)
        first = (self._offset + rows * self._row_bytes) // _FOLIO
        # windows opened so far at each row: a chunk closes when it has opened its share
        opened = np.cumsum(np.concatenate([[1], first[1:] != first[:-1]]))
        per_chunk = max(1, RELEASE_BYTES // (4 * _FOLIO))
        cuts = np.searchsorted(opened, np.arange(per_chunk, opened[-1], per_chunk), side="right")
        for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(rows)], strict=True):
            part = rows[lo:hi]
            out[lo:hi] = self.x[part]
            self._count(self._windows(part))
        return out

    def block(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` as a contiguous float32 array in memory."""
        if not self.bounded or stop <= start:
            return np.array(self.x[start:stop], dtype=np.float32, copy=True)
        out = np.empty((stop - start, *self.x.shape[1:]), dtype=np.float32)
        step = max(1, RELEASE_BYTES // (4 * max(1, self._row_bytes)))
        for lo in range(start, stop, step):
            hi = min(stop, lo + step)
            out[lo - start : hi - start] = self.x[lo:hi]
            self._count(self._windows(np.array([lo, hi - 1], dtype=np.int64), span=True))
        return out

    def blocks(self, step: int) -> Iterator[tuple[int, np.ndarray]]:
        """``(start, rows start:start+step)`` over the whole matrix."""
        for start in range(0, len(self.x), step):
            yield start, self.block(start, min(len(self.x), start + step))

    def done(self) -> None:
        """Release what is still mapped."""
        if self.mapped:
            release(self.x)
        self._seen[:] = False
        self._since = 0


def _file_offset(x: np.ndarray) -> int:
    """File offset of ``x``'s first byte where its base is an ``np.memmap`` (the header of an
    ``np.load(mmap_mode="r")`` file), so windows line up with the page cache's folios; 0 otherwise
    (windows then may straddle two folios: the count is off by at most a factor of two)."""
    base = x
    while isinstance(getattr(base, "base", None), np.ndarray):
        base = base.base
    if not isinstance(base, np.memmap):
        return 0
    return int(base.offset) + int(x.__array_interface__["data"][0]) - int(base.__array_interface__["data"][0])


class RowSet:
    """The rows ``ids`` of a `RowReader`'s matrix read once into memory, looked up by global row id.

    The prune gathers a few dozen candidate rows per node, ~37,000 rows a batch spread over the
    file; read straight from a large mapping, each batch would re-map most of the file's folios
    after every release. Reading the union of a few thousand nodes' candidates once (sorted,
    bounded) and gathering from memory pays the faults once per set, and the nodes are taken in
    partition order so that a set's union is a neighbourhood, not the file."""

    def __init__(self, reader: RowReader, ids: np.ndarray) -> None:
        ids = np.asarray(ids).reshape(-1)
        self.ids = np.unique(ids[ids >= 0]).astype(np.int64)
        self.vectors = reader.take(self.ids)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (ids of the set; anything else reads some other row of it) as float32
        ``rows.shape + (d,)``."""
        pos = np.searchsorted(self.ids, rows)
        return self.vectors[np.minimum(pos, len(self.ids) - 1)]


def rows_of(reader: RowReader, ids: np.ndarray) -> RowReader | RowSet:
    """What to read the rows ``ids`` from: a `RowSet` of them when ``reader`` is bounded (a large
    mapping), else the reader itself (its reads are plain numpy gathers)."""
    return RowSet(reader, ids) if reader.bounded and len(ids) else reader
