"""`Index.sync`, `slimrag sync` and `slimrag watch`: the index ends holding exactly the folder's
readable files, checked against ground truth (the SHA-256 of each file the test wrote, and a fresh
build of the same folder), after edits, renames, deletions, a SIGKILL mid-sync, an editor's
save-by-rename and a burst of 1,000 files; `Index.remove` reads paths as typed.

The embedder is bench.crash's `HashEmbedder` (trigram hashing, no model to load: registered as
kind "hash", so a child process reopens the index from its manifest), so these tests measure the
sync, not the embedding.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import select
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import write_tree

from bench.crash import HashEmbedder
from slimrag.cli import cli
from slimrag.errors import IngestError
from slimrag.index import sync
from slimrag.index.core import Index
from slimrag.index.store import layout
from slimrag.index.sync import SyncReport
from slimrag.index.watch import Batch, WatchConfig, watch

REPO = Path(__file__).resolve().parents[1]

FOLDER = {
    "a.txt": "The ferry leaves the harbour at dawn.",
    "b.md": "# Bees\n\nBees dance to tell the hive where the clover is.",
    "sub/c.txt": "Copper wire conducts electricity well.",
    "sub/deep/d.rst": "Dunes\n=====\n\nWind shapes the dunes of the desert.",
    "gone/e.txt": "Every folder here will be deleted.",
    ".hidden.txt": "hidden files are never read",
    "skip.log": "ignored by .gitignore",
    ".gitignore": "*.log\n",
    "img.png": b"\x89PNG\r\n\x1a\n\x00\x00binary",
}


def readable(folder: Path) -> dict[str, str]:
    """Ground truth, from the test's own rules for ``FOLDER``-like trees: every file but hidden
    ones, ``*.log`` and ``*.png``, as stored name -> SHA-256 of its bytes."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if p.is_file() and not any(part.startswith(".") for part in rel.parts) and p.suffix not in (".log", ".png"):
            out[rel.as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def stored(idx: Index) -> dict[str, str]:
    return {d.source: d.doc_id for d in idx.documents()}


def age(folder: Path, seconds: float = 100.0) -> None:
    """Date every file back, as files that have existed a while (not "racily clean", see sync.RACY_S)."""
    t = time.time() - seconds
    for p in folder.rglob("*"):
        os.utime(p, (t, t), follow_symlinks=False)


@pytest.fixture()
def synced(tmp_path: Path) -> Iterator[tuple[Path, Index]]:
    folder = write_tree(tmp_path / "docs", FOLDER)
    age(folder)
    idx = Index.build(folder, tmp_path / "docs.slimrag", embedder=HashEmbedder())
    yield folder, idx
    idx.close()


def test_sync_mirrors_creates_edits_renames_and_deletes(synced: tuple[Path, Index], tmp_path: Path) -> None:
    folder, idx = synced
    assert stored(idx) == readable(folder)
    (folder / "new.txt").write_text("Newts live near the pond in spring.")
    (folder / "b.md").write_text("# Bees\n\nBees sleep at night in the hive.")
    (folder / "sub/c.txt").rename(folder / "sub/c-renamed.txt")
    (folder / "a.txt").unlink()
    for p in (folder / "gone").iterdir():
        p.unlink()
    (folder / "gone").rmdir()
    (folder / "sub/deep/more").mkdir()
    (folder / "sub/deep/more/f.md").write_text("Falcons dive at great speed.")
    (folder / "later.log").write_text("ignored, never stored")
    age(folder, 50)  # not just written, so the next sync trusts stat at once (see sync.RACY_S)

    rep = idx.sync(folder)
    assert stored(idx) == readable(folder)
    assert (rep.added, rep.updated, rep.removed, rep.unchanged) == (3, 1, 3, 1)  # new, renamed, f | b | a, c, e | d
    assert sorted(rep.removed_sources) == ["a.txt", "gone/e.txt", "sub/c.txt"]
    assert rep.skipped_by_reason() == {"unsupported type": 1, "ignored": 4}  # img.png | .gitignore, hidden, 2 logs
    assert [h.source for h in idx.search("Bees sleep at night", k=1, mode="keyword")] == ["b.md"]
    assert idx.search("clover", k=5, mode="keyword") == []  # b.md's old text is gone
    assert idx.check().ok
    with Index.build(folder, tmp_path / "fresh.slimrag", embedder=HashEmbedder()) as fresh:
        assert stored(fresh) == stored(idx)  # what a fresh build of the folder holds
        texts = sorted(c.text for c in fresh.catalog.chunks(fresh.catalog.live_ids()).values())
    assert sorted(c.text for c in idx.catalog.chunks(idx.catalog.live_ids()).values()) == texts
    again = idx.sync(folder)
    assert (again.added, again.updated, again.removed, again.read) == (0, 0, 0, 0)


def test_unchanged_files_are_not_read_and_touched_ones_are_hashed_once(synced: tuple[Path, Index]) -> None:
    folder, idx = synced
    n = len(readable(folder))
    rep = idx.sync(folder)
    assert (rep.unchanged, rep.read, rep.added, rep.updated, rep.removed) == (n, 0, 0, 0, 0)

    t = time.time() - 50  # a touch: new mtime, same bytes -> read and hashed, not re-embedded
    os.utime(folder / "a.txt", (t, t))
    rep = idx.sync(folder)
    assert (rep.unchanged, rep.read, rep.updated, rep.chunks) == (n, 1, 0, 0)
    assert idx.catalog.document("a.txt").mtime == (folder / "a.txt").stat().st_mtime  # stat trusted again
    assert idx.sync(folder).read == 0

    (folder / "a.txt").write_text("The ferry leaves the harbour at noon.")  # just written: racily clean
    rep = idx.sync(folder)
    assert (rep.updated, rep.read) == (1, 1)
    assert idx.catalog.document("a.txt").mtime == sync.RACY_MTIME
    os.utime(folder / "a.txt", (t, t))
    rep = idx.sync(folder)  # read once more (a second edit in the same mtime tick would show here)
    assert (rep.read, rep.updated, rep.unchanged) == (1, 0, n)
    assert idx.sync(folder).read == 0


def test_a_sync_never_removes_documents_of_other_folders(synced: tuple[Path, Index], tmp_path: Path) -> None:
    folder, idx = synced
    other = write_tree(tmp_path / "other", {"x.txt": "Xylophones are played with mallets.",
                                            "y.txt": "Yaks live high in the mountains."})
    age(other)
    idx.add(other)
    x, y = (other / "x.txt").resolve().as_posix(), (other / "y.txt").resolve().as_posix()
    assert {x, y} <= set(stored(idx))  # outside the source root: stored by absolute name

    (folder / "a.txt").unlink()
    (other / "y.txt").unlink()
    rep = idx.sync(folder)
    assert rep.removed_sources == ["a.txt"] and x in stored(idx) and y in stored(idx)

    rep = idx.sync(other)  # its scope is its own absolute prefix
    assert rep.removed_sources == [y] and "b.md" in stored(idx)

    (folder / "b.md").unlink()
    (folder / "sub/c.txt").unlink()
    rep = idx.sync(folder / "sub")  # a subfolder's scope is sub/: b.md stays until its folder is synced
    assert rep.removed_sources == ["sub/c.txt"] and "b.md" in stored(idx)
    assert stored(idx) == {**readable(folder), "b.md": stored(idx)["b.md"], x: stored(idx)[x]}

    (other / "w.txt").write_text("Walruses rest on the ice.")
    rep = idx.sync(tmp_path)  # holds the source root: owns its relative names and the absolute ones below it
    w = (other / "w.txt").resolve().as_posix()
    assert rep.removed_sources == ["b.md"] and rep.files["added"] == [w]
    assert stored(idx) == {**readable(folder), x: stored(idx)[x], w: stored(idx)[w]}


def test_partial_sync_of_paths_matches_a_full_sync(synced: tuple[Path, Index]) -> None:
    folder, idx = synced
    (folder / "a.txt").write_text("Anchors hold the ship in the bay.")
    (folder / ".a.txt.swp").write_text("an editor's swap file")
    (folder / "again.log").write_text("ignored")
    (folder / "gone/e.txt").unlink()
    (folder / "gone").rmdir()
    touched = ["a.txt", ".a.txt.swp", "again.log", "gone", "no-such-file.txt"]
    rep = idx.sync(folder, paths=touched)
    assert not rep.full and rep.paths == 5 and rep.read == 1
    assert (rep.updated, rep.removed_sources) == (1, ["gone/e.txt"])
    assert stored(idx) == readable(folder)
    rep = idx.sync(folder, paths=[folder / ".gitignore"])  # an ignore file changes many paths: full
    assert rep.full and stored(idx) == readable(folder)


def test_an_index_inside_the_folder_is_never_indexed_nor_a_link_out_of_it(tmp_path: Path) -> None:
    folder = write_tree(tmp_path / "notes", {"a.txt": "Apples ripen in autumn."})
    (folder / "out.txt").symlink_to("/etc/hostname")
    with Index.create(folder / "notes.slimrag", embedder=HashEmbedder(), source_root=folder) as idx:
        rep = idx.sync(folder)
        assert stored(idx) == {"a.txt": hashlib.sha256(b"Apples ripen in autumn.").hexdigest()}
        assert rep.listing()["ignored"] == ["notes.slimrag/"]
        assert rep.listing()["symlink outside the folder"] == ["out.txt"]
        rep = idx.sync(folder, paths=["out.txt", "notes.slimrag/manifest.json"])
        assert rep.listing() == {"symlink outside the folder": ["out.txt"]} and len(stored(idx)) == 1


def test_remove_reads_paths_as_typed(synced: tuple[Path, Index], tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    folder, idx = synced
    monkeypatch.chdir(tmp_path)
    assert idx.remove_matching(["docs/a.txt"]).sources == ["a.txt"]  # relative to the current folder
    assert idx.remove_matching(["b.md"]).sources == ["b.md"]  # relative to the indexed folder
    assert idx.remove_matching([str(folder / "sub/deep")]).sources == ["sub/deep/d.rst"]  # absolute folder
    with caplog.at_level(logging.WARNING, logger="slimrag.index"):
        got = idx.remove_matching(["gone/*.txt", "nothing/here.md"])
    assert (got.sources, got.nothing) == (["gone/e.txt"], ["nothing/here.md"]) and got.chunks == 1
    assert "nothing stored matches 'nothing/here.md'" in caplog.text
    assert idx.remove("sub") == 1 and stored(idx) == {}


def run_child(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(REPO)!r})\n{code}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_a_sync_killed_mid_write_converges_at_the_next_sync(tmp_path: Path) -> None:
    folder = write_tree(tmp_path / "docs", {f"old/{i:03d}.txt": f"old file {i} river stone w{i}x" for i in range(60)})
    age(folder)
    path = tmp_path / "docs.slimrag"
    Index.build(folder, path, embedder=HashEmbedder()).close()
    # the burst: 300 new files, 10 edited, 10 renamed, 10 deleted
    write_tree(folder, {f"new/{i:03d}.txt": f"new file {i} glacier lantern burst{i}q" for i in range(300)})
    for i in range(10):
        (folder / f"old/{i:03d}.txt").write_text(f"edited file {i} meadow orbit")
        (folder / f"old/{10 + i:03d}.txt").rename(folder / f"old/renamed-{i:03d}.txt")
        (folder / f"old/{20 + i:03d}.txt").unlink()
    child = run_child("from bench.crash import HashEmbedder\nfrom slimrag.index import writer\n"
                      "from slimrag.index.core import Index\n"
                      "writer.COMMIT_CHUNKS = 8  # many transactions, so the kill lands between two\n"
                      f"idx = Index.open({str(path)!r}, embedder=HashEmbedder())\n"
                      f"print('ready', flush=True)\nidx.sync({str(folder)!r})\nprint('done', flush=True)\n")
    assert readline(child, 60).strip() == "ready"
    db = sqlite3.connect(f"file:{path / layout.CATALOG}?mode=ro", uri=True)
    deadline = time.monotonic() + 60
    while db.execute("SELECT COUNT(*) FROM documents WHERE source LIKE 'new/%'").fetchone()[0] < 40:
        assert child.poll() is None and time.monotonic() < deadline, "the sync ended before it was killed"
        time.sleep(0.005)
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    db.close()
    with Index.open(path, embedder=HashEmbedder()) as idx:
        mid = stored(idx)
        assert 40 <= len([s for s in mid if s.startswith("new/")]) < 300  # killed part-way through
        rep = idx.sync(folder)
        assert rep.added + rep.updated < 320  # what the killed sync committed is kept, not redone
        check = idx.check()
        assert check.ok, check.problems()
        assert stored(idx) == readable(folder)
        for mode in ("keyword", "hybrid"):
            assert idx.search("burst299q", k=1, mode=mode)[0].source == "new/299.txt"
        assert idx.search("new file 150 glacier lantern burst150q", k=1, mode="vector")[0].source == "new/150.txt"


class Watcher:
    """`watch` on a thread with a stop event; the thread opens its own `Index` (one per thread)."""

    def __init__(self, folder: Path, path: Path, config: WatchConfig) -> None:
        self.batches: list[Batch] = []
        self.stop = threading.Event()
        self.started = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(folder, path, config), daemon=True)

    def _run(self, folder: Path, path: Path, config: WatchConfig) -> None:
        try:
            with Index.open(path, embedder=HashEmbedder()) as idx:
                watch(idx, folder, config=config, stop=self.stop, on_batch=self._batch)
        except BaseException as e:  # handed to the test thread, which re-raises it
            self.error = e
            self.started.set()

    def _batch(self, batch: Batch) -> None:
        self.batches.append(batch)
        self.started.set()

    def __enter__(self) -> Watcher:
        self.thread.start()
        assert self.started.wait(20) and self.error is None, self.error
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        assert not self.thread.is_alive(), "watch did not stop"
        if self.error is not None:
            raise self.error


def wait_for(path: Path, want: dict[str, str], timeout: float = 15.0) -> dict[str, str]:
    """Poll the index (a reader: no lock) until it stores ``want`` or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    with Index.open(path, embedder=HashEmbedder()) as idx:
        while True:
            got = stored(idx)
            if got == want or time.monotonic() > deadline:
                return got
            time.sleep(0.1)


def test_watch_survives_save_by_rename(synced: tuple[Path, Index]) -> None:
    folder, idx = synced
    config = WatchConfig(quiet_ms=200, max_batch_ms=2000)
    with Watcher(folder, idx.root, config) as w:
        tmp = folder / ".a.txt.tmp"  # write a temporary file, rename it over the original
        tmp.write_text("The ferry leaves the harbour at midnight.")
        os.replace(tmp, folder / "a.txt")
        assert wait_for(idx.root, readable(folder)) == readable(folder)
        (folder / "b.md").rename(folder / "b.md~")  # vim's way: keep a backup, write anew, drop the backup
        (folder / "b.md").write_text("# Bees\n\nBees fan their wings to cool the hive.")
        (folder / "b.md~").unlink()
        assert wait_for(idx.root, readable(folder)) == readable(folder)
    removed = [s for b in w.batches for s in b.report.removed_sources]
    assert "a.txt" not in removed and "b.md" not in removed  # updated in place, never deleted
    assert sum(b.report.updated for b in w.batches) == 2
    assert all(not b.report.full for b in w.batches[1:])  # batches of a few paths sync those paths


def test_watch_batches_a_burst_of_1000_files(synced: tuple[Path, Index]) -> None:
    folder, idx = synced
    with Watcher(folder, idx.root, WatchConfig(quiet_ms=300, max_batch_ms=1000, full_sync_paths=200)) as w:
        write_tree(folder, {f"burst/{i:04d}.txt": f"burst file {i} token{i}z" for i in range(1000)})
        (folder / "a.txt").unlink()
        want = readable(folder)
        assert wait_for(idx.root, want) == want
    syncs = w.batches[1:]
    assert 1 <= len(syncs) <= 15  # batched: not one sync per file
    assert any(b.report.full for b in syncs)  # a batch of more than 200 paths syncs the whole folder
    assert sum(b.report.added for b in syncs) == 1000


def test_cli_sync_reports_counts_and_json(synced: tuple[Path, Index], tmp_path: Path) -> None:
    folder, idx = synced
    (folder / "a.txt").unlink()
    (folder / "z.txt").write_text("Zebras have stripes.")
    t = time.time() - 50
    os.utime(folder / "z.txt", (t, t))
    runner = CliRunner()
    res = runner.invoke(cli, ["sync", str(folder), str(idx.root), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert "indexed: files 9/9" in res.stderr  # the progress display of build/add, as log lines off a terminal
    assert (out["added"], out["removed"], out["unchanged"], out["read"]) == (1, 1, 4, 1)
    assert out["files"]["removed"] == ["a.txt"] and out["skipped_by_reason"]["ignored"] == 3
    res = runner.invoke(cli, ["sync", str(folder), str(idx.root)])
    assert res.exit_code == 0 and res.stdout.startswith("0 added, 0 updated, 0 removed, 5 unchanged (0 read)")
    res = runner.invoke(cli, ["sync", str(folder), str(tmp_path / "typo.slimrag")])
    assert res.exit_code == 2 and "does not exist; create it with `slimrag build" in res.output


def test_cli_sync_json_names_changed_files_and_counts_unchanged_ones(synced: tuple[Path, Index]) -> None:
    """1,171 unchanged names in every report made ``sync --json`` unreadable: the changed files
    come by name, the unchanged ones as a count, their names only with ``--verbose``."""
    folder, idx = synced
    (folder / "b.md").write_text("# Bees\n\nBees sleep in the hive at night.")
    runner = CliRunner()
    out = json.loads(runner.invoke(cli, ["sync", str(folder), str(idx.root), "--json"]).stdout)
    assert out["files"]["updated"] == ["b.md"] and "unchanged" not in out["files"] and out["unchanged"] == 4
    for args in (["sync", str(folder), str(idx.root), "--json", "--verbose"],
                 ["-v", "sync", str(folder), str(idx.root), "--json"]):
        out = json.loads(runner.invoke(cli, args).stdout)
        assert sorted(out["files"]["unchanged"]) == sorted(readable(folder)) and out["unchanged"] == 5, args


def readline(child: subprocess.Popen[str], timeout: float = 15.0) -> str:
    """The child's next stdout line, or "" after ``timeout`` (a hung child fails the test, not the run)."""
    assert child.stdout is not None
    ready, _, _ = select.select([child.stdout], [], [], timeout)
    return child.stdout.readline() if ready else ""


def test_cli_watch_prints_a_line_per_batch_and_stops_on_ctrl_c(synced: tuple[Path, Index]) -> None:
    folder, idx = synced
    child = run_child("import bench.crash  # registers the hash embedder\nfrom slimrag.cli import main\n"
                      f"sys.argv = ['slimrag', 'watch', {str(folder)!r}, {str(idx.root)!r}, '--quiet-ms', '200']\n"
                      "main()\n")
    try:
        first = readline(child)
        assert "full sync: 0 added, 0 updated, 0 removed, 5 unchanged" in first
        (folder / "n.txt").write_text("Nightingales sing at night.")
        second = readline(child)
        assert "1 path: 1 added, 0 updated, 0 removed" in second
    finally:
        child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=10)
    assert child.returncode == 0 and "stopped" in err and "Traceback" not in err


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def stop_and_time(child: subprocess.Popen[str], signum: int) -> tuple[float, str]:
    """Send ``signum``; the seconds until the child exited (a hung child fails at 10 s) and its stderr."""
    t0 = time.monotonic()
    child.send_signal(signum)
    try:
        _, err = child.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        child.kill()  # never leave a hung child behind (the slow one below would run for minutes)
        child.communicate()
        raise
    return time.monotonic() - t0, err


@pytest.mark.parametrize("how", ["SIGINT, inherited as ignored", "SIGTERM"])
def test_cli_watch_stops_on_a_signal_even_when_sigint_was_ignored_at_start(
        synced: tuple[Path, Index], how: str) -> None:
    """Why the Ctrl-C test once hung for over 10 s: a shell starts a background job (``make test
    &``) with SIGINT ignored, the child inherits that, and Python then installs no
    KeyboardInterrupt handler: the watcher ignored the test's SIGINT. It must stop anyway, and on
    SIGTERM (what ``kill`` and service managers send) as well."""
    folder, idx = synced
    code = ("import bench.crash\nfrom slimrag.cli import main\n"
            f"sys.argv = ['slimrag', 'watch', {str(folder)!r}, {str(idx.root)!r}, '--quiet-ms', '200']\nmain()\n")
    child = subprocess.Popen([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(REPO)!r})\n{code}"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "HF_HUB_OFFLINE": "1"}, preexec_fn=_ignore_sigint)
    try:
        assert "full sync" in readline(child)
    finally:
        took, err = stop_and_time(child, signal.SIGTERM if how == "SIGTERM" else signal.SIGINT)
    assert child.returncode == 0 and "stopped" in err and "Traceback" not in err, err
    assert took < 5, took  # the bar is 1 s; 5 s leaves room for a loaded machine, a hang takes forever


def test_cli_watch_stops_within_a_second_in_the_middle_of_a_sync(synced: tuple[Path, Index]) -> None:
    """Ctrl-C while a sync sits in a long C call (a model's forward pass would; here the embedder
    runs a SQLite query of 300 million steps, a minute or so, which Python cannot interrupt): the watcher leaves the
    sync unfinished and exits, and the next sync converges to the folder."""
    folder, idx = synced
    slow = ("import sqlite3\nfrom bench.crash import HashEmbedder\nfast = HashEmbedder.embed_batch\n"
            "def slow(self, texts):\n"
            "    if any('Slowworms' in t for t in texts):\n"
            "        print('embedding', flush=True)\n"
            "        sqlite3.connect(':memory:').execute('WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 "
            "FROM c WHERE x < 300000000) SELECT count(*) FROM c').fetchone()\n"
            "    return fast(self, texts)\n"
            "HashEmbedder.embed_batch = slow\n")
    child = run_child(f"{slow}from slimrag.cli import main\n"
                      f"sys.argv = ['slimrag', 'watch', {str(folder)!r}, {str(idx.root)!r}, '--quiet-ms', '200']\n"
                      "main()\n")
    try:
        assert "full sync" in readline(child)
        (folder / "s.txt").write_text("Slowworms are legless lizards, not worms.")
        assert readline(child).strip() == "embedding"  # the sync is in its long call now
    finally:
        took, err = stop_and_time(child, signal.SIGINT)
    assert child.returncode == 0 and "left unfinished" in err and "Traceback" not in err, err
    assert took < 5, took  # the bar is 1 s; without the worker thread it took the query's minute
    assert "s.txt" not in stored(idx)  # the abandoned sync committed nothing
    rep = idx.sync(folder)
    assert rep.added == 1 and stored(idx) == readable(folder)


def test_sync_report_counts_every_file(synced: tuple[Path, Index]) -> None:
    folder, idx = synced
    rep = idx.sync(folder)
    assert isinstance(rep, SyncReport) and rep.total == len(FOLDER)  # every entry, the .gitignore too
    with pytest.raises(IngestError, match="is not a folder"):
        idx.sync(folder / "a.txt")
