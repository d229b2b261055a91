"""One progress display for a whole build/add (issue 13): files done of the total, chunks, rate and
ETA, not restarting at each commit transaction; log lines when stderr is not a terminal.

Real files in tmp_path, a real index, the real writer with its commit size shrunk to 2 chunks so
a small folder takes many transactions; the CLI through click's CliRunner (stderr not a terminal)
with a real OpenAI-compatible embeddings server on 127.0.0.1."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import write_tree
from openai_server import OpenAIServer

from slimrag.cli import cli
from slimrag.cli.progress import LOG_EVERY_S, Bar, LogLines, describe
from slimrag.config import IndexConfig
from slimrag.embed.remote import RemoteEmbedder
from slimrag.index import writer
from slimrag.index.core import Index
from slimrag.index.progress import AddProgress, reporting

WORDS = "river stone cloud engine violin garden copper lantern harbor orbit meadow signal".split()
LINE = re.compile(r"^(indexing|indexed): files (\d+)/(\d+) \(\d+%\), ([\d,]+) chunks")


def corpus(root: Path, n: int = 12) -> Path:
    """``n`` text files of two to three paragraphs (several chunks each at 16 tokens) and one file
    of an unsupported binary type, which the summary must count as skipped."""
    files: dict[str, str | bytes] = {
        f"{'a' if i % 2 else 'b'}/doc{i}.md": "\n\n".join(" ".join(WORDS[(i + j) % 12:] + WORDS[: (i + j) % 12])
                                                      for j in range(2 + i % 2))
        for i in range(n)}
    files["blob.bin"] = bytes(range(256)) * 8
    return write_tree(root, files)


@pytest.fixture()
def small_commits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Commit every 2 chunks (text, and embedded parts); returns the list the chunks of each text
    commit are appended to."""
    monkeypatch.setattr(writer, "COMMIT_CHUNKS", 2)
    monkeypatch.setattr(writer, "EMBED_PART_CHUNKS", 2)
    commits: list[int] = []
    real = writer.IndexWriter._store

    def counting(self, docs, next_id, report):  # type: ignore[no-untyped-def]
        commits.append(sum(len(cs) for _, _, cs, _ in docs))
        return real(self, docs, next_id, report)

    monkeypatch.setattr(writer.IndexWriter, "_store", counting)
    return commits


@pytest.fixture(scope="module")
def server():
    with OpenAIServer(dim=32) as srv:
        yield srv


def test_one_tracker_spans_every_commit(tmp_path: Path, server: OpenAIServer, small_commits: list[int]) -> None:
    root = corpus(tmp_path / "docs")
    seen: list[AddProgress] = []
    with reporting(seen.append):
        idx = Index.build(root, tmp_path / "i.slimrag", embedder=RemoteEmbedder(server.base_url, "test-model"),
                          config=IndexConfig(chunk_tokens=16, chunk_overlap=0))
    rep = idx.last_report
    assert len(small_commits) >= 5 and sum(small_commits) == rep.chunks
    totals = {p.files_total for p in seen}
    assert totals == {13} == {rep.total}, totals  # listed once, never reset by a commit
    for a, b in zip(seen, seen[1:], strict=False):
        assert b.files_done >= a.files_done and b.chunks_done >= a.chunks_done and b.elapsed >= a.elapsed
    last = seen[-1]
    assert last.final and sum(p.final for p in seen) == 1
    assert (last.files_done, last.chunks_done, last.chunks_expected) == (13, rep.chunks, rep.chunks)
    # chunks moved between file reads: the display advanced inside the run, not only at its end
    assert len({p.chunks_done for p in seen}) >= len(small_commits)

    # two adds in one block are one run: their totals add up
    more = corpus(tmp_path / "more", n=3)
    seen.clear()
    with reporting(seen.append):
        idx.add(root)
        idx.add(more)
    assert seen[-1].files_total == 13 + 4 and seen[-1].files_done == 17
    idx.close()


def test_cli_build_without_a_terminal_logs_lines(tmp_path: Path, server: OpenAIServer,
                                                 small_commits: list[int]) -> None:
    root = corpus(tmp_path / "docs")
    r = CliRunner().invoke(cli, ["build", str(root), "-o", str(tmp_path / "c.slimrag"), "--chunk-tokens", "16",
                                 "--chunk-overlap", "0", "--embedder-url", server.base_url, "--embedder-model",
                                 "test-model", "--json"])
    assert r.exit_code == 0, (r.output, r.exc_info)
    report = json.loads(r.stdout)
    lines = [m for line in r.stderr.splitlines() if (m := LINE.match(line))]
    assert len(lines) >= 4, r.stderr
    assert "\r" not in r.stderr  # plain lines, nothing redrawn
    assert {int(m[3]) for m in lines} == {13}  # one total for the whole run
    done = [int(m[2]) for m in lines]
    chunks = [int(m[4].replace(",", "")) for m in lines]
    assert done == sorted(done) and chunks == sorted(chunks)
    assert lines[-1][1] == "indexed" and done[-1] == 13 and chunks[-1] == report["chunks"]
    assert len(small_commits) >= 5

    # add: the same display, ended before the report (the output's last line is the JSON report)
    r = CliRunner().invoke(cli, ["add", str(tmp_path / "c.slimrag"), str(root), "--json"])
    assert r.exit_code == 0, (r.output, r.exc_info)
    assert json.loads(r.output.strip().splitlines()[-1])["unchanged"] == 12
    assert r.stderr.splitlines()[-1].startswith("indexed: files 13/13 (100%), 0 chunks")


def test_bar_redraws_one_line_and_ends_it() -> None:
    out = io.StringIO()
    clock = iter([0.0, 0.05, 1.0, 2.0, 3.0])
    bar = Bar(out, clock=lambda: next(clock))
    bar(AddProgress(0, 10, 0, 0, 0.0))
    bar(AddProgress(1, 10, 4, 0, 0.05, chunks_stored=4))  # within BAR_EVERY_S of the last draw: skipped
    # every file read and stored (40 chunks searchable), a quarter embedded
    bar(AddProgress(10, 10, 40, 10, 1.0, chunks_stored=40, chunks_to_embed=40, embed_elapsed=1.0))
    assert "\n" not in out.getvalue() and out.getvalue().count("\r") == 2
    assert ("[######++++++++++++++++++] files 10/10 (100%), 40 chunks searchable, 10/40 embedded, "
            "10.0 chunks/s, ETA 3s") in out.getvalue()
    bar(AddProgress(10, 10, 40, 40, 4.0, final=True, chunks_stored=40, chunks_to_embed=40, embed_elapsed=3.0))
    text = out.getvalue()
    assert text.endswith("\n") and text.count("\n") == 1
    assert "[########################] files 10/10 (100%), 40 chunks searchable, 40 embedded, 13.3 chunks/s, in 4s" \
        in text


def test_log_lines_every_tenth_or_every_interval() -> None:
    out = io.StringIO()
    now = [0.0]
    log = LogLines(out, clock=lambda: now[0])
    log(AddProgress(0, 100, 0, 0, 0.0))  # the first snapshot: a line at once
    log(AddProgress(5, 100, 10, 0, 1.0))  # under the next 10%, under 10 s: none
    now[0] = 2.0
    log(AddProgress(10, 100, 20, 5, 2.0))  # crossed 10%: a line
    now[0] = 2.0 + LOG_EVERY_S
    log(AddProgress(11, 100, 22, 20, now[0]))  # same tenth, but 10 s later: a line
    log(AddProgress(100, 100, 200, 200, 30.0, final=True))
    lines = out.getvalue().splitlines()
    assert [ln.split(",")[0] for ln in lines] == ["indexing: files 0/100 (0%)", "indexing: files 10/100 (10%)",
                                                  "indexing: files 11/100 (11%)", "indexed: files 100/100 (100%)"]
    assert lines[-1] == "indexed: " + describe(AddProgress(100, 100, 200, 200, 30.0, final=True))


def test_eta_from_the_chunks_per_file_so_far() -> None:
    p = AddProgress(files_done=5, files_total=10, chunks_seen=50, chunks_done=25, elapsed=5.0)
    assert (p.rate, p.chunks_expected, p.eta) == (5.0, 100, 15.0)
    # embedding announced (an earlier run's 30 leftovers with this run's 50): the rate counts from its start
    p = AddProgress(10, 10, 50, 40, 12.0, chunks_stored=50, chunks_to_embed=80, embed_elapsed=4.0)
    assert (p.rate, p.chunks_expected, p.eta, p.searchable_share, p.embedded_share) == (10.0, 80, 4.0, 0.625, 0.5)
    assert AddProgress(0, None, 0, 0, 1.0).eta is None  # nothing to estimate from yet


def test_an_estimated_chunk_total_is_marked_until_every_file_is_read() -> None:
    """A new user's report: "0/64,171 embedded" shrank to "0/9,411": the total is an estimate
    from the bytes read so far, and says so while files remain."""
    reading = describe(AddProgress(files_done=5, files_total=10, chunks_seen=50, chunks_done=25, elapsed=5.0))
    assert "25/~100 embedded" in reading
    done = describe(AddProgress(10, 10, 50, 40, 12.0, chunks_stored=50, chunks_to_embed=80, embed_elapsed=4.0))
    assert "40/80 embedded" in done and "~" not in done
    assert AddProgress(3, 3, 9, 9, 2.0, final=True).eta == 0.0
