"""One slim index searched from several threads at once (the one index a server's workers share,
issue 32): each thread walks the graph with its own visited stamps, no lock makes them take turns,
and every thread gets what a lone search gets."""

from __future__ import annotations

import threading
from pathlib import Path

from bench.crash import HashEmbedder, docs
from slimrag.index.core import Index
from slimrag.index.store.slim import PQConfig, SlimConfig

QUERIES = [f"uniq{i} a{i}" for i in range(0, 200, 5)]


def test_threads_searching_one_slim_index_get_the_lone_answers(tmp_path: Path) -> None:
    root = tmp_path / "i"
    Index.build(docs("a", 400, 1), root, embedder=HashEmbedder(), storage="slim",
                slim=SlimConfig(pq=PQConfig(m=16))).close()
    with Index.open(root, HashEmbedder()) as idx:
        alone = [[h.chunk_id for h in idx.search(q, k=5, mode="vector")] for q in QUERIES]
        idx.vectors.searcher.cache.clear()  # every thread recomputes: walks overlap in time
        start, got, errors = threading.Barrier(4), {}, []

        def search(t: int) -> None:
            try:
                start.wait()
                order = QUERIES[t:] + QUERIES[:t]  # each thread in another order
                found = {q: [h.chunk_id for h in idx.search(q, k=5, mode="vector")] for q in order}
                got[t] = [found[q] for q in QUERIES]
            except Exception as e:  # handed to the assertion below
                errors.append(e)

        threads = [threading.Thread(target=search, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors
        assert sorted(got) == [0, 1, 2, 3] and all(g == alone for g in got.values())
