"""A byte-budgeted LRU of recomputed embeddings, keyed by graph row.

Queries are skewed (RAGCache measured 3% of documents drawing 60% of hits), so the rows a slim
search recomputes repeat; keeping their exact vectors turns repeat recomputations (~30 ms each on a
CPU) into a dot product. Vectors live in one preallocated float32 slab of ``budget // (4 d)`` rows,
so the budget is the memory used, without per-entry Python arrays; an ``OrderedDict`` maps row to
slot in recency order. A cache belongs to one index generation: row ids change on compaction, so a
new generation needs a new cache.

One cache per generation per process (`shared`): every open handle of the same generation in a
process (the server's worker threads, a handle reopened after another process's ``add``, which
adds a delta part and leaves the generation as it was) reads and fills the same slab, so a row
recomputed for one thread is free for the others, and a reopen keeps what was recomputed. A lock
makes each call atomic; `lookup` (the one read) returns a copy, since the slot may be reused once it
is released.

A search gives every pooled row already in the cache its exact score for free (`SlimSearcher`), so
a slim search's top-k can depend on what the process searched before, now across handles as it
always did within one: both are valid answers of the approximate search, the warmer one at least
as close to exact. A comparison that needs a search independent of that history calls `forget`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np


class VectorCache:
    """LRU of recomputed float32 vectors by row, in one preallocated slab of ``capacity`` rows
    (``budget_bytes // (4 d)``): no per-entry Python arrays, so the budget is what it uses."""

    def __init__(self, budget_bytes: int, dim: int) -> None:
        self.capacity = max(0, budget_bytes // (4 * dim))
        self.dim = dim
        self._slab = np.empty((self.capacity, dim), dtype=np.float32)
        self._slot: OrderedDict[int, int] = OrderedDict()  # row -> slot, least recent first
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._slot)

    @property
    def nbytes(self) -> int:
        """Memory held by the slab (the budget, rounded down to whole vectors)."""
        return int(self._slab.nbytes)

    def clear(self) -> None:
        """Forget every entry (for a new index generation, whose row ids differ)."""
        with self._lock:
            self._slot.clear()

    def lookup(self, row: int) -> np.ndarray | None:
        """A copy of the cached vector of ``row``, or None; marks it most recently used."""
        with self._lock:
            slot = self._slot.get(row)
            if slot is None:
                return None
            self._slot.move_to_end(row)
            return self._slab[slot].copy()

    def put(self, rows: np.ndarray, vectors: np.ndarray) -> None:
        """Insert rows (evicting the least recently used); a no-op with zero capacity."""
        if self.capacity == 0:
            return
        with self._lock:
            self._put(rows, vectors)

    def _put(self, rows: np.ndarray, vectors: np.ndarray) -> None:
        for row, vec in zip(rows.tolist(), vectors, strict=True):
            if row in self._slot:
                self._slot.move_to_end(row)
                continue
            if len(self._slot) >= self.capacity:
                _, slot = self._slot.popitem(last=False)
            else:
                slot = len(self._slot)
            self._slab[slot] = vec
            self._slot[row] = slot


#: index folder -> (its generation's identity, that generation's cache): the caches `shared` hands out
_SHARED: dict[str, tuple[tuple[str, str], VectorCache]] = {}
_SHARED_LOCK = threading.Lock()


def shared(generation: Path, build_id: str, budget_bytes: int, dim: int) -> VectorCache:
    """The process's cache of the generation stored in folder ``generation`` (module header). A
    generation is known by its folder's path and the random ``build_id`` its save wrote
    (`SlimArtifacts.build_id`), so a new generation, even in a folder of a name used before, gets
    a new cache (a folder's inode and times can repeat: a quick rebuild reused both). One cache per
    index folder is kept here (the newest generation asked for): one budget of memory per index."""
    ident = (str(Path(generation).resolve()), build_id)
    root = str(Path(ident[0]).parent)
    with _SHARED_LOCK:
        held = _SHARED.get(root)
        if held is None or held[0] != ident or held[1].dim != dim:
            held = (ident, VectorCache(budget_bytes, dim))
            _SHARED[root] = held
        return held[1]


def forget() -> None:
    """Drop every shared cache: handles opened after this start cold (those open keep theirs)."""
    with _SHARED_LOCK:
        _SHARED.clear()
