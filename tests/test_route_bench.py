"""``bench.route``'s replicas have a start deadline (issue 31): a replica that exits, or that never
answers ``/healthz``, stops the bench with a message naming it and its log, instead of a hang."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.route import Replica, StartError


def test_a_replica_that_exits_names_its_status_and_log(tmp_path: Path) -> None:
    rep = Replica(tmp_path / "home")
    rep.start(index=tmp_path / "no-such.slimrag")
    with pytest.raises(StartError, match=r"(?s)exited with status [1-9].*serve\.log") as err:
        rep.wait(120)
    assert "no-such.slimrag" in str(err.value)  # the tail of its log: serve's own message


def test_a_replica_that_never_answers_is_killed_at_the_deadline(tmp_path: Path) -> None:
    rep = Replica(tmp_path / "home")
    rep.log.write_text("loading the model\n")
    rep.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # alive, never listening
    t0 = time.monotonic()
    with pytest.raises(StartError, match=r"(?s)did not answer /healthz within 1s .*loading the model"):
        rep.wait(1.0)
    assert time.monotonic() - t0 < 10
    assert rep.proc.poll() is not None  # killed, not left behind
