"""Questions before the last vector (issue 30, item 2): a build stores every file's text first, so
keyword search and evidence answers work while the vectors fill in; chunks awaiting vectors are a
state (`check` counts them, not a problem), hybrid search says what it covered, and an interrupted
build (an exception in the embedder, a real SIGKILLed child process) leaves an index that answers
and that the next write finishes, with vectors equal to a clean build's.

The embedder is bench.crash's `HashEmbedder` (deterministic character trigrams: the same text
always gives the same vector, whatever the batch), real SQLite and real files in tmp_path."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bench.crash import SLIM, HashEmbedder, docs
from slimrag.cli import cli
from slimrag.config import IndexConfig
from slimrag.index import writer
from slimrag.index.core import Index
from slimrag.index.progress import AddProgress, reporting
from slimrag.index.store import manifest
from slimrag.rag.evidence import evidence_answer

ROOT = Path(__file__).resolve().parent.parent
DOCS = docs("doc", 120, 7)  # 120 short documents, each with a word of its own (uniqN docN)


def vectors_by_chunk(idx: Index) -> dict[tuple[str, int], np.ndarray]:
    """(source, ordinal) -> stored vector of every live chunk: comparable across builds whose
    chunk ids differ."""
    ids, vecs = idx.vectors.live_vectors()
    chunks = idx.catalog.chunks(ids)
    return {(chunks[int(i)].source, chunks[int(i)].ordinal): v for i, v in zip(ids, vecs, strict=True)}


@pytest.fixture()
def small_commits(monkeypatch: pytest.MonkeyPatch) -> None:
    """16 chunks per transaction and per embedded part: a 120-document build takes many of each."""
    monkeypatch.setattr(writer, "COMMIT_CHUNKS", 16)
    monkeypatch.setattr(writer, "EMBED_PART_CHUNKS", 16)


class FailingEmbedder(HashEmbedder):
    """`HashEmbedder` that raises KeyboardInterrupt (a Ctrl-C) at its ``fail_at``-th batch."""

    def __init__(self, fail_at: int) -> None:
        self.calls, self.fail_at = 0, fail_at

    def embed_batch(self, texts):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls == self.fail_at:
            raise KeyboardInterrupt
        return super().embed_batch(texts)


def test_text_is_answerable_before_the_first_vector(tmp_path: Path, small_commits: None) -> None:
    out = tmp_path / "p.slimrag"
    seen: dict[str, object] = {}

    def probe(p: AddProgress) -> None:
        # the first snapshot of the embedding phase: every file read and stored, nothing embedded
        if p.chunks_to_embed is None or "hits" in seen:
            return
        seen["progress"] = p
        with Index.open(out, embedder=HashEmbedder()) as reader:  # reads take no lock
            seen["keyword"] = reader.search("uniq117", k=3, mode="keyword")
            seen["hybrid"] = reader.search("uniq117 doc117", k=3)
            seen["coverage"] = reader._query.last_coverage
            seen["info"] = reader.stats()["coverage"]
            seen["answer"] = evidence_answer(reader, "uniq117 doc117", k=3)
            seen["hits"] = True

    with reporting(probe):
        idx = Index.build(DOCS, out, embedder=HashEmbedder())
    p = seen["progress"]
    assert isinstance(p, AddProgress)
    assert p.chunks_done == 0 and p.chunks_stored == p.chunks_to_embed == idx.last_report.chunks == 120
    assert [h.source for h in seen["keyword"]][:1] == ["doc/117.txt"]  # type: ignore[attr-defined]
    assert [h.source for h in seen["hybrid"]][:1] == ["doc/117.txt"]  # type: ignore[attr-defined]
    cov = seen["coverage"]
    assert (cov.chunks, cov.embedded) == (120, 0) and 0 < cov.filled <= 8  # type: ignore[attr-defined]
    assert seen["info"] == {"chunks": 120, "embedded": 0, "awaiting": 120, "filled": 0, "share": 0.0}
    answer = seen["answer"]
    assert not answer.abstained and "doc/117.txt#0" in answer.used  # type: ignore[attr-defined]
    # the build went on to embed everything and compact
    rep = idx.last_report
    assert rep.embedded == 120 and rep.searchable_s is not None and rep.searchable_s < rep.seconds
    assert idx.check().ok and idx.stats()["coverage"]["share"] == 1.0
    assert idx.manifest.delta_parts == () and len(idx.vectors) == 120
    idx.search("uniq3", k=1)
    assert idx._query.last_coverage.complete and idx._query.last_coverage.filled == 0
    idx.close()


@pytest.mark.parametrize("storage", ["flat", "slim"])
def test_interrupted_build_answers_and_the_next_add_finishes(tmp_path: Path, small_commits: None,
                                                             storage: str) -> None:
    clean = Index.build(DOCS, tmp_path / "clean", embedder=HashEmbedder(), storage=storage, slim=SLIM)
    want = vectors_by_chunk(clean)
    clean.close()

    out = tmp_path / "cut"
    # Ctrl-C in the embedder's 4th batch: all text stored, 3 parts of 16 vectors committed (the batch
    # of 16 chunks is one embedder call at embed_batch 64)
    with pytest.raises(KeyboardInterrupt):
        Index.build(DOCS, out, embedder=FailingEmbedder(fail_at=4), storage=storage, slim=SLIM)
    with Index.open(out, embedder=HashEmbedder()) as idx:
        rep = idx.check()
        assert rep.ok and rep.chunks == 120 and rep.awaiting == 120 - 48, rep.problems()
        assert idx.stats()["coverage"] == {"chunks": 120, "embedded": 48, "awaiting": 72, "filled": 0, "share": 0.4}
        assert idx.search("uniq110", k=1, mode="keyword")[0].source == "doc/110.txt"
        assert idx.search("uniq110 doc110", k=1)[0].source == "doc/110.txt"  # awaiting: filled by the search
        assert idx.search("uniq5 doc5", k=1)[0].source == "doc/005.txt"  # embedded before the interrupt
        assert idx._query.last_coverage.embedded == 48

    r = CliRunner().invoke(cli, ["check", str(out), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["awaiting"] == 72
    r = CliRunner().invoke(cli, ["check", str(out)])
    assert r.exit_code == 0 and "72 chunk(s) awaiting vectors" in r.output and r.output.rstrip().endswith("ok")

    with Index.open(out, embedder=HashEmbedder()) as idx:
        again = idx.add(DOCS)  # every file unchanged: nothing read again, the 72 chunks embedded
        assert (again.unchanged, again.chunks, again.embedded) == (120, 0, 72)
        idx.compact()
        assert idx.check().ok and idx.check().awaiting == 0
        got = vectors_by_chunk(idx)
    assert got.keys() == want.keys()
    for key, vec in want.items():
        np.testing.assert_allclose(got[key], vec, rtol=0, atol=1e-6 if storage == "flat" else 1e-5)


def test_check_repair_embeds_chunks_awaiting_vectors(tmp_path: Path, small_commits: None) -> None:
    out = tmp_path / "r"
    with pytest.raises(KeyboardInterrupt):
        Index.build(DOCS, out, embedder=FailingEmbedder(fail_at=2))
    with Index.open(out, embedder=HashEmbedder()) as idx:
        fixed = idx.check(repair=True)
        assert fixed.ok and fixed.awaiting == 120 - 16
        assert fixed.repair is not None and fixed.repair.reembedded == 104 and fixed.repair.after.awaiting == 0


def test_a_small_write_is_all_or_nothing(tmp_path: Path) -> None:
    """At most one embedder batch: embedded before its only commit, so an interrupted one leaves nothing."""
    idx = Index.build(DOCS[:3], tmp_path / "s", embedder=HashEmbedder(), config=IndexConfig(embed_batch=8))
    idx.state.embedder = FailingEmbedder(fail_at=1)
    with pytest.raises(KeyboardInterrupt):
        idx.add(DOCS[3:6])
    assert len(idx.documents()) == 3 and idx.check().awaiting == 0
    idx.state.embedder = HashEmbedder()
    assert idx.add(DOCS[3:12]).embedded == 9 and len(idx.manifest.delta_parts) == 1  # 9 > 8: text, then vectors
    assert idx.check().awaiting == 0
    idx.close()


# -- a real process killed mid-embedding --------------------------------------------------------
CHILD = """
import sys, time
sys.path.insert(0, {root!r})
from pathlib import Path
from bench.crash import HashEmbedder, docs
from slimrag.index import writer
from slimrag.index.core import Index

class Slow(HashEmbedder):
    def embed_batch(self, texts):
        time.sleep(0.15)
        return super().embed_batch(texts)

writer.COMMIT_CHUNKS = writer.EMBED_PART_CHUNKS = 16
Index.build(docs("doc", 120, 7), Path({out!r}), embedder=Slow())
print("finished", flush=True)
"""


def test_sigkill_mid_embedding_leaves_an_index_that_answers_and_resumes(tmp_path: Path) -> None:
    clean = Index.build(DOCS, tmp_path / "clean", embedder=HashEmbedder())
    want = vectors_by_chunk(clean)
    clean.close()
    out = tmp_path / "killed"
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(root=str(ROOT), out=str(out))],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    try:  # kill once two embedded parts are committed (of 8: 120 chunks, 16 a part)
        while time.monotonic() < deadline:
            if (out / manifest.MANIFEST).exists() and len(manifest.read(out).delta_parts) >= 2:
                break
            assert child.poll() is None, child.communicate()
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL

    with Index.open(out, embedder=HashEmbedder()) as idx:
        rep = idx.check()
        assert rep.ok and rep.chunks == 120 and 0 < rep.awaiting < 120, (rep.problems(), rep.awaiting)
        assert idx.search("uniq119", k=1, mode="keyword")[0].source == "doc/119.txt"
        assert idx.search("uniq119 doc119", k=1)[0].source == "doc/119.txt"
        answer = evidence_answer(idx, "uniq119 doc119", k=3)
        assert not answer.abstained and "doc/119.txt#0" in answer.used
        again = idx.add(DOCS)  # what `build --resume` runs: unchanged files skipped, the rest embedded
        assert again.unchanged == 120 and again.embedded == rep.awaiting
        idx.compact()
        assert idx.check().ok and idx.check().awaiting == 0
        got = vectors_by_chunk(idx)
    assert got.keys() == want.keys()
    for key, vec in want.items():
        np.testing.assert_allclose(got[key], vec, rtol=0, atol=1e-6)


def docs_folder(tmp_path: Path, n: int) -> Path:
    """The first ``n`` of `DOCS` written as files under ``tmp_path / "docs"``."""
    folder = tmp_path / "docs"
    for source, text in DOCS[:n]:
        (folder / source).parent.mkdir(parents=True, exist_ok=True)
        (folder / source).write_text(text)
    return folder


def test_sync_finishes_an_interrupted_build(tmp_path: Path, small_commits: None) -> None:
    folder = docs_folder(tmp_path, 40)
    out = tmp_path / "s.slimrag"
    with pytest.raises(KeyboardInterrupt):
        Index.build(folder, out, embedder=FailingEmbedder(fail_at=2))
    with Index.open(out, embedder=HashEmbedder()) as idx:
        assert idx.check().awaiting == 40 - 16
        rep = idx.sync(folder)
        assert (rep.unchanged, rep.read, rep.embedded) == (40, 0, 24)
        assert idx.check().awaiting == 0 and idx.search("uniq39 doc39", k=1)[0].source == "doc/039.txt"


def test_cli_build_resume_finishes_an_interrupted_build(tmp_path: Path, small_commits: None) -> None:
    folder = docs_folder(tmp_path, 40)
    out = tmp_path / "c.slimrag"
    with pytest.raises(KeyboardInterrupt):
        Index.build(folder, out, embedder=FailingEmbedder(fail_at=3))
    r = CliRunner().invoke(cli, ["info", str(out)])
    assert r.exit_code == 0 and "40 chunks, 32 live vectors, 80% embedded (8 awaiting vectors" in r.output, r.output
    r = CliRunner().invoke(cli, ["build", str(folder), "-o", str(out), "--json"])  # no --resume: refused
    assert r.exit_code == 2 and "--force" in r.output
    r = CliRunner().invoke(cli, ["build", str(folder), "-o", str(out), "--resume", "--json"])
    assert r.exit_code == 0, (r.output, r.exc_info)
    report = json.loads(r.stdout)
    assert (report["unchanged"], report["chunks"], report["embedded"]) == (40, 0, 8)
    with Index.open(out) as idx:  # the embedder from the manifest's record (bench.crash registers "hash")
        assert idx.coverage().complete and idx.manifest.delta_parts == () and idx.check().ok


def test_cli_search_says_what_vectors_covered(tmp_path: Path, small_commits: None) -> None:
    """A hybrid search of a partly embedded index: the hits on stdout (``--json`` keeps its list),
    and on stderr how many chunks the vectors covered and that keyword search covered the rest."""
    out = tmp_path / "p.slimrag"
    with pytest.raises(KeyboardInterrupt):
        Index.build(DOCS[:40], out, embedder=FailingEmbedder(fail_at=3))
    r = CliRunner().invoke(cli, ["search", str(out), "uniq35 doc35", "-k", "3", "--json"])
    assert r.exit_code == 0, (r.output, r.exc_info)
    assert json.loads(r.stdout)[0]["source"] == "doc/035.txt"
    cov = json.loads(r.stderr)["coverage"]
    assert (cov["chunks"], cov["embedded"], cov["awaiting"], cov["share"]) == (40, 32, 8, 0.8) and cov["filled"] >= 1
    r = CliRunner().invoke(cli, ["search", str(out), "uniq35 doc35"])
    assert r.exit_code == 0 and "vectors cover 32 of 40 chunks (80%" in r.stderr, r.output
    r = CliRunner().invoke(cli, ["search", str(out), "uniq35", "--mode", "keyword", "--json"])
    assert r.exit_code == 0 and r.stderr == ""  # keyword search: nothing to say about vectors
