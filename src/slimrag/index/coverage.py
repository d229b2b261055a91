"""Chunks awaiting vectors: a state of an index, and how much of it vector search reaches.

Progressive indexing (docs/architecture.md, "Progressive indexing"): a write stores every document's
text first (catalog rows and keyword postings, committed in transactions) and embeds afterwards,
so keyword search and evidence answers work while the vectors fill in. Between the two, and after
an interrupted write (Ctrl-C, SIGKILL), some live chunks have no vector row. Such a chunk is
*awaiting vectors*: not an error, and not recorded anywhere. It is derived, always, as the live
chunk ids of the catalog that no live vector row holds, so there is no second piece of bookkeeping
that a crash could leave out of step with the vectors (a vector part is committed by the manifest
switch alone; see `slimrag.index.writer`).

`awaiting_ids` computes the set: a ``COUNT``/``MAX`` of the catalog and a sum of the liveness mask
first (microseconds to a few milliseconds), the full difference of the two id sets (one read of
the catalog's ids and a sort, O(n)) only when the counts say some are missing. `Coverage` is the
figure a search and ``slimrag info`` report: live chunks, and how many of them have a vector.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from slimrag.catalog import Catalog
    from slimrag.index.store.vectors import VectorStore


@dataclass(frozen=True, slots=True)
class Coverage:
    """How much of an index vector search reaches. chunks: live chunks in the catalog; embedded:
    those with a vector row; filled: chunks awaiting vectors that a search embedded for itself
    (its best keyword candidates, see `slimrag.index.query`; 0 outside a search)."""

    chunks: int
    embedded: int
    filled: int = 0

    @property
    def awaiting(self) -> int:
        """Live chunks with no vector yet."""
        return self.chunks - self.embedded

    @property
    def share(self) -> float:
        """The embedded share of the live chunks (1.0 for an empty index)."""
        return self.embedded / self.chunks if self.chunks else 1.0

    @property
    def complete(self) -> bool:
        """Every live chunk has its vector."""
        return self.embedded >= self.chunks

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the three counts, ``awaiting`` and ``share`` (rounded to 4 places)."""
        return {"chunks": self.chunks, "embedded": self.embedded, "awaiting": self.awaiting,
                "filled": self.filled, "share": round(self.share, 4)}


def counts_key(catalog: Catalog, store: VectorStore) -> tuple[int, int, int, int]:
    """(live chunks, largest live chunk id, live vector rows, all vector rows): changes whenever
    the awaiting set can (an add raises the largest id, a replace or remove moves a count)."""
    n, top = catalog.db.execute("SELECT COUNT(*), COALESCE(MAX(chunk_id), -1) FROM chunks").fetchone()
    return int(n), int(top), int(store.live.sum()), len(store)


def awaiting_ids(catalog: Catalog, store: VectorStore, key: tuple[int, int, int, int] | None = None) -> np.ndarray:
    """Live chunk ids of ``catalog`` with no live row in ``store``, ascending (int64). ``key``:
    `counts_key`, when the caller has it."""
    n, _, live_rows, _ = key if key is not None else counts_key(catalog, store)
    if n <= live_rows:  # every live chunk has a row (a duplicate row, an old race's, could hide one: `check`)
        return np.zeros(0, np.int64)
    live = np.asarray(catalog.live_ids(), dtype=np.int64)
    return np.setdiff1d(live, store.ids[store.live], assume_unique=False).astype(np.int64)
