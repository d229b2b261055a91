"""One session per process (issue 32, item 3): ``serve``'s pools, the MCP worker and the CLI share
one `Index` kept current by catching up, not by reopening; the index serves many threads at once
(`slimrag.index.threads`), so a slim index holds one searcher and one cache of recomputed rows,
and another process's ``add`` keeps it."""

from __future__ import annotations

import gc
import os
import sqlite3
import subprocess
import sys
import threading
import time
import traceback
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_server import Endless, running

from bench.crash import HashEmbedder, docs
from bench.shared_cache import Counting
from slimrag.index.core import Index
from slimrag.index.store.slim import PQConfig, SlimConfig
from slimrag.index.store.slim.searcher import SlimSearcher
from slimrag.rag.pipeline import RAG
from slimrag.rag.session import Session
from slimrag.serve.app import create_app

REPO = Path(__file__).resolve().parents[1]
QUERIES = [f"uniq{i} a{i}" for i in range(0, 400, 13)]
NEW = [(f"b/{i}.txt", f"{i}{i}{i}{i} 0000 9999 {i}") for i in range(5)]  # far from every query


def _slim(root: Path, n: int = 400) -> None:
    Index.build(docs("a", n, 1), root, embedder=HashEmbedder(), storage="slim",
                slim=SlimConfig(pq=PQConfig(m=16))).close()


def _in_another_process(root: Path, body: str) -> None:
    """Run ``body`` (Python, with ``idx`` the index at ``root`` opened there) in a child process."""
    code = ("import sys; from bench.crash import HashEmbedder; from slimrag.index.core import Index\n"
            "with Index.open(sys.argv[1], HashEmbedder()) as idx:\n    " + body + "\n")
    subprocess.run([sys.executable, "-c", code, str(root)], check=True, timeout=120, cwd=REPO)


def _searchers(n: int) -> list[SlimSearcher]:
    """The slim searchers alive in this process over a graph of ``n`` rows (after a collection:
    an earlier test's unreachable index of the same size is not counted)."""
    gc.collect()
    return [s for s in gc.get_objects() if type(s) is SlimSearcher and s.art.n == n]


def test_serve_holds_one_index_and_one_cache_under_8_concurrent_searches_across_another_process_add(
        tmp_path: Path) -> None:
    """The acceptance of issue 32: 8 concurrent searches through ``serve`` leave ONE searcher (the
    served index's) and one cache of recomputed rows; an ``add`` by another process is caught up in
    place (the same index, searcher and cache, the cache not emptied), the same searches then
    re-embed nothing but the queries, and the added documents are found."""
    root = tmp_path / "i"
    _slim(root)
    emb = Counting()
    served = Index.open(root, emb)
    app = create_app(RAG(served, Endless()), search_workers=8, warm=False)
    with running(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        def search_all(mode: str = "vector") -> list[list[str]]:
            with ThreadPoolExecutor(8) as pool:
                replies = list(pool.map(lambda q: client.post("/v1/search", json={"query": q, "k": 5, "mode": mode}),
                                        QUERIES))
            assert all(r.status_code == 200 for r in replies), [r.text for r in replies if r.status_code != 200]
            return [[h["source"] for h in r.json()["data"]] for r in replies]

        mark = emb.texts
        first = search_all()
        cold = emb.texts - mark - len(QUERIES)  # graph rows recomputed by the first round
        searcher = served.state.vectors.searcher
        assert _searchers(400) == [searcher]  # one index for the 8 threads: one searcher, one cache
        cache, filled = searcher.cache, len(searcher.cache)
        assert cold > 0 and filled > 0

        _in_another_process(root, f"idx.add({NEW!r})")
        mark = emb.texts
        assert search_all() == first  # caught up (a new delta part, far from every query): same answers
        assert emb.texts - mark == len(QUERIES)  # the queries alone: no graph row recomputed again
        assert _searchers(400) == [searcher] and served.state.vectors.searcher is searcher
        assert searcher.cache is cache and len(cache) >= filled  # kept, not emptied
        found = client.post("/v1/search", json={"query": NEW[2][1], "k": 1, "mode": "vector"}).json()["data"]
        assert found[0]["source"] == "b/2.txt"  # the other process's document, from the mapped part

        _in_another_process(root, "idx.remove_sources(['a/013.txt'])")  # a remove: only the catalog moves
        gone = client.post("/v1/search", json={"query": "uniq13 a13", "k": 3, "mode": "hybrid"}).json()["data"]
        assert "a/013.txt" not in [h["source"] for h in gone]
        assert _searchers(400) == [searcher]
    served.close()


def test_one_index_searched_by_8_threads_while_another_process_adds(tmp_path: Path) -> None:
    """Searches from 8 threads on one `Index` (each catching it up first, as a session does) while
    another process adds documents in several commits: no thread trips over another's catalog
    connection or a half-appended view, every keyword answer is right, and at the end the index
    holds what the other process wrote."""
    root = tmp_path / "i"
    _slim(root, 200)
    session = Session(Index.open(root, HashEmbedder()))
    body = ("import time\n    for n in range(6):\n"
            "        idx.add([(f'c/{n}-{i}.txt', f'cword{n} x{i} late') for i in range(4)]); time.sleep(0.05)")
    adder = threading.Thread(target=_in_another_process, args=(root, body))
    errors: list[BaseException] = []
    stop = threading.Event()

    def search_loop(offset: int) -> int:
        rounds = 0
        try:
            while not stop.is_set() or rounds < 3:
                i = (offset * 7 + rounds) % 200
                idx = session.current()
                hits = idx.search(f"uniq{i} a{i}", k=3, mode="hybrid")
                assert hits[0].source == f"a/{i:03d}.txt", (i, [h.source for h in hits])
                rounds += 1
        except BaseException as e:  # handed to the assertion below
            errors.append(e)
        finally:
            session.release_thread()
        return rounds

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(search_loop, t) for t in range(8)]
        adder.start()
        adder.join(120)
        stop.set()
        rounds = [f.result(timeout=120) for f in futures]
    assert not errors, "".join(traceback.format_exception(errors[0]))
    assert min(rounds) >= 3
    idx = session.current()
    assert idx.status()["documents"] == 200 + 24
    assert idx.search("cword5 x3 late", k=1, mode="keyword")[0].source == "c/5-3.txt"
    session.close()


def _catalog_fds(root: Path) -> int:
    inside = str(root.resolve())
    return sum(1 for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}")
               and os.readlink(f"/proc/self/fd/{fd}") == f"{inside}/catalog.sqlite")


def test_threads_have_their_own_connection_and_let_go_of_it(tmp_path: Path) -> None:
    """Each thread reads through a catalog connection of its own; a thread that ends drops and
    closes it without the garbage collector; a closed index holds no descriptor of the catalog
    and refuses every thread's next query."""
    root = tmp_path / "i"
    Index.build(docs("a", 50, 1), root, embedder=HashEmbedder()).close()
    gc.disable()
    try:
        idx = Index.open(root, HashEmbedder())
        assert _catalog_fds(root) == 1
        held, go = threading.Barrier(5), threading.Event()
        catalogs: list[weakref.ref[Any]] = []

        def reader() -> None:
            catalogs.append(weakref.ref(idx.catalog))
            assert idx.search("uniq3 a3", k=1)[0].source == "a/003.txt"
            held.wait(10)
            go.wait(10)

        threads = [threading.Thread(target=reader) for _ in range(4)]
        for t in threads:
            t.start()
        held.wait(10)
        assert len({id(c()) for c in catalogs}) == 4 and all(c() is not idx.catalog for c in catalogs)
        assert _catalog_fds(root) == 5  # the opener's and four readers'
        go.set()
        for t in threads:
            t.join(10)
        # dropped on their threads and closed there (SQLite keeps a closed connection's descriptor
        # for reuse while another connection of the process holds the file: POSIX locks)
        assert all(c() is None for c in catalogs)

        late: list[BaseException] = []

        def after_close() -> None:
            try:
                idx.search("uniq3 a3", k=1)
            except sqlite3.ProgrammingError as e:
                late.append(e)

        idx.close()
        assert _catalog_fds(root) == 0  # every thread's, the ended ones' included
        t = threading.Thread(target=after_close)
        t.start()
        t.join(10)
        assert len(late) == 1 and "closed" in str(late[0])
        assert _catalog_fds(root) == 0
    finally:
        gc.enable()


def test_a_session_builds_its_generator_once_and_a_rag_per_thread(tmp_path: Path) -> None:
    root = tmp_path / "i"
    Index.build(docs("a", 20, 1), root, embedder=HashEmbedder()).close()
    built: list[Endless] = []

    def make() -> Endless:
        built.append(Endless())
        return built[-1]

    session = Session(root, make, embedder=HashEmbedder())
    assert session.index is None  # opened on first use
    rags = []
    with ThreadPoolExecutor(4) as pool:
        rags = list(pool.map(lambda _: (session.rag(), session.rag(), threading.get_ident()), range(4)))
    assert len(built) == 1  # one generator for every thread
    assert all(a is b for a, b, _ in rags)  # a thread keeps its RAG
    assert all(r.llm is built[0] and r.index is session.current() for r, _, _ in rags)
    with pytest.raises(ValueError, match="searching only"):
        Session(root, embedder=HashEmbedder()).generator()
    session.close()


def test_catching_up_follows_a_compaction_and_a_replaced_folder(tmp_path: Path) -> None:
    """The view follows what reopening used to: another process's compaction switches the
    generation in, and a ``build --force`` that swaps a new index into the folder is read from the
    new catalog file."""
    root = tmp_path / "i"
    _slim(root, 120)
    idx = Index.open(root, HashEmbedder())
    gen = idx.stats()["generation"]
    _in_another_process(root, f"idx.add({NEW!r}); idx.compact()")
    assert idx.catch_up() and not idx.catch_up()  # moved once, then nothing more
    assert idx.stats()["generation"] == gen + 1
    assert idx.search(NEW[1][1], k=1, mode="vector")[0].source == "b/1.txt"
    Index.build([("z/new.txt", "zebra quagga okapi")], root, embedder=HashEmbedder(), overwrite=True).close()
    assert idx.catch_up()
    assert [d.source for d in idx.documents()] == ["z/new.txt"]
    assert idx.search("okapi", k=1, mode="keyword")[0].source == "z/new.txt"
    idx.close()


def test_searches_overlap_and_a_waiting_catch_up_goes_before_later_ones() -> None:
    """`ReadWrite`: shared holds overlap; a mutation waits for the holds in flight, and a search
    arriving while it waits goes after it (else steady searching would starve catch-ups)."""
    from slimrag.index.threads import ReadWrite

    guard = ReadWrite()
    both_in = threading.Barrier(2, timeout=10)
    order: list[str] = []
    first_in, release_first = threading.Event(), threading.Event()

    def overlapping() -> None:
        with guard.reading():
            both_in.wait()  # passes only if the two holds overlap

    pair = [threading.Thread(target=overlapping) for _ in range(2)]
    for t in pair:
        t.start()
    for t in pair:
        t.join(10)
    assert not both_in.broken

    def first() -> None:
        with guard.reading():
            first_in.set()
            release_first.wait(10)
            order.append("first search")

    def mutation() -> None:
        with guard.writing(), guard.writing():  # re-entrant for its thread
            order.append("mutation")

    def later() -> None:
        with guard.reading():
            order.append("later search")

    threads = [threading.Thread(target=first)]
    threads[0].start()
    first_in.wait(10)
    threads.append(threading.Thread(target=mutation))
    threads[1].start()
    deadline = time.monotonic() + 10
    while not guard._waiting:  # the mutation is waiting for the first search
        assert time.monotonic() < deadline, "the mutation never queued behind the first search within 10 s"
        threading.Event().wait(0.005)
    threads.append(threading.Thread(target=later))
    threads[2].start()
    threading.Event().wait(0.1)
    assert order == []  # the later search waits behind the waiting mutation
    release_first.set()
    for t in threads:
        t.join(10)
    assert order == ["first search", "mutation", "later search"]
