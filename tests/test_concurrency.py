"""Two writers on one index: the writer lock, its recovery, and `check` / `check(repair=True)`.

Real files, real SQLite, real processes. The in-process tests use the real MiniLM (session
fixture); the tests with child processes use the real remote embedder against the trigram-hash
test server on 127.0.0.1, so each child starts in about a second and reopens its embedder from
the manifest as the CLI does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from openai_server import OpenAIServer

from slimrag.embed.local import LocalEmbedder
from slimrag.embed.remote import RemoteEmbedder
from slimrag.index.core import Index
from slimrag.index.store import layout, manifest
from slimrag.index.store.lock import LOCK_FILE, IndexBusyError, WriterLock, holder
from slimrag.types import Chunk, Document

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
WORDS = ("river stone cloud engine violin garden copper lantern harbor orbit meadow signal falcon "
         "pepper quartz timber canyon glacier marble velvet ember mosaic nectar saddle tundra").split()


def _texts(n: int, seed: int, prefix: str = "d") -> list[tuple[str, str]]:
    rng = np.random.default_rng(seed)
    return [(f"{prefix}{seed}-{i}.txt", " ".join(rng.choice(WORDS, size=12)) + f" unique{seed}x{i}")
            for i in range(n)]


@pytest.fixture(scope="module")
def server():
    with OpenAIServer(dim=64) as srv:
        yield srv


def _remote(server: OpenAIServer) -> RemoteEmbedder:
    return RemoteEmbedder(server.base_url, "test-model", dim=64, timeout=10)


# -- the reproducer of the issue, in one process ---------------------------------------------------
def test_two_handles_adding_lose_no_vector(tmp_path: Path, embedder: LocalEmbedder) -> None:
    p = tmp_path / "two.slimrag"
    Index.build([("zero.txt", "The zoo opened a new enclosure for the zebras.")], p, embedder=embedder).close()
    i1, i2 = Index.open(p, embedder), Index.open(p, embedder)
    i1.add([("one.txt", "The keeper feeds the tall giraffes every morning.")])
    i2.add([("two.txt", "A colony of penguins dives from the ice shelf.")])  # its manifest was stale
    for idx in (i2, Index.open(p, embedder)):  # the last writer, and a reader opened now
        assert idx.catalog.counts()["chunks"] == 3
        assert len(idx.vectors) == 3 and int(idx.vectors.live.sum()) == 3
        assert idx.search("giraffes", k=1)[0].source == "one.txt"
        assert idx.search("penguins on ice", k=1)[0].source == "two.txt"
        assert idx.search("penguins", k=1, mode="keyword")[0].source == "two.txt"
    rep = i1.check()
    assert rep.ok and (rep.chunks, rep.vector_rows) == (3, 3), rep.problems()
    assert sorted(os.listdir(p / layout.DELTA)) == ["part-000001.npz", "part-000002.npz"]  # no overwrite
    i1.compact()  # i2 still holds the manifest from before the compaction
    i2.remove(["zero.txt"])
    i2.add([("three.txt", "Owls hunt mice at night in the barn.")])
    fresh = Index.open(p, embedder)
    assert [d.source for d in fresh.documents()] == ["one.txt", "three.txt", "two.txt"]
    assert fresh.check().ok
    assert {h.source for h in fresh.search("animals", k=5)} == {"one.txt", "two.txt", "three.txt"}


def test_second_writer_waits_then_fails_naming_the_holder(tmp_path: Path, embedder: LocalEmbedder) -> None:
    p = tmp_path / "busy.slimrag"
    Index.build([("a.txt", "apples are red")], p, embedder=embedder).close()
    first, second = Index.open(p, embedder), Index.open(p, embedder, wait=0)
    with first.locked():
        info = holder(p)
        assert info is not None and info["pid"] == os.getpid()
        t0 = time.monotonic()
        with pytest.raises(IndexBusyError, match=rf"being written by pid {os.getpid()} .*gave up after waiting 0 s"):
            second.add([("b.txt", "pears are green")])
        second.lock_wait = 0.3
        with pytest.raises(IndexBusyError, match="waiting 0.3 s"):
            second.remove(["a.txt"])
        assert 0.3 <= time.monotonic() - t0 < 5
        assert second.search("apples", k=1)[0].source == "a.txt"  # readers take no lock
        first.add([("c.txt", "plums are purple")])  # the holder's own writes reuse its lock
    assert holder(p) is None  # emptied on release
    assert [d.source for d in second.documents()] == ["a.txt", "c.txt"]  # nothing half-written

    second.lock_wait = 10  # now a waiting writer succeeds once the holder lets go
    done = threading.Event()

    def hold() -> None:  # another writer (an `Index` belongs to one thread; its lock is the same file)
        with WriterLock(p, 0):
            done.set()
            time.sleep(0.5)

    other = threading.Thread(target=hold)
    other.start()
    done.wait(5)
    t0 = time.monotonic()
    second.add([("b.txt", "pears are green")])
    waited = time.monotonic() - t0
    other.join()
    assert waited >= 0.2, waited
    assert second.check().ok and len(second.documents()) == 3


def test_wait_from_environment_and_bad_values(tmp_path: Path, embedder: LocalEmbedder,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from slimrag.errors import SlimragError
    from slimrag.index.store.lock import DEFAULT_WAIT_S, WriterLock, default_wait

    assert default_wait() == DEFAULT_WAIT_S
    monkeypatch.setenv("SLIMRAG_WAIT", "2.5")
    assert WriterLock(tmp_path).wait == 2.5
    monkeypatch.setenv("SLIMRAG_WAIT", "soon")
    with pytest.raises(SlimragError, match="not a number of seconds"):
        default_wait()
    with pytest.raises(ValueError, match=">= 0"):
        WriterLock(tmp_path, -1)


# -- recovery and repair ----------------------------------------------------------------------------
def test_write_interrupted_before_its_commit_is_rolled_back(tmp_path: Path, embedder: LocalEmbedder,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "rb.slimrag"
    idx = Index.build([("a.txt", "apples are red")], p, embedder=embedder)

    def die() -> None:  # the process dies after the manifest switch, before COMMIT
        raise KeyboardInterrupt

    monkeypatch.setattr(idx.catalog, "commit", die)
    with pytest.raises(KeyboardInterrupt):
        idx.add([("b.txt", "pears are green")])
    monkeypatch.undo()
    idx.close()
    assert len(manifest.read(p).delta_parts) == 1  # names vectors of uncommitted chunks
    again = Index.open(p, embedder)
    rep = again.check()
    assert rep.ok and rep.rolled_back == ("part-000001.npz",), rep
    assert manifest.read(p).delta_parts == ()
    assert again.add([("b.txt", "pears are green")]).added == 1  # a fresh part number, no overwrite
    assert again.manifest["delta_parts"] == ["part-000002.npz"]
    assert again.search("green pears", k=1)[0].source == "b.txt" and again.check().ok


def test_repair_of_the_damage_the_old_race_left(tmp_path: Path, embedder: LocalEmbedder) -> None:
    p = tmp_path / "dmg.slimrag"
    idx = Index.build([("a.txt", "apples are red"), ("b.txt", "bananas are yellow")], p, embedder=embedder)
    idx.add([("c.txt", "cherries are dark red")])
    idx.add([("d.txt", "dates are sweet and brown")])
    # 1. what the race left: a writer overwrote part-000001 (c.txt's vectors are gone) ...
    os.unlink(p / layout.DELTA / "part-000001.npz")
    # 2. ... and catalog rows committed with no vector at all
    next_id = idx.manifest["next_chunk_id"]
    with idx.catalog.transaction():
        idx.catalog.put_document(Document("e" * 64, "e.txt", 0.0, 20))
        idx.catalog.put_chunks([Chunk(next_id, "e" * 64, "e.txt", 0, "elderberries grow on shrubs", {})])
    # 3. a compaction from a stale live set: vectors kept for a removed chunk, tombstone gone
    idx.remove(["b.txt"])
    idx.catalog.clear_tombstones()
    # 4. a chunk stored twice, 5. the keyword index out of step with its table
    a_id = idx.catalog.live_ids("a.txt")[0]
    extra = layout.write_delta_part(p, 9, np.array([a_id]), embedder.embed(["apples are red"]))
    current = manifest.read(p)
    manifest.write(p, current.changed(delta_parts=(*current.delta_parts, extra)))
    idx.catalog.db.execute("DELETE FROM keyword_lengths WHERE chunk_id=?", (a_id,))  # the postings index
    idx.close()

    damaged = Index.open(p, embedder)  # opens with a warning: one part is missing
    assert damaged.bad_parts == ["part-000001.npz"]
    rep = damaged.check()
    assert not rep.ok
    c_ids = damaged.catalog.live_ids("c.txt")
    assert rep.bad_parts == ("part-000001.npz",)
    assert rep.missing == tuple(sorted([*c_ids, next_id]))
    assert rep.duplicates == (a_id,) and len(rep.orphans) == 1
    assert any(e.startswith("keyword:") for e in rep.sqlite_errors)
    fixed = damaged.check(repair=True)
    assert fixed.repair is not None and fixed.repair.after is not None
    assert fixed.repair.reembedded == len(c_ids) + 1 and fixed.repair.compacted
    assert fixed.repair.rebuilt_keyword_index and fixed.repair.after.ok, fixed.repair.after.problems()
    assert damaged.check().ok
    assert damaged.search("cherries", k=1)[0].source == "c.txt"
    assert damaged.search("elderberry shrub", k=1)[0].source == "e.txt"
    assert damaged.search("apples", k=1, mode="keyword")[0].source == "a.txt"
    assert [h.source for h in damaged.search("fruit", k=10)].count("a.txt") == 1
    assert "b.txt" not in {h.source for h in damaged.search("bananas yellow", k=10)}


# -- child processes ----------------------------------------------------------------------------
CHILD = """
import sys, time
from pathlib import Path
from slimrag.index import writer
from slimrag.index.core import Index
writer.COMMIT_CHUNKS = 16  # many small transactions: the add holds the lock a while
path, op, go = sys.argv[1], sys.argv[2], Path(sys.argv[3])
idx = Index.open(path)
print("ready", flush=True)
while not go.exists():
    time.sleep(0.005)
if op == "compact":
    time.sleep(0.3)  # let the add take the lock first
    idx.compact()
else:
    words = "kiwi mango papaya guava lychee".split()
    idx.add([(f"new-{i}.txt", f"{words[i % 5]} fruit number {i} fresh{i}") for i in range(int(op))])
print("done", flush=True)
"""


@pytest.mark.parametrize("storage", ["slim", pytest.param("flat", marks=pytest.mark.slow)])  # slim: the case
def test_compact_racing_an_add_in_two_processes(server: OpenAIServer, tmp_path: Path, storage: str) -> None:
    p = tmp_path / "race.slimrag"
    idx = Index.build(_texts(120, 1), p, embedder=_remote(server), storage=storage)
    idx.add(_texts(20, 2))
    idx.remove([s for s, _ in _texts(120, 1)[:10]])
    idx.close()
    go = tmp_path / "go"
    kids = [subprocess.Popen([sys.executable, "-c", CHILD, str(p), op, str(go)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=ENV) for op in ("150", "compact")]
    try:
        for k in kids:
            assert k.stdout.readline().strip() == "ready", k.stderr.read()  # type: ignore[union-attr]
        go.touch()
        outs = [k.communicate(timeout=240) for k in kids]
    finally:
        for k in kids:
            if k.poll() is None:
                k.kill()
    for k, (out, err) in zip(kids, outs, strict=True):
        assert k.returncode == 0 and "done" in out, err
    assert "is being written by pid" in outs[1][1]  # the compaction waited for the add
    after = Index.open(p, embedder=_remote(server))
    rep = after.check()
    assert rep.ok and rep.chunks == 110 + 20 + 150 and rep.vector_rows >= rep.chunks, rep.problems()
    for i in (0, 77, 149):
        assert after.search(f"fresh{i}", k=1, mode="keyword")[0].source == f"new-{i}.txt"
        assert f"new-{i}.txt" in {h.source for h in after.search(f"fruit number {i} fresh{i}", k=20)}


def _cli(*args: str, wait: str | None = None) -> subprocess.Popen[str]:
    env = dict(ENV)
    if wait is not None:
        env["SLIMRAG_WAIT"] = wait
    code = "from slimrag.cli import main; main()"
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def _folder(root: Path, n: int, tag: str) -> Path:
    root.mkdir()
    for i in range(n):
        (root / f"{tag}{i}.txt").write_text(f"{tag} note {i}: " + " ".join(WORDS[(i + j) % len(WORDS)]
                                                                           for j in range(30)))
    return root


def test_two_cli_adds_racing(server: OpenAIServer, tmp_path: Path) -> None:
    p = tmp_path / "cli.slimrag"
    Index.build(_texts(5, 3), p, embedder=_remote(server)).close()
    a, b = _folder(tmp_path / "a", 60, "alpha"), _folder(tmp_path / "b", 60, "beta")

    holder_idx = Index.open(p, embedder=_remote(server))
    with holder_idx.locked():  # a writer busy with the index: --wait 0 fails at once, cleanly
        t0 = time.monotonic()
        out, err = _cli("add", str(p), str(a), wait="0").communicate(timeout=120)
        assert time.monotonic() - t0 < 60
        assert f"is being written by pid {os.getpid()}" in err and err.startswith("error: "), err
        assert "Traceback" not in err and err.count("\n") == 1
        waiting = _cli("add", str(p), str(a))  # default wait: blocks until the holder is done
        seen = []
        while not seen or "waiting up to 300 s" not in seen[-1]:
            seen.append(waiting.stderr.readline())  # type: ignore[union-attr]
            assert seen[-1] and len(seen) < 20, seen  # EOF or noise: the child did not wait
        time.sleep(0.2)
        assert waiting.poll() is None
    out, err = waiting.communicate(timeout=120)
    assert waiting.returncode == 0 and "60 added" in out, err
    # two real CLI adds at once: both succeed, one after the other
    both = [_cli("add", str(p), str(folder)) for folder in (a, b)]
    results = [k.communicate(timeout=180) for k in both]
    assert [k.returncode for k in both] == [0, 0], results
    assert sorted(r[0].split(",")[0] for r in results) == ["0 added", "60 added"]
    holder_idx.close()
    after = Index.open(p, embedder=_remote(server))
    rep = after.check()
    assert rep.ok and rep.chunks == 125 and len(after.documents()) == 125, rep.problems()
    out, err = _cli("check", str(p), "--json").communicate(timeout=60)
    assert '"ok": true' in out, err
    assert (p / LOCK_FILE).read_text() == ""


def test_delta_parts_are_created_exclusively(tmp_path: Path) -> None:
    from slimrag.errors import IndexFormatError

    vecs = np.eye(2, 4, dtype=np.float32)
    name = layout.write_delta_part(tmp_path, 3, np.array([7, 8]), vecs)
    with pytest.raises(IndexFormatError, match="refusing to overwrite"):
        layout.write_delta_part(tmp_path, 3, np.array([9, 10]), vecs)
    ids, _ = layout.read_delta_part(tmp_path / layout.DELTA / name)
    assert ids.tolist() == [7, 8]  # the first writer's vectors are intact
    assert sorted(os.listdir(tmp_path / layout.DELTA)) == [name]  # no temp file left behind
    assert layout.next_part(tmp_path, 3) == 4 and layout.next_part(tmp_path, 9) == 9
