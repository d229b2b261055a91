"""``slimrag build --max-file-mb`` (a new user's report: the too-large warning named
``IndexConfig.max_file_bytes``, which no command line can set): the limit is a build flag, the
warning names it, and the index keeps it for a later ``add``; an ``add`` that skips every file
exits 1."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from click.testing import CliRunner

from slimrag.cli import cli

MIB = 1 << 20


def test_the_file_size_limit_is_a_build_flag_kept_by_the_index(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "small.md").write_text("Otters hold hands while they sleep.\n")
    big = "The lighthouse keeper trims the wick at dusk.\n" * (MIB // 46 + 1000)  # just over 1 MiB
    (folder / "big.md").write_text(big)
    runner = CliRunner()
    out = runner.invoke(cli, ["build", str(folder), "-o", str(tmp_path / "one.slimrag"), "--max-file-mb", "1"])
    assert out.exit_code == 0, out.output
    warned = [r.getMessage() for r in caplog.records if "big.md" in r.getMessage()]
    assert warned and "--max-file-mb" in warned[0]  # the warning names the flag
    caplog.clear()
    info = json.loads(runner.invoke(cli, ["info", str(tmp_path / "one.slimrag"), "--json"]).output)
    assert info["index"]["counts"]["documents"] == 1
    # the index keeps its limit: adding the same file later is skipped the same way
    later = runner.invoke(cli, ["add", str(tmp_path / "one.slimrag"), str(folder / "big.md")])
    assert "too large" in later.output and any("--max-file-mb" in r.getMessage() for r in caplog.records)
    small = tmp_path / "small"
    small.mkdir()
    (small / "small.md").write_text("Otters hold hands while they sleep.\n")
    two = runner.invoke(cli, ["build", str(small), "-o", str(tmp_path / "two.slimrag"), "--max-file-mb", "3"])
    assert two.exit_code == 0, two.output
    config = json.loads(runner.invoke(cli, ["info", str(tmp_path / "two.slimrag"), "--json"]).output)["index"]["config"]
    assert config["max_file_bytes"] == 3 * MIB
    bad = runner.invoke(cli, ["build", str(folder), "-o", str(tmp_path / "bad.slimrag"), "--max-file-mb", "0"])
    assert bad.exit_code == 2 and "--max-file-mb" in bad.output


def test_an_add_that_skips_every_file_exits_1(tmp_path: Path) -> None:
    """A new user's report: ``add INDEX binary.txt`` said "0 added ... 1 skipped" and exited 0."""
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.md").write_text("Otters hold hands while they sleep.\n")
    (tmp_path / "binary.txt").write_bytes(b"\x7fELF\x00\x00\x01" * 100)
    runner = CliRunner()
    assert runner.invoke(cli, ["build", str(folder), "-o", str(tmp_path / "i.slimrag")]).exit_code == 0
    skipped = runner.invoke(cli, ["add", str(tmp_path / "i.slimrag"), str(tmp_path / "binary.txt")])
    assert skipped.exit_code == 1 and "nothing was added" in skipped.output
    again = runner.invoke(cli, ["add", str(tmp_path / "i.slimrag"), str(folder / "a.md"), str(tmp_path / "binary.txt")])
    assert again.exit_code == 0, again.output  # one file unchanged: not every one skipped
