"""Incremental slim updates (`slimrag.index.store.slim.update`) against a fresh build of the same rows.

Data: the benchmarks' seeded text-like vectors; ``recompute`` returns the true rows and records
every call, so the tests see exactly which old rows an update re-embeds.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from bench import vectors as bench_vectors
from slimrag.index.store.slim import SlimArtifacts, SlimConfig, SlimSearcher, build_slim
from slimrag.index.store.slim.update import UpdateConfig, update_slim

N, ADD, D, NQ, K = 2000, 100, 384, 100, 10
CONFIG = SlimConfig()


class Recorder:
    """recompute backed by a matrix; records the rows asked for."""

    def __init__(self, x: np.ndarray) -> None:
        self.x = x
        self.rows: list[int] = []

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        self.rows += np.asarray(rows).tolist()
        return self.x[rows]


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    x, q = bench_vectors.text_like(N + ADD, NQ, D, seed=0, clusters=48)
    return x, q


@pytest.fixture(scope="module")
def base(data) -> SlimArtifacts:
    return build_slim(data[0][:N], CONFIG)


@pytest.fixture(scope="module")
def churned(data, base):
    """5% of the rows removed, 5% added; gen ids are 10x the row (any ids work)."""
    x = data[0]
    live = np.ones(N, dtype=bool)
    live[np.random.default_rng(7).choice(N, ADD, replace=False)] = False
    rec = Recorder(x[:N])
    up = update_slim(base, np.arange(N) * 10, live, np.arange(N, N + ADD) * 10, x[N:], rec, CONFIG)
    return up, live, rec


def recall(art: SlimArtifacts, x: np.ndarray, q: np.ndarray) -> float:
    res = SlimSearcher(art, lambda rows: x[rows], dataclasses.replace(CONFIG, cache_bytes=0)).search_batch(q, K)
    truth = np.argsort(-(q @ x.T), axis=1, kind="stable")[:, :K]
    return float(np.mean([len(set(r.rows.tolist()) & set(t.tolist())) / K for r, t in zip(res, truth, strict=True)]))


def live_matrix(x: np.ndarray, live: np.ndarray) -> np.ndarray:
    return np.concatenate([x[:N][live], x[N:]])


def test_recall_matches_a_fresh_build_of_the_same_rows(data, churned):
    x, q = data
    up, live, _ = churned
    xs = live_matrix(x, live)
    fresh = recall(build_slim(xs, CONFIG), xs, q)
    assert not up.stats.rebuilt, up.stats.reason
    assert recall(up.artifacts, xs, q) >= fresh - 0.01


def test_ids_map_rows_and_no_edge_reaches_a_deleted_row(data, churned):
    x, _ = data
    up, live, _ = churned
    art = up.artifacts
    assert up.ids.tolist() == (np.arange(N)[live] * 10).tolist() + (np.arange(N, N + ADD) * 10).tolist()
    assert art.n == len(up.ids) == len(art.codes) == N
    assert int(np.asarray(art.graph.indices).max()) < art.n  # every edge lands on a kept row
    # Each new row, searched by its own vector, comes back first under its own id: rows, codes and
    # ids line up, and the new rows are reachable.
    xs = live_matrix(x, live)
    res = SlimSearcher(art, lambda rows: xs[rows], CONFIG).search_batch(x[N:], 1)
    assert [int(up.ids[r.rows[0]]) for r in res] == (np.arange(N, N + ADD) * 10).tolist()
    # Hub vectors are the rows' vectors; entry rows are valid, distinct rows.
    np.testing.assert_allclose(art.hub_vectors.astype(np.float32), xs[art.hub_rows], atol=2e-3)
    assert len(np.unique(art.entry_rows)) == len(art.entry_rows) == CONFIG.entry_count(art.n)


def test_degree_bounds_and_strong_connectivity(churned):
    art = churned[0].artifacts
    deg = art.graph.degrees()
    # The connectivity pass may add an edge or two over a node's cap, as in a build.
    assert deg.max() <= CONFIG.graph.max_degree + 2
    assert np.mean(deg > CONFIG.graph.base_degree + 2) <= CONFIG.graph.hub_fraction + 0.01
    indptr, indices = np.asarray(art.graph.indptr, np.int64), np.asarray(art.graph.indices, np.int64)
    src = np.repeat(np.arange(art.n), np.diff(indptr))
    for a, b in ((src, indices), (indices, src)):  # forward, then the reversed graph
        seen = np.zeros(art.n, dtype=bool)
        seen[0] = True
        frontier = np.array([0])
        while len(frontier):
            nxt = np.unique(b[np.isin(a, frontier)])
            frontier = nxt[~seen[nxt]]
            seen[frontier] = True
        assert seen.all()


def test_recomputes_only_live_candidates_within_budget(data, base):
    x = data[0]
    live = np.ones(N, dtype=bool)
    live[:50] = False
    upd = UpdateConfig(ef=32, rerank=4)
    rec = Recorder(x[:N])
    up = update_slim(base, np.arange(N), live, np.arange(N, N + ADD), x[N:], rec, CONFIG, upd)
    hubs = CONFIG.hub_count(up.artifacts.n)
    assert len(rec.rows) == len(set(rec.rows)) == up.stats.recomputed
    assert up.stats.recomputed <= upd.rerank * ADD + hubs
    assert live[rec.rows].all()  # a deleted row is never re-embedded
    # The default recomputes no candidate: only hub slots left free by deleted hubs, if any.
    rec0 = Recorder(x[:N])
    update_slim(base, np.arange(N), live, np.arange(N, N + ADD), x[N:], rec0, CONFIG)
    assert len(rec0.rows) <= hubs


def test_drifted_rows_trigger_a_full_rebuild(data, base):
    x = data[0]
    other, _ = bench_vectors.text_like(ADD * 3, 1, D, seed=99, clusters=8)
    rec = Recorder(x[:N])
    live = np.ones(N, dtype=bool)
    up = update_slim(base, np.arange(N), live, np.arange(N, N + len(other)), other, rec, CONFIG)
    assert up.stats.rebuilt and "drift" in up.stats.reason and up.stats.drift > UpdateConfig().drift_threshold
    assert sorted(rec.rows) == list(range(N))  # every old row recomputed once
    same = update_slim(base, np.arange(N), live, np.arange(N, N + ADD), x[N:], Recorder(x[:N]), CONFIG)
    assert not same.stats.rebuilt and same.stats.drift < 1.2


def test_rebuild_on_request_equals_a_fresh_build_in_chunk_id_order(data, base):
    x = data[0]
    live = np.ones(N, dtype=bool)
    live[::3] = False
    ids = np.arange(N) * 2 + 1  # new ids interleave with old ones: the rebuild sorts by id
    new_ids = np.arange(ADD) * 2
    up = update_slim(base, ids, live, new_ids, x[N:], Recorder(x[:N]), CONFIG, rebuild=True)
    assert up.stats.rebuilt and up.stats.reason == "asked"
    order = np.argsort(np.concatenate([ids[live], new_ids]), kind="stable")
    want = build_slim(np.concatenate([x[:N][live], x[N:]])[order], CONFIG)
    assert up.ids.tolist() == sorted(up.ids.tolist())
    np.testing.assert_array_equal(np.asarray(up.artifacts.graph.indices), np.asarray(want.graph.indices))
    np.testing.assert_array_equal(np.asarray(up.artifacts.codes), np.asarray(want.codes))


def test_five_rounds_saved_and_reloaded_keep_recall(tmp_path, data, base):
    x, q = data
    rng = np.random.default_rng(11)
    vec = {i: x[i] for i in range(N)}  # chunk id -> vector
    art, ids, nxt = base, np.arange(N), N
    for r in range(5):
        live = np.ones(len(ids), dtype=bool)
        live[rng.choice(len(ids), 20, replace=False)] = False
        new_ids = np.arange(nxt, nxt + 20)
        nxt += 20
        cur = ids
        up = update_slim(art, cur, live, new_ids, x[new_ids], lambda rows, cur=cur: np.stack([vec[int(i)] for i in cur[rows]]),
                         CONFIG)
        vec.update({int(i): x[i] for i in new_ids})
        up.artifacts.save(tmp_path / f"g{r}")
        art, ids = SlimArtifacts.load(tmp_path / f"g{r}"), up.ids
    assert art.pq_mse == base.pq_mse and art.pq_error == base.pq_error  # the build's, kept
    xs = np.stack([vec[int(i)] for i in ids])
    assert recall(art, xs, q) >= recall(build_slim(xs, CONFIG), xs, q) - 0.01


def test_legacy_generation_measures_its_drift_baseline(data, base):
    x = data[0]
    legacy = dataclasses.replace(base, pq_mse=None)
    rec = Recorder(x[:N])
    up = update_slim(legacy, np.arange(N), np.ones(N, bool), np.arange(N, N + ADD), x[N:], rec, CONFIG,
                     UpdateConfig(drift_sample=32))
    assert len(rec.rows) == 32 and not up.stats.rebuilt and 0.8 < up.stats.drift < 1.2


def test_duplicate_ids_are_kept_once_and_bad_input_is_refused(data, base):
    x = data[0]
    live = np.ones(N, dtype=bool)
    up = update_slim(base, np.arange(N), live, np.array([5, N]), x[[5, N]], Recorder(x[:N]), CONFIG)
    assert up.ids.tolist() == [*range(N), N]
    with pytest.raises(ValueError, match="new_vectors"):
        update_slim(base, np.arange(N), live, np.arange(3), x[:2], Recorder(x[:N]), CONFIG)
    with pytest.raises(ValueError, match="one entry per row"):
        update_slim(base, np.arange(N - 1), live, np.arange(0), x[:0], Recorder(x[:N]), CONFIG)
    with pytest.raises(ValueError, match="rerank"):
        UpdateConfig(ef=8, rerank=16)


def test_slim_vectors_update_keeps_live_rows_and_reembeds_only_what_it_needs(data, base):
    """The store's entry point for `compact`: generation + delta + tombstones in, chunk ids out."""
    from slimrag.index.store.flat import FlatVectors
    from slimrag.index.store.slim.store import SlimVectors

    x = data[0]
    gen_ids = np.arange(N) + 1000
    by_id = {int(i): x[r] for r, i in enumerate(gen_ids)}
    asked: list[int] = []

    def recompute_ids(ids: np.ndarray) -> np.ndarray:
        asked.extend(np.asarray(ids).tolist())
        return np.stack([by_id[int(i)] for i in ids])

    delta_ids = np.arange(N + 1000, N + 1000 + ADD)
    store = SlimVectors(gen_ids, base, FlatVectors(delta_ids, x[N:]), recompute_ids, CONFIG)
    assert store.delta_share == ADD / N
    dead = {1000, 1001, int(delta_ids[0])}
    store.set_live(np.array([i for i in store.ids.tolist() if i not in dead]))
    up = store.updated(CONFIG)
    assert not up.stats.rebuilt and up.stats.removed == 2 and up.stats.added == ADD - 1
    assert up.ids.tolist() == [i for i in store.ids.tolist() if i not in dead]
    assert len(asked) <= CONFIG.hub_count(N) and not dead & set(asked)


def test_tiny_generations_update_into_valid_graphs():
    """1-11 rows, ~40% removed, 0-11 added: every result is a valid graph in which each row, searched
    by its own vector, is found first; nothing left at all is refused with a clear error."""
    from slimrag.index.store.slim.pq import PQConfig

    x, _ = bench_vectors.text_like(64, 1, 64, seed=1)
    cfg = SlimConfig(pq=PQConfig(m=16))
    rng = np.random.default_rng(0)
    for _ in range(60):
        n, m = int(rng.integers(1, 12)), int(rng.integers(0, 12))
        art = build_slim(x[:n], cfg)
        live = rng.random(n) < 0.6
        new = np.arange(32, 32 + m)
        if live.sum() + m == 0:
            with pytest.raises(ValueError, match="no live row"):
                update_slim(art, np.arange(n), live, new, x[new], lambda r: x[r], cfg)
            continue
        up = update_slim(art, np.arange(n), live, new, x[new], lambda r: x[r], cfg)
        xs = x[up.ids]
        assert up.artifacts.n == len(up.ids) == len(up.artifacts.codes)
        res = SlimSearcher(up.artifacts, lambda r, xs=xs: xs[r], cfg).search_batch(xs, 1)
        assert [int(r.rows[0]) for r in res] == list(range(len(up.ids)))
