"""`SlimVectors`: the slim generation (graph + PQ codes, no embeddings) plus the exact delta rows,
behind the same interface as `FlatVectors` (``ids``, ``live``, ``set_live``, ``kill``, ``append``,
``rows``, ``live_vectors``, ``search``).

Rows ``[0, n_gen)`` are graph rows, answered by `SlimSearcher` with exact reranking of recomputed
embeddings; rows ``[n_gen, n)`` are chunks added since the last compaction, kept as exact vectors
(`FlatVectors`, block per delta part; a commit appends one). Both lists are merged by exact score,
so a query sees one top-k. ``rows`` gives float32 vectors of any rows: graph rows recomputed
(``RECOMPUTE_BATCH`` per call), delta rows read; a rebuilding compaction streams through it.

Filters: when a metadata filter leaves only a few graph rows (``SMALL_FILTER`` or fewer), those
rows are recomputed and scored directly: exact, and cheaper than walking a graph whose rows are
mostly skipped. Thread-safety: one lock around the searcher (it owns visit marks; its cache of
recomputed rows is shared by every handle of the generation in this process, `vcache.shared`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from slimrag.config import SearchConfig
from slimrag.index.store import layout
from slimrag.index.store.flat import FlatVectors, LiveRows
from slimrag.index.store.slim.artifacts import SlimArtifacts, slim_bytes
from slimrag.index.store.slim.config import SlimConfig
from slimrag.index.store.slim.searcher import SlimSearcher
from slimrag.index.store.slim.update import SlimUpdate, UpdateConfig, update_slim
from slimrag.index.store.slim.vcache import VectorCache

if TYPE_CHECKING:
    from slimrag.index.store.manifest import Manifest

log = logging.getLogger("slimrag.index")

#: graph rows at or below which a filtered query recomputes the allowed rows instead of walking
SMALL_FILTER = 64
#: graph rows per ``recompute`` call in `SlimVectors.live_vectors` (bounds the texts held at once)
RECOMPUTE_BATCH = 2048


def _by_rows(recompute_ids: Callable[[np.ndarray], np.ndarray], gen_ids: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Exact vectors of generation rows ``rows``: their chunk ids' recomputed embeddings."""
    return recompute_ids(gen_ids[rows])


class SlimVectors(LiveRows):
    """Slim generation + exact delta, searched together; rows (`ids`, `live`): graph rows, then
    delta rows."""

    #: the generation kind this store reads and writes (`slimrag.index.store.vectors.KINDS`)
    kind = "slim"
    #: compaction updates the graph in place of a rebuild (`updated`)
    incremental = True

    def __init__(self, gen_ids: np.ndarray, artifacts: SlimArtifacts, delta: FlatVectors,
                 recompute_ids: Callable[[np.ndarray], np.ndarray], config: SlimConfig,
                 cache: VectorCache | None = None) -> None:
        self.gen_ids = np.asarray(gen_ids, dtype=np.int64)
        self.n_gen = len(self.gen_ids)
        self.dim = artifacts.dim
        #: the exact rows; its own liveness mask stays all-True (this store's mask covers them)
        self.delta = delta
        super().__init__(np.concatenate([self.gen_ids, delta.ids]))
        self._recompute_ids = recompute_ids
        # by rows of this generation; a lambda over ``self`` would close a reference cycle
        self.searcher = SlimSearcher(artifacts, functools.partial(_by_rows, recompute_ids, self.gen_ids), config,
                                     cache=cache)

    def append(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Add exact delta rows (a committed part), live; nothing held is read or copied."""
        self.delta.append(ids, vectors)
        self._add_rows(ids)

    def rows(self, rows: np.ndarray, batch: int = RECOMPUTE_BATCH) -> np.ndarray:
        """float32 vectors of the given rows, in that order: graph rows recomputed, ``batch`` per
        ``recompute`` call (bounds the texts held at once), delta rows read."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        in_gen = rows < self.n_gen
        gen_at = np.flatnonzero(in_gen)
        for s in range(0, len(gen_at), batch):
            at = gen_at[s: s + batch]
            out[at] = np.asarray(self._recompute_ids(self.gen_ids[rows[at]]), dtype=np.float32)
        if not in_gen.all():
            out[~in_gen] = self.delta.rows(rows[~in_gen] - self.n_gen)
        return out

    def live_vectors(self, batch: int = RECOMPUTE_BATCH) -> tuple[np.ndarray, np.ndarray]:
        """(chunk ids, exact float32 vectors) of the live rows, sorted by chunk id, in memory.
        Graph rows store no vectors, so they are recomputed here, ``batch`` rows per call (for an
        index: every live chunk of the generation re-embedded once)."""
        rows = np.flatnonzero(self.live)
        rows = rows[np.argsort(self.ids[rows], kind="stable")]
        return self.ids[rows], self.rows(rows, batch)

    @property
    def delta_share(self) -> float:
        """Delta rows over graph rows (inf with no graph row): what the automatic compaction
        policy of `add` compares with its threshold. Delta rows cost ~20x the bytes of graph rows."""
        return (len(self) - self.n_gen) / self.n_gen if self.n_gen else float("inf")

    def wants_compaction(self, share: float) -> bool:
        """True once the delta rows reach ``share`` of the graph rows (`delta_share`)."""
        return self.delta_share >= share

    def generation_bytes(self, folder: Path) -> dict[str, float] | None:
        """`slim_bytes` of the generation folder."""
        return slim_bytes(folder)

    def updated(self, config: SlimConfig, update: UpdateConfig | None = None, rebuild: bool = False) -> SlimUpdate:
        """The next generation without re-embedding the corpus: live graph rows kept, live delta
        rows inserted, tombstoned rows removed (`update_slim`; a full rebuild when ``rebuild`` or
        its drift rule asks). Only the few graph rows the update recomputes are re-embedded.
        Writing the generation and switching the manifest is the caller's."""
        d_rows = np.flatnonzero(self.live[self.n_gen:])
        d_rows = d_rows[np.argsort(self.delta.ids[d_rows], kind="stable")]
        d_ids, d_vecs = self.delta.ids[d_rows], self.delta.rows(d_rows)
        return update_slim(self.searcher.art, self.gen_ids, self.live[: self.n_gen], d_ids, d_vecs,
                           lambda rows: self._recompute_ids(self.gen_ids[rows]), config, update, rebuild)

    def update_into(self, root: Path, gen: int, manifest: Manifest) -> None:
        """`VectorStore.update_into`: the `updated` generation, with the manifest's slim knobs,
        written as generation ``gen``."""
        upd = self.updated(manifest.slim)
        log.info("%s: slim generation updated: %s", root, upd.stats)
        layout.write_generation(root, gen, {"ids": layout.narrow_ids(upd.ids)}, writer=upd.artifacts.save)

    def search(self, queries: np.ndarray, k: int, allow: np.ndarray | None = None,
               config: SearchConfig | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k chunk ids and exact scores per query, best first (ties by chunk id). ``config``:
        the graph walk's query knobs (ef, rerank, wave, early_stop), default `SearchConfig()`."""
        q = np.atleast_2d(np.asarray(queries, dtype=np.float32))
        mask = self.live if allow is None else (self.live & allow)
        gen_ok = mask[: self.n_gen]
        d_ids, d_scores = self.delta.search(q, k, mask[self.n_gen:])
        results: list[list[tuple[float, int]]] = []
        if self.n_gen and gen_ok.any():
            if allow is not None and gen_ok.sum() <= SMALL_FILTER:
                rows = np.flatnonzero(gen_ok)
                exact = q @ self._recompute_ids(self.gen_ids[rows]).T
                results = [[(float(s), int(self.gen_ids[r])) for r, s in zip(rows, exact[i], strict=True)]
                           for i in range(len(q))]
            else:
                found = self.searcher.search_batch(q, k, ~gen_ok, config)
                results = [[(float(s), int(self.gen_ids[r])) for r, s in zip(res.rows, res.scores, strict=True)]
                           for res in found]
        else:
            results = [[] for _ in range(len(q))]
        out_ids, out_scores = [], []
        for i in range(len(q)):
            merged = results[i] + [(float(s), int(c)) for c, s in zip(d_ids[i], d_scores[i], strict=True)]
            merged.sort(key=lambda t: (-t[0], t[1]))
            merged = merged[:k]
            out_ids.append([c for _, c in merged])
            out_scores.append([s for s, _ in merged])
        width = max((len(r) for r in out_ids), default=0)
        if any(len(r) != width for r in out_ids):  # ragged only when some query has fewer live rows
            width = min(len(r) for r in out_ids)
            out_ids = [r[:width] for r in out_ids]
            out_scores = [r[:width] for r in out_scores]
        return (np.array(out_ids, dtype=np.int64).reshape(len(q), width),
                np.array(out_scores, dtype=np.float32).reshape(len(q), width))
