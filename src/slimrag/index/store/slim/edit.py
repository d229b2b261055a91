"""Graph edits of an incremental slim update: insert rows, consolidate deletes, renumber, repair.

The algorithm (steps 2-5) and its knobs are described in `slimrag.index.store.slim.update`, which
decides between these edits and a full rebuild. Rows whose exact vector is unknown take part
through their unit-norm PQ reconstruction (`RowVectors`).

Thread-safety: pure functions of their inputs (a fresh searcher per call).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from slimrag.index.store.slim._threads import single_thread_blas
from slimrag.index.store.slim.artifacts import SlimArtifacts
from slimrag.index.store.slim.config import SlimConfig
from slimrag.index.store.slim.graph import Graph, _make_strongly_connected, _to_csr
from slimrag.index.store.slim.prune import robust_prune
from slimrag.index.store.slim.searcher import RecomputeRows, SlimSearcher

_PRUNE_BATCH = 256


class RowVectors:
    """Vectors of the combined rows (old ``0..n_old-1``, then new): exact where known (new rows,
    recomputed rows, hubs), else the unit-norm PQ reconstruction."""

    def __init__(self, art: SlimArtifacts, x_new: np.ndarray, new_codes: np.ndarray) -> None:
        self.n_old = art.n
        self.pq = art.pq
        self.codes = np.concatenate([np.asarray(art.codes), new_codes])
        self.x_new = x_new
        self.slot = np.full(art.n, -1, dtype=np.int64)
        self.exact = np.zeros((0, art.dim), np.float32)
        self.learn(art.hub_rows, np.asarray(art.hub_vectors, dtype=np.float32))

    def learn(self, rows: np.ndarray, vecs: np.ndarray) -> None:
        """Record exact vectors of old rows."""
        fresh = self.slot[rows] < 0
        rows, vecs = rows[fresh], vecs[fresh]
        self.slot[rows] = len(self.exact) + np.arange(len(rows))
        self.exact = np.concatenate([self.exact, vecs])

    def known(self, rows: np.ndarray) -> np.ndarray:
        """Which rows have an exact vector here."""
        return (rows >= self.n_old) | (self.slot[np.minimum(rows, self.n_old - 1)] >= 0)

    def get(self, rows: np.ndarray) -> np.ndarray:
        """Vectors (len(rows), d) float32 of combined rows: exact where known, else PQ directions."""
        rows = np.asarray(rows, dtype=np.int64)
        out = self.pq.directions(self.codes[rows])
        new = rows >= self.n_old
        out[new] = self.x_new[rows[new] - self.n_old]
        old = np.flatnonzero(~new)
        slots = self.slot[rows[old]]
        out[old[slots >= 0]] = self.exact[slots[slots >= 0]]
        return out


def _limits(graph: Graph, n_new: int, config: SlimConfig) -> np.ndarray:
    """Out-degree caps: the build's hub-degree rule on the current graph's in-degrees."""
    n = graph.n + n_new
    indeg = np.concatenate([graph.in_degrees(), np.zeros(n_new, np.int64)])
    limits = np.full(n, config.graph.base_degree, dtype=np.int64)
    hubs = int(round(config.graph.hub_fraction * n))
    if hubs:
        limits[np.argsort(-indeg, kind="stable")[:hubs]] = config.graph.max_degree
    return limits


def _prune(vecs: RowVectors, owners: np.ndarray, cands: list[np.ndarray], limits: np.ndarray,
           config: SlimConfig) -> list[np.ndarray]:
    """Robust prune of each owner over its candidate list (the build's rule): candidates sorted
    closest first (capped at ``GraphConfig.candidates``), then `robust_prune`. Returns kept ids."""
    out: list[np.ndarray] = []
    width_cap = config.graph.candidates
    for s in range(0, len(owners), _PRUNE_BATCH):
        own = owners[s:s + _PRUNE_BATCH]
        lists = [np.unique(c[c != o]) for o, c in zip(own.tolist(), cands[s:s + _PRUNE_BATCH], strict=True)]
        union = np.unique(np.concatenate([own, *lists]))
        local = vecs.get(union)
        pos = {r: i for i, r in enumerate(union.tolist())}
        width = max(1, min(width_cap, max(len(c) for c in lists)))
        cand = np.full((len(own), width), -1, dtype=np.int64)
        sims = np.full((len(own), width), -np.inf, dtype=np.float32)
        for i, (o, c) in enumerate(zip(own.tolist(), lists, strict=True)):
            if not len(c):
                continue
            li = np.array([pos[r] for r in c.tolist()], dtype=np.int64)
            sc = local[li] @ local[pos[o]]
            order = np.argsort(-sc, kind="stable")[:width]
            cand[i, : len(order)], sims[i, : len(order)] = li[order], sc[order]
        with single_thread_blas():
            kept = robust_prune(local, cand, sims, limits[own], config.graph.alpha)
        out.extend(union[cand[i][kept[i]]] for i in range(len(own)))
    return out


def edit_graph(art: SlimArtifacts, live: np.ndarray, x_new: np.ndarray, new_codes: np.ndarray, rec: RecomputeRows,
               config: SlimConfig, ef: int, rerank: int) -> SlimArtifacts:
    """The next generation of ``art`` with rows where ``live`` is False removed and ``x_new``
    (encoded as ``new_codes``) appended, by editing the graph (steps 2-5 of
    `slimrag.index.store.slim.update`). ``rec`` recomputes old rows (candidates and hubs only)."""
    n_old, m = art.n, len(x_new)
    n = n_old + m
    indptr = np.asarray(art.graph.indptr, dtype=np.int64)
    indices = np.asarray(art.graph.indices, dtype=np.int64)
    adj: list[np.ndarray] = [indices[indptr[i]:indptr[i + 1]] for i in range(n_old)]
    vecs = RowVectors(art, x_new, new_codes)
    limits = _limits(art.graph, m, config)
    dead = np.concatenate([~live, np.zeros(m, dtype=bool)])

    if m:
        _insert(art, adj, vecs, limits, dead, x_new, rec, config, ef, rerank)
    _consolidate_deletes(adj, vecs, limits, dead, config)

    # Renumber: survivors in old order, then new rows.
    keep = np.flatnonzero(~dead)
    new_pos = np.full(n, -1, dtype=np.int64)
    new_pos[keep] = np.arange(len(keep))
    lists = [new_pos[adj[r]] for r in keep.tolist()]
    n2 = len(keep)
    deg = np.array([len(a) for a in lists], dtype=np.int64)
    src = np.repeat(np.arange(n2, dtype=np.int64), deg)
    dst = np.concatenate(lists) if n2 else np.zeros(0, np.int64)
    assert (dst >= 0).all(), "an edge to a deleted row survived consolidation"
    width = max(1, int(deg.max(initial=0)))
    near = np.tile(np.arange(n2, dtype=np.int64)[:, None], (1, width))  # padding: the row itself
    near[src, np.arange(len(src)) - np.repeat(np.cumsum(deg) - deg, deg)] = dst
    root = int(np.argmax(np.bincount(dst, minlength=n2))) if len(dst) else 0
    src, dst = _make_strongly_connected(n2, src, dst, near, root)
    graph = _to_csr(n2, src, dst)

    codes = np.concatenate([np.asarray(art.codes)[~dead[:n_old]], new_codes])
    hub_rows, hub_vectors = _hubs(art, graph, new_pos, keep, vecs, rec, config)
    entry_rows = _entries(art, new_pos, n2, config)
    return replace(art, graph=graph, codes=codes, hub_rows=hub_rows, hub_vectors=hub_vectors, entry_rows=entry_rows)


def _insert(art: SlimArtifacts, adj: list[np.ndarray], vecs: RowVectors, limits: np.ndarray, dead: np.ndarray,
            x_new: np.ndarray, rec: RecomputeRows, config: SlimConfig, ef: int, rerank: int) -> None:
    """Steps 2 and 3: new rows' out-edges from a walk of the old graph and the other new rows,
    then reverse edges; ``adj`` is extended and edited in place."""
    n_old, m = art.n, len(x_new)
    width = config.graph.candidates
    searcher = SlimSearcher(art, rec, replace(config, cache_bytes=0))
    pools, _ = searcher.walk(x_new, max(ef, rerank), dead[:n_old])
    want = np.unique(np.concatenate([rows[:rerank] for rows, _ in pools] + [np.zeros(0, np.int64)]))
    want = want[~vecs.known(want)]
    if len(want):
        vecs.learn(want, rec(want))
    # Nearest other new rows, exact (m x m in blocks of 1024 rows).
    k_new = min(width, m - 1)
    near_new = np.zeros((m, max(k_new, 0)), dtype=np.int64)
    if k_new > 0:
        for s in range(0, m, 1024):
            sims = x_new[s:s + 1024] @ x_new.T
            sims[np.arange(len(sims)), np.arange(s, s + len(sims))] = -np.inf
            near_new[s:s + 1024] = np.argpartition(-sims, k_new - 1, axis=1)[:, :k_new]
    owners = np.arange(n_old, n_old + m, dtype=np.int64)
    cands = [np.concatenate([pools[i][0][:width], n_old + near_new[i]]) for i in range(m)]
    adj.extend(_prune(vecs, owners, cands, limits, config))
    # Reverse edges: every p -> c proposes c -> p; nodes over their limit are pruned again.
    incoming: dict[int, list[int]] = {}
    for p in owners.tolist():
        for c in adj[p].tolist():
            incoming.setdefault(c, []).append(p)
    over, merged = [], []
    for c, ps in incoming.items():
        extra = np.setdiff1d(np.asarray(ps, dtype=np.int64), adj[c])
        both = np.concatenate([adj[c], extra])
        if len(both) > limits[c]:
            over.append(c)
            merged.append(both)
        else:
            adj[c] = both
    if over:
        for c, kept in zip(over, _prune(vecs, np.asarray(over, dtype=np.int64), merged, limits, config), strict=True):
            adj[c] = kept


def _consolidate_deletes(adj: list[np.ndarray], vecs: RowVectors, limits: np.ndarray, dead: np.ndarray,
                         config: SlimConfig) -> None:
    """Step 4 (FreshDiskANN's delete consolidation), in place on ``adj``."""
    if not dead.any():
        return
    owners, cands = [], []
    for p in np.flatnonzero(~dead).tolist():
        nb = adj[p]
        gone = dead[nb]
        if not gone.any():
            continue
        pool = np.concatenate([nb[~gone], *[adj[d] for d in nb[gone].tolist()]])
        pool = np.unique(pool[~dead[pool] & (pool != p)])
        if len(pool) <= limits[p]:
            adj[p] = pool
        else:
            owners.append(p)
            cands.append(pool)
    if owners:
        for p, kept in zip(owners, _prune(vecs, np.asarray(owners, dtype=np.int64), cands, limits, config),
                           strict=True):
            adj[p] = kept


def _hubs(art: SlimArtifacts, graph: Graph, new_pos: np.ndarray, keep: np.ndarray, vecs: RowVectors,
          rec: RecomputeRows, config: SlimConfig) -> tuple[np.ndarray, np.ndarray]:
    """Surviving hubs keep their vectors; free slots go to the most-referenced other rows."""
    want = config.hub_count(graph.n)
    alive = new_pos[art.hub_rows]
    hubs = alive[alive >= 0]
    indeg = graph.in_degrees()
    if len(hubs) > want:
        hubs = hubs[np.argsort(-indeg[hubs], kind="stable")[:want]]
    elif len(hubs) < want:
        taken = np.zeros(graph.n, dtype=bool)
        taken[hubs] = True
        order = np.argsort(-indeg, kind="stable")
        hubs = np.concatenate([hubs, order[~taken[order]][: want - len(hubs)]])
    hubs = np.sort(hubs).astype(np.int64)
    combined = keep[hubs]  # row ids before renumbering
    need = combined[~vecs.known(combined)]
    if len(need):
        vecs.learn(need, rec(need))
    return hubs, vecs.get(combined).astype(np.float16)


def _entries(art: SlimArtifacts, new_pos: np.ndarray, n: int, config: SlimConfig) -> np.ndarray:
    """Surviving entry rows, topped up (or thinned) to `SlimConfig.entry_count` by a seeded sample."""
    want = config.entry_count(n)
    alive = new_pos[art.entry_rows]
    rows = alive[alive >= 0]
    rng = np.random.default_rng(config.graph.seed + n)
    if len(rows) > want:
        rows = rng.choice(rows, want, replace=False)
    elif len(rows) < want:
        free = np.setdiff1d(np.arange(n, dtype=np.int64), rows)
        rows = np.concatenate([rows, rng.choice(free, want - len(rows), replace=False)])
    return np.sort(rows).astype(np.int64)
