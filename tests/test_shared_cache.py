"""One cache of recomputed rows per slim generation per process (issue 32): the handles that the
server's worker threads open share it, and a handle reopened after another writer's ``add``
(which leaves the generation as it was) keeps what was recomputed."""

from __future__ import annotations

import threading
from pathlib import Path

from bench.crash import HashEmbedder, docs
from bench.shared_cache import Counting as CountingEmbedder
from slimrag.index.core import Index
from slimrag.index.store.slim import PQConfig, SlimConfig

QUERIES = [f"uniq{i} a{i}" for i in range(0, 200, 7)]


def _hits(idx: Index) -> list[list[str]]:
    return [[h.source for h in idx.search(q, k=5, mode="vector")] for q in QUERIES]


def test_threads_share_one_cache_and_a_reopen_after_add_keeps_it(tmp_path: Path) -> None:
    root = tmp_path / "i"
    Index.build(docs("a", 400, 1), root, embedder=HashEmbedder(), storage="slim",
                slim=SlimConfig(pq=PQConfig(m=16))).close()
    with Index.open(root, HashEmbedder()) as ref:
        want = _hits(ref)

    emb = CountingEmbedder()
    caches, got, errors = [], [], []

    def serve_one() -> None:  # a server worker: its own handle, searching alongside the others
        try:
            with Index.open(root, emb) as idx:
                caches.append(idx.vectors.searcher.cache)
                got.append(_hits(idx))
        except Exception as e:  # handed to the assertion below
            errors.append(e)

    threads = [threading.Thread(target=serve_one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len({id(c) for c in caches}) == 1 and len(caches[0]) > 0  # one cache, filled
    assert all(g == want for g in got)  # shared under 8 concurrent searchers, same answers

    with Index.open(root, HashEmbedder()) as writer:  # another writer adds: a delta part, same generation
        writer.add([(f"b/{i}.txt", f"{i}{i}{i}{i} 0000 9999 {i}") for i in range(5)])  # far from every query
    before = emb.texts
    with Index.open(root, emb) as reopened:  # a handle opened after the add (as workers did before the session)
        assert reopened.vectors.searcher.cache is caches[0]
        assert _hits(reopened) == want
    assert emb.texts - before == len(QUERIES)  # the queries alone: no graph row recomputed again

    with Index.open(root, HashEmbedder()) as writer:  # a compaction: a new generation, a new cache
        writer.compact(rebuild=True)
    with Index.open(root, emb) as fresh:
        assert fresh.vectors.searcher.cache is not caches[0] and len(fresh.vectors.searcher.cache) == 0


def test_serve_holds_one_cache_under_8_concurrent_searches_and_keeps_it_across_another_process_add(
        tmp_path: Path) -> None:
    """``serve`` with 8 search workers: 8 concurrent searches leave one cache of recomputed rows,
    held by the served index's one searcher; ``slimrag add``-like writes by another process are
    caught up in place, and the same searches then re-embed nothing but the queries (the session's
    stronger checks: `tests/test_session.py`)."""
    import gc
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor

    import httpx
    from asgi_server import Endless, running

    from slimrag.index.store.slim.searcher import SlimSearcher
    from slimrag.rag.pipeline import RAG
    from slimrag.serve.app import create_app

    root = tmp_path / "i"
    Index.build(docs("a", 400, 1), root, embedder=HashEmbedder(), storage="slim",
                slim=SlimConfig(pq=PQConfig(m=16))).close()
    emb = CountingEmbedder()
    served = Index.open(root, emb)
    app = create_app(RAG(served, Endless()), search_workers=8, warm=False)

    def searchers() -> set[int]:  # the caches of this index's open searchers
        return {id(s.cache) for s in gc.get_objects() if type(s) is SlimSearcher and s.art.n == 400}

    with running(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        def search_all() -> list[list[str]]:
            with ThreadPoolExecutor(8) as pool:
                replies = list(pool.map(lambda q: client.post("/v1/search", json={"query": q, "k": 5,
                                                                                  "mode": "vector"}), QUERIES))
            assert all(r.status_code == 200 for r in replies), [r.text for r in replies if r.status_code != 200]
            return [[h["source"] for h in r.json()["data"]] for r in replies]

        first = search_all()
        assert len(searchers()) == 1  # 8 workers' searchers, one cache
        code = ("import sys; from bench.crash import HashEmbedder; from slimrag.index.core import Index\n"
                "with Index.open(sys.argv[1], HashEmbedder()) as idx:\n"
                "    idx.add([(f'b/{i}.txt', f'{i}{i}{i}{i} 0000 9999 {i}') for i in range(5)])\n")
        subprocess.run([sys.executable, "-c", code, str(root)], check=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[1])
        before = emb.texts
        assert search_all() == first  # the served index caught up (a new delta part) and agrees
        assert emb.texts - before == len(QUERIES)  # and recomputed no graph row: the cache was kept
        assert len(searchers()) == 1
    served.close()
