"""Exact (flat) vector search: the reference every other index is measured against.

All vectors are unit-norm, so the inner product is the cosine similarity and the top-k of
``matrix @ query`` is exact. float32 costs 1,536 bytes per 384-dim vector, float16 half of that
with score changes around 1e-3 (ranks of near-ties may swap). Search is one matrix-vector product
(or matrix-matrix for a batch of queries) plus ``argpartition``: O(n·d), about 5 ms for 40k vectors
here, which is why small corpora never need a graph.

The rows are held as a list of blocks: the generation's matrix and one block per delta part, each
usually a memory map of its file (`slimrag.index.store.layout`). A commit appends its block (`append`):
no earlier block is read or copied, so a commit costs the same at any size (ids and the liveness
mask grow by amortized doubling, `Column`). A query scores block by block into one score row.

Rows whose chunk was removed stay in the matrix until compaction and are masked with ``-inf``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from pathlib import Path

    from slimrag.config import SearchConfig
    from slimrag.index.store.manifest import Manifest


class Column:
    """A 1-d array that grows at its end in amortized O(appended) time (capacity doubles), so
    appending to a million-row index does not copy the million rows. `view` is valid until the
    next append."""

    def __init__(self, init: np.ndarray) -> None:
        self._buf = np.array(init)
        self._n = len(self._buf)

    def __len__(self) -> int:
        return self._n

    @property
    def view(self) -> np.ndarray:
        """The first ``len`` entries (a view of the buffer, not a copy)."""
        return self._buf[: self._n]

    def append(self, values: np.ndarray) -> None:
        """Append ``values`` (cast to this column's dtype)."""
        need = self._n + len(values)
        if need > len(self._buf):
            grown = np.empty(max(need, 2 * len(self._buf), 1024), dtype=self._buf.dtype)
            grown[: self._n] = self._buf[: self._n]
            self._buf = grown
        self._buf[self._n: need] = values
        self._n = need

    def assign(self, values: np.ndarray) -> None:
        """Replace every entry (same length)."""
        if len(values) != self._n:
            raise ValueError(f"{len(values)} values for a column of {self._n}")
        self._buf[: self._n] = values


class LiveRows:
    """The chunk id of every row and which rows are live: the bookkeeping every vector store keeps
    beside its vectors (flat and slim alike), written once here."""

    def __init__(self, ids: np.ndarray) -> None:
        self._ids = Column(np.asarray(ids, dtype=np.int64))
        self._live = Column(np.ones(len(self._ids), dtype=bool))

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def ids(self) -> np.ndarray:
        """The chunk id of every row."""
        return self._ids.view

    @property
    def live(self) -> np.ndarray:
        """True for rows whose chunk is stored (not removed)."""
        return self._live.view

    def set_live(self, live_ids: np.ndarray) -> None:
        """Mark as live exactly the rows whose chunk id is in ``live_ids``."""
        self._live.assign(np.isin(self.ids, live_ids))

    def kill(self, chunk_ids: np.ndarray) -> None:
        """Mark the rows of ``chunk_ids`` removed (the chunks a commit replaced)."""
        if len(chunk_ids):
            self._live.view[np.isin(self.ids, chunk_ids)] = False

    def _add_rows(self, ids: np.ndarray) -> None:
        """Rows for ``ids`` at the end, live."""
        self._ids.append(np.asarray(ids, dtype=np.int64))
        self._live.append(np.ones(len(ids), dtype=bool))


class FlatVectors(LiveRows):
    """Row-major unit vectors in blocks, with their chunk ids and a liveness mask."""

    #: the generation kind this store reads and writes (`slimrag.index.store.vectors.KINDS`)
    kind = "flat"
    #: compaction rewrites a flat generation from its rows; there is no cheaper update
    incremental = False

    def __init__(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        if len(ids) != len(vectors):
            raise ValueError(f"{len(ids)} ids but {len(vectors)} vectors")
        if np.ndim(vectors) != 2:
            raise ValueError(f"vectors must be a matrix, got shape {np.shape(vectors)}")
        self.dim = int(vectors.shape[1])
        self._dtype = vectors.dtype
        super().__init__(ids)
        self._blocks: list[np.ndarray] = []
        self._starts: list[int] = []
        if len(vectors):
            self._blocks, self._starts = [vectors], [0]

    @property
    def vectors(self) -> np.ndarray:
        """Every row as one matrix: the block itself when there is one, else a concatenated copy
        (for tests and small tools; search and compaction read block by block)."""
        if len(self._blocks) == 1:
            return self._blocks[0]
        if not self._blocks:
            return np.zeros((0, self.dim), self._dtype)
        return np.concatenate(self._blocks)

    def append(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Add rows (a committed delta part), live. ``vectors`` is kept as given (a memory map
        stays one): nothing already held is read or copied."""
        if len(ids) != len(vectors) or (len(vectors) and vectors.shape[1] != self.dim):
            raise ValueError(f"{len(ids)} ids and vectors of shape {np.shape(vectors)} for an index of dim {self.dim}")
        if not len(ids):
            return
        self._starts.append(len(self._ids))
        self._blocks.append(vectors)
        self._add_rows(ids)

    def rows(self, rows: np.ndarray) -> np.ndarray:
        """float32 vectors of the given row numbers, in that order (gathered block by block)."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        if not len(rows):
            return out
        which = np.searchsorted(np.asarray(self._starts), rows, side="right") - 1
        for b in np.unique(which):
            sel = which == b
            out[sel] = self._blocks[b][rows[sel] - self._starts[b]]
        return out

    def live_vectors(self) -> tuple[np.ndarray, np.ndarray]:
        """(chunk ids, float32 vectors) of the live rows, sorted by chunk id (in memory: for
        tests and small indexes; compaction streams with `rows`)."""
        rows = np.flatnonzero(self.live)
        rows = rows[np.argsort(self.ids[rows], kind="stable")]
        return self.ids[rows], self.rows(rows)

    def wants_compaction(self, share: float) -> bool:
        """Never: a delta row and a generation row cost the same bytes and the same search time."""
        return False

    def update_into(self, root: Path, gen: int, manifest: Manifest) -> None:
        """Flat generations have no incremental update (`incremental` is False)."""
        raise NotImplementedError("a flat generation is rewritten, not updated")

    def generation_bytes(self, folder: Path) -> dict[str, float] | None:
        """Nothing beyond the folder's file sizes for a flat generation."""
        return None

    def search(self, queries: np.ndarray, k: int, allow: np.ndarray | None = None,
               config: SearchConfig | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k for each query row. Returns (chunk_ids, scores), each (nq, k'), best first,
        where k' = min(k, live rows). ``allow`` is an optional extra row mask (metadata filters).
        ``config`` is accepted for the vector stores' common interface and not read: exact search
        has no knobs."""
        q = np.atleast_2d(np.asarray(queries, dtype=np.float32))
        mask = self.live if allow is None else (self.live & allow)
        n_live = int(mask.sum())
        kk = min(k, n_live)
        if kk == 0 or len(self) == 0:
            return np.zeros((len(q), 0), np.int64), np.zeros((len(q), 0), np.float32)
        scores = np.empty((len(q), len(self)), dtype=np.float32)
        for start, block in zip(self._starts, self._blocks, strict=True):
            scores[:, start: start + len(block)] = (block @ q.T).T  # fp16 blocks upcast here
        scores[:, ~mask] = -np.inf
        if kk < scores.shape[1]:
            part = np.argpartition(-scores, kk - 1, axis=1)[:, :kk]
        else:
            part = np.tile(np.arange(scores.shape[1]), (len(q), 1))
        top = np.take_along_axis(scores, part, axis=1)
        # Stable order: score descending, then chunk id ascending, so ties never flip between runs.
        ids = self.ids
        order = np.lexsort((ids[part], -top), axis=1)
        rows = np.take_along_axis(part, order, axis=1)
        return ids[rows], np.take_along_axis(scores, rows, axis=1)
