"""The crasher, short and seeded: writers of flat and slim indexes SIGKILLed at random moments
during add, remove and compact; after every kill the index must open, pass `check` (SQLite and
FTS5 integrity, one vector per live chunk, no vector without its chunk), answer vector, keyword
and hybrid search, and converge to a clean run's state when the operation is re-run.
`make crash N=200` runs the long version (see `bench.crash`)."""

from __future__ import annotations

from pathlib import Path

from bench.crash import OPS, STORAGES, run_trials, table


def test_killed_writers_leave_a_sound_index_that_converges(tmp_path: Path) -> None:
    trials = run_trials(3, STORAGES, OPS, seed=12, workdir=tmp_path, log=False)
    assert len(trials) == 6 and sum(t.killed for t in trials) >= 4  # most delays land inside the op
    assert [t for t in trials if not t.ok] == []
    assert {(r["storage"], r["op"]) for r in table(trials)} == {(s, o) for s in STORAGES for o in OPS}
    assert all(t.state in ("before", "partial", "after") for t in trials)
