"""A byte-budgeted LRU of recomputed embeddings, keyed by graph row.

Queries are skewed (RAGCache measured 3% of documents drawing 60% of hits), so the rows a slim
search recomputes repeat; keeping their exact vectors turns repeat recomputations (~30 ms each on a
CPU) into a dot product. Vectors live in one preallocated float32 slab of ``budget // (4 d)`` rows,
so the budget is the memory used, without per-entry Python arrays; an ``OrderedDict`` maps row to
slot in recency order. A cache belongs to one index generation: row ids change on compaction, so a
new generation needs a new cache. Not thread-safe (``get`` reorders).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np


class VectorCache:
    """LRU of recomputed float32 vectors by row, in one preallocated slab of ``capacity`` rows
    (``budget_bytes // (4 d)``): no per-entry Python arrays, so the budget is what it uses."""

    def __init__(self, budget_bytes: int, dim: int) -> None:
        self.capacity = max(0, budget_bytes // (4 * dim))
        self._slab = np.empty((self.capacity, dim), dtype=np.float32)
        self._slot: OrderedDict[int, int] = OrderedDict()  # row -> slot, least recent first

    def __len__(self) -> int:
        return len(self._slot)

    @property
    def nbytes(self) -> int:
        """Memory held by the slab (the budget, rounded down to whole vectors)."""
        return int(self._slab.nbytes)

    def clear(self) -> None:
        """Forget every entry (for a new index generation, whose row ids differ)."""
        self._slot.clear()

    def __contains__(self, row: int) -> bool:
        return row in self._slot

    def get(self, row: int) -> np.ndarray:
        """The cached vector of ``row`` (KeyError if absent); marks it most recently used."""
        slot = self._slot[row]
        self._slot.move_to_end(row)
        return self._slab[slot]

    def put(self, rows: np.ndarray, vectors: np.ndarray) -> None:
        """Insert rows (evicting the least recently used); a no-op with zero capacity."""
        if self.capacity == 0:
            return
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
