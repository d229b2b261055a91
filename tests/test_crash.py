"""The crasher, short and seeded: writers of flat and slim indexes SIGKILLed at random moments
during add, remove and compact; after every kill the index must open, pass `check` (SQLite and
FTS5 integrity, one vector per live chunk, no vector without its chunk), answer vector, keyword
and hybrid search, and converge to a clean run's state when the operation is re-run.
`make crash N=200` runs the long version (see `bench.crash`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench.crash import OPS, STORAGES, HashEmbedder, prepare, run_op, run_trials, signature, table
from slimrag.index.core import Index
from slimrag.index.store import manifest


def test_killed_writers_leave_a_sound_index_that_converges(tmp_path: Path) -> None:
    trials = run_trials(3, STORAGES, OPS, seed=12, workdir=tmp_path, log=False)
    assert len(trials) == 6 and sum(t.killed for t in trials) >= 4  # most delays land inside the op
    assert [t for t in trials if not t.ok] == []
    assert {(r["storage"], r["op"]) for r in table(trials)} == {(s, o) for s in STORAGES for o in OPS}
    assert all(t.state in ("before", "partial", "after") for t in trials)


def test_compaction_dying_after_its_switch_leaves_a_sound_index(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The few milliseconds after a compaction's manifest switch (tombstones not yet cleared, old
    files not yet collected) are rarely hit by a random kill: die there on purpose."""
    for storage in STORAGES:
        path = prepare(tmp_path, storage)
        clean = tmp_path / f"clean-{storage}"
        shutil.copytree(path, clean)
        run_op(clean, "compact")
        with Index.open(path, embedder=HashEmbedder()) as idx:
            gen = idx.manifest["generation"]

            def die(*a: object, **k: object) -> None:
                raise KeyboardInterrupt

            monkeypatch.setattr(idx.catalog, "clear_tombstones", die)
            with pytest.raises(KeyboardInterrupt):
                idx.compact()
            monkeypatch.undo()
        assert manifest.read(path).generation > gen  # switched, then died
        with Index.open(path, embedder=HashEmbedder()) as idx:
            rep = idx.check()
            assert rep.ok and idx.catalog.counts()["tombstones"] == 10, rep.problems()
            assert (path / f"gen-{gen:06d}").is_dir()  # the old generation is still there: debris
        assert signature(path) == signature(clean)
        run_op(path, "compact")  # the next compaction clears both
        with Index.open(path, embedder=HashEmbedder()) as idx:
            assert idx.check().ok and idx.catalog.counts()["tombstones"] == 0
        assert not (path / f"gen-{gen:06d}").exists() and signature(path) == signature(clean)
