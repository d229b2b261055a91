"""The slim build at scale, on small inputs: HNSW candidate pools over k-means partitions, read from
a memory-mapped matrix, and the same partitions as Ray tasks; each against brute force.

Partitions are forced small (``partition_rows=1000``, ``exact_below=0``) so a 4,000-row set takes
the code path of a million-row build: 8 partitions, each row in its 2 nearest.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench import vectors as bench_vectors
from slimrag.config import SearchConfig
from slimrag.index.store.slim import SlimConfig, SlimSearcher, build_slim
from slimrag.index.store.slim.build import calibrate_pq_error
from slimrag.index.store.slim.graph import GraphConfig, _csr_of, _make_strongly_connected, _reached_from
from slimrag.index.store.slim.pool import candidate_pool, partitions

N, NQ, K = 4000, 100, 10
PARTS = GraphConfig(pool="hnsw", exact_below=0, partition_rows=1000, overlap=2)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    x, q = bench_vectors.text_like(N, NQ, 384, 3, clusters=64)
    path = tmp_path_factory.mktemp("mm") / "x.npy"
    np.save(path, x)
    truth = np.argsort(-(q @ x.T), axis=1, kind="stable")[:, :K]
    return np.load(path, mmap_mode="r"), x, q, truth


def recall_of(art, x, q, truth, search=None) -> float:
    res = SlimSearcher(art, lambda rows: x[rows], SlimConfig(cache_bytes=0), search).search_batch(q, K)
    return float(np.mean([len(set(r.rows.tolist()) & set(t.tolist())) / K for r, t in zip(res, truth, strict=True)]))


def test_partitions_cover_every_row_twice(data):
    mm = data[0]
    parts = partitions(mm, PARTS)
    assert len(parts) == 8
    counts = np.bincount(np.concatenate(parts), minlength=N)
    assert np.all(counts == 2)  # each row in its 2 nearest centroids' partitions
    assert all(np.all(np.diff(p) > 0) for p in parts)


def test_hnsw_pool_is_close_to_exact_knn(data):
    mm, x, _, _ = data
    pool = candidate_pool(mm, PARTS)
    exact = np.argsort(-(x @ x.T), axis=1)[:, 1:11]  # the 10 true nearest other rows
    sample = range(0, N, 7)
    first = np.mean([exact[i, 0] in set(pool[i].tolist()) for i in sample])
    hit = np.mean([len(set(exact[i].tolist()) & set(pool[i].tolist())) / 10 for i in sample])
    # Level-0 lists are pruned for diversity by HNSW's heuristic: the nearest row is always a
    # candidate (no kept edge can cover it), farther near-duplicates often are not.
    assert first >= 0.95, first
    assert hit >= 0.4, hit
    assert pool.dtype == np.int32 and pool.min() >= -1 and pool.max() < N
    assert not np.any(pool == np.arange(N)[:, None])  # no row is its own candidate


def test_partition_order_and_bounded_reads_change_no_edge(data, monkeypatch):
    """The prune and the merge visit nodes by partition pair and read a mapped matrix through
    row sets with a bounded mapped budget; every node's edges are exactly those of the plain
    row-order pass over the matrix in memory."""
    from slimrag.index.store.slim import rows
    from slimrag.index.store.slim.prune import forward_prune, merge_reverse, partition_order

    mm, x, _, _ = data
    parts = partitions(mm, PARTS)
    pool = candidate_pool(mm, PARTS, parts=parts)
    order = partition_order(parts, N)
    assert sorted(order.tolist()) == list(range(N)) and not np.array_equal(order, np.arange(N))
    limits = np.where(np.arange(N) % 20 == 0, PARTS.max_degree, PARTS.base_degree)
    plain = forward_prune(x, pool, limits, PARTS)
    monkeypatch.setattr(rows, "RELEASE_BYTES", 512 * 1024)  # 6 MB of vectors: a bounded reader
    monkeypatch.setattr("slimrag.index.store.slim.prune._SET_NODES", 700)
    assert rows.RowReader(mm).bounded
    ordered = forward_prune(mm, pool, limits, PARTS, order)
    assert np.array_equal(plain[3], ordered[3])  # the closest candidates kept for repairs

    def by_node(edges):  # grouped by node in row order, each node's edges in their order
        by = np.argsort(edges[0], kind="stable")
        return [e[by] for e in edges]

    def same(a, b):  # edges exactly; their float32 distances to the last bits a product's shape moves
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a, b) if a.dtype.kind in "iu" else np.allclose(a, b, rtol=1e-6, atol=1e-6)

    for a, b in zip(plain[:3], by_node(ordered[:3]), strict=True):
        same(a, b)
    merged = merge_reverse(x, *plain[:3], limits, PARTS)
    monkeypatch.setattr("slimrag.index.store.slim.prune._MERGE_BLOCK", 1500)
    for a, b in zip(merged, by_node(merge_reverse(mm, *ordered[:3], limits, PARTS, order)), strict=True):
        same(a, b)


def test_partitioned_build_from_memmap_matches_brute_force(data):
    mm, x, q, truth = data
    stats: dict = {}
    art = build_slim(mm, SlimConfig(graph=PARTS), stats=stats)
    assert stats["pool"] == "hnsw" and len(stats["partitions"]) == 8
    assert recall_of(art, x, q, truth) >= 0.95
    exact_pool = build_slim(x, SlimConfig(graph=GraphConfig(pool="exact")))
    assert recall_of(art, x, q, truth, SearchConfig(recall=0)) >= recall_of(exact_pool, x, q, truth, SearchConfig(recall=0)) - 0.02
    # Strongly connected: every row reached from row 0 and on the reversed graph.
    g = art.graph
    src = np.repeat(np.arange(N), g.degrees())
    dst = np.asarray(g.indices, dtype=np.int64)
    for a, b in ((src, dst), (dst, src)):
        seen = np.zeros(N, dtype=bool)
        _reached_from(*_csr_of(N, a, b), np.array([0]), seen)
        assert seen.all()


def _reachable(n: int, src, dst, root: int) -> set[int]:
    """Plain breadth-first search: the reference."""
    out: dict[int, list[int]] = {}
    for a, b in zip(src.tolist(), dst.tolist(), strict=True):
        out.setdefault(a, []).append(b)
    seen, todo = {root}, [root]
    while todo:
        for b in out.get(todo.pop(), []):
            if b not in seen:
                seen.add(b)
                todo.append(b)
    return seen


def test_connectivity_repair_reaches_every_node_both_ways(monkeypatch):
    """Islands, one-way chains and isolated nodes all end up reachable from the root and able to
    reach it, with the frontier expanded a few nodes at a time."""
    monkeypatch.setattr("slimrag.index.store.slim.graph._BFS_NODES", 7)
    rng = np.random.default_rng(11)
    n = 600
    src = rng.integers(0, 200, 900)  # edges only among the first 200 nodes, plus a one-way chain
    dst = rng.integers(0, 200, 900)
    src = np.concatenate([src, np.arange(300, 399)]).astype(np.int32)
    dst = np.concatenate([dst, np.arange(301, 400)]).astype(np.int32)
    knn = rng.integers(-1, n, (n, 4)).astype(np.int32)
    seen = np.zeros(n, dtype=bool)
    _reached_from(*_csr_of(n, src, dst), np.array([0]), seen)
    assert set(np.flatnonzero(seen).tolist()) == _reachable(n, src, dst, 0)
    s2, d2 = _make_strongly_connected(n, src, dst, knn, 0)
    assert np.array_equal(s2[: len(src)], src) and np.array_equal(d2[: len(dst)], dst)  # edges only added
    assert _reachable(n, s2, d2, 0) == set(range(n)) == _reachable(n, d2, s2, 0)


def test_error_bound_from_graph_neighbourhoods_matches_exact_scan(data):
    """The PQ error quantile calibrated on two-hop graph neighbourhoods (no pass over n) is the one
    the exact blocked scan gives, within sampling noise."""
    mm, x, _, _ = data
    art = build_slim(x)
    by_graph = calibrate_pq_error(mm, art.pq, art.codes, 0.99, graph=art.graph)
    by_scan = calibrate_pq_error(mm, art.pq, art.codes, 0.99)
    assert abs(by_graph - by_scan) <= 0.15 * by_scan, (by_graph, by_scan)


def test_ray_partitions_match_the_local_build(data):
    """The same partitions as Ray tasks on a local Ray: recall@10 within 0.01 of the local build."""
    pytest.importorskip("ray")
    from slimrag.index.store.slim.ray_build import ray_partitions

    mm, x, q, truth = data
    local = build_slim(mm, SlimConfig(graph=PARTS))
    with ray_partitions(num_cpus=2) as runner:
        stats: dict = {}
        remote = build_slim(mm, SlimConfig(graph=PARTS), stats=stats)
        assert runner.max_in_flight == 2
    assert len(stats["partitions"]) == 8
    fixed = SearchConfig(recall=0)
    assert abs(recall_of(remote, x, q, truth, fixed) - recall_of(local, x, q, truth, fixed)) <= 0.01
    assert abs(remote.graph.n_edges - local.graph.n_edges) <= 0.02 * local.graph.n_edges


def test_cli_build_ray_needs_slim_storage(tmp_path):
    """`slimrag build --ray` distributes the slim graph's partitions; with flat storage it is a
    usage error named before any work starts."""
    from click.testing import CliRunner

    from slimrag.cli import cli

    (tmp_path / "a.txt").write_text("one small file")
    res = CliRunner().invoke(cli, ["build", str(tmp_path / "a.txt"), "-o", str(tmp_path / "i"), "--storage", "flat",
                                   "--ray"])
    assert res.exit_code == 2 and "--storage slim" in res.output
    assert not (tmp_path / "i").exists()


def _rss_file_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:"))


def test_reader_gathers_exactly_and_releases_only_file_pages(tmp_path, monkeypatch):
    from slimrag.index.store.slim import rows

    x = np.random.default_rng(3).standard_normal((5000, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    mm = np.load(tmp_path / "x.npy", mmap_mode="r")
    ids = np.random.default_rng(4).integers(0, 5000, (70, 9))
    for budget in (rows.RELEASE_BYTES, 64 * 1024):  # the file fits the budget whole; it does not
        monkeypatch.setattr(rows, "RELEASE_BYTES", budget)
        for src in (x, mm, mm[7:4007]):
            r = rows.RowReader(src)
            assert r.mapped == (src is not x) and r.bounded == (src is not x and budget < src.nbytes)
            want_x = np.asarray(src)
            for want in (ids % len(src), np.sort(ids.reshape(-1) % len(src)), ids[0] % len(src), ids[:0]):
                assert np.array_equal(r.take(want), want_x[want])  # unsorted 2-D, sorted, 1-D, empty
            assert np.array_equal(r.block(100, 300), want_x[100:300])
            assert np.array_equal(np.concatenate([b for _, b in r.blocks(999)]), want_x)
    anon = x.copy()
    rows.release(anon)  # anonymous memory: never dropped
    rows.release_file_pages()
    assert np.array_equal(anon, x) and np.array_equal(np.asarray(mm), x)  # a released mapping reads back the file
    assert not rows.is_file_mapped(anon) and rows.is_file_mapped(mm[10:20])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="RssFile is read from /proc (Linux)")
def test_gathers_keep_mapped_pages_bounded(tmp_path, monkeypatch):
    """A gather spread over the file, sorted (a k-means sample, a partition's rows) or not (the
    prune's candidates), maps only about RELEASE_BYTES at a time, not the file."""
    from slimrag.index.store.slim import rows

    n, d = 40_000, 384  # 61 MB
    np.save(tmp_path / "x.npy", np.ones((n, d), np.float32))
    mm = np.load(tmp_path / "x.npy", mmap_mode="r")
    spread = np.random.default_rng(5).choice(n, 8000, replace=False)
    rows.release_file_pages()
    before = _rss_file_kib()
    np.asarray(mm[np.sort(spread)]).sum()  # a plain gather maps (nearly) the whole file
    plain = _rss_file_kib() - before
    monkeypatch.setattr(rows, "RELEASE_BYTES", 4 * 2**20)
    for sample in (np.sort(spread), spread, spread.reshape(80, 100)):
        rows.release_file_pages()
        before = _rss_file_kib()
        got = rows.RowReader(mm).take(sample)
        bounded = _rss_file_kib() - before
        assert got.shape == (*sample.shape, d) and float(got.sum()) == 8000 * d
        # at most RELEASE_BYTES + one chunk (a quarter of it) + a folio of slack: ~7 MB
        assert bounded < 8 * 1024 < plain, (bounded, plain)
