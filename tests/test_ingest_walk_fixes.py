"""Fixes from a new user's walkthrough: Notepad's "Unicode" (UTF-16 with a byte-order mark) read
as text, a chunk size over the embedder's window warned about, whole sentences in parse errors,
and counts pluralised in the add/build/remove summaries."""

from __future__ import annotations

import codecs
import logging
from pathlib import Path

import pytest
from conftest import write_tree

from slimrag.errors import IngestError
from slimrag.index.core import Index
from slimrag.ingest.outcome import BINARY, counted
from slimrag.ingest.readers import read_file

#: text with CRLF line ends (what Notepad writes) and characters outside Latin-1 and the BMP
WIDE_TEXT = "Lighthouse log\r\nThe keeper wrote: fog at dawn, \u00e9t\u00e9 \u2014 \u6771\u4eac, \U0001f30a.\r\n"


def _stored(idx: Index, source: str) -> str:
    """The text of the one chunk stored for ``source``."""
    doc = next(d for d in idx.documents() if d.source == source)
    chunks = [c for c in idx.chunks(range(200)).values() if c.doc_id == doc.doc_id]
    assert len(chunks) == 1
    return chunks[0].text


def test_utf16_and_utf32_with_a_byte_order_mark_are_read_as_text(tmp_path: Path, embedder) -> None:  # noqa: ANN001
    root = write_tree(tmp_path / "docs", {
        "le.txt": codecs.BOM_UTF16_LE + WIDE_TEXT.replace("keeper", "lekeeper").encode("utf-16-le"),
        "be.txt": codecs.BOM_UTF16_BE + WIDE_TEXT.replace("keeper", "bekeeper").encode("utf-16-be"),
        "wide32.txt": codecs.BOM_UTF32_LE + WIDE_TEXT.replace("keeper", "widekeeper").encode("utf-32-le"),
        "NOTES": codecs.BOM_UTF16_LE + WIDE_TEXT.replace("keeper", "notekeeper").encode("utf-16-le"),  # no suffix
        "nobom.txt": WIDE_TEXT.encode("utf-16-le"),  # no mark: not guessed at
        "fake.txt": codecs.BOM_UTF16_LE + "x".encode("utf-16-le") + bytes(64),  # a mark, then NULs: binary
        "u8.txt": WIDE_TEXT.replace("keeper", "u8keeper").encode("utf-8"),  # what the others must match
    })
    with Index.build(root, tmp_path / "s.slimrag", embedder=embedder) as idx:
        report = idx.last_report
        assert sorted(d.source for d in idx.documents()) == ["NOTES", "be.txt", "le.txt", "u8.txt", "wide32.txt"]
        for source, word in [("le.txt", "lekeeper"), ("be.txt", "bekeeper"), ("wide32.txt", "widekeeper"),
                             ("NOTES", "notekeeper")]:
            expected = _stored(idx, "u8.txt").replace("u8keeper", word)
            assert "\u6771\u4eac, \U0001f30a" in expected and "\ufeff" not in _stored(idx, source)
            assert _stored(idx, source) == expected  # as the same text in UTF-8: the mark dropped
            hits = idx.search(word, k=1, mode="keyword")
            assert [h.source for h in hits] == [source] and hits[0].text == expected
    skipped = {s.source: s for s in report.skipped}
    assert skipped["nobom.txt"].kind == BINARY and skipped["nobom.txt"].reason == "binary: NUL bytes in the first 8 KB"
    assert skipped["fake.txt"].kind == BINARY and "NUL characters" in skipped["fake.txt"].reason


@pytest.mark.parametrize("name,data,message", [
    ("cut.json", b'{"a": "no end', "invalid JSON at line 1: Unterminated string starting at column 7"),
    ("gap.json", b'{"a": 1,\n  "b": }', "invalid JSON at line 2: Expecting value at column 8"),
    ("rows.jsonl", b'{"a": 1}\n{"a": "x\n', "invalid JSON on line 2: Unterminated string starting at column 7"),
])
def test_a_broken_json_file_is_skipped_with_a_whole_sentence(tmp_path: Path, name: str, data: bytes,
                                                              message: str) -> None:
    p = tmp_path / name
    p.write_bytes(data)
    with pytest.raises(IngestError) as caught:
        read_file(p)
    assert str(caught.value).endswith(message)


def test_counts_in_summaries_are_pluralised(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from slimrag.cli import cli
    from slimrag.index.report import AddReport

    assert [counted(n, "chunk") for n in (0, 1, 2)] == ["0 chunks", "1 chunk", "2 chunks"]
    assert counted(20_582, "chunk", ",") == "20,582 chunks"
    assert AddReport(added=1, chunks=1).summary().startswith("1 added, 0 updated, 0 unchanged, 1 chunk, 0 skipped")

    root = write_tree(tmp_path / "small", {"lamp.txt": "The keeper lit the lamp at dusk.\n"})
    out = tmp_path / "s.slimrag"
    runner = CliRunner()
    r = runner.invoke(cli, ["build", str(root), "-o", str(out)])
    assert r.exit_code == 0 and r.stdout.startswith("1 added, 0 updated, 0 unchanged, 1 chunk, 0 skipped"), r.output
    assert ", 1 chunk searchable, 1 embedded" in r.stderr.splitlines()[-1], r.stderr
    r = runner.invoke(cli, ["info", str(out)])
    assert r.exit_code == 0 and "  1 document, 1 chunk, 1 live vector, 100% embedded" in r.stdout, r.output
    r = runner.invoke(cli, ["remove", str(out), "lamp.txt"])
    assert r.exit_code == 0 and r.stdout == "removed 1 document (1 chunk)\n", r.output
    r = runner.invoke(cli, ["check", str(out)])
    assert r.exit_code == 0 and r.stdout.startswith(f"{out}: 0 chunks, 1 vector row (1 of removed chunks"), r.output


def test_chunks_over_the_embedders_window_warn_once_at_build(tmp_path: Path, embedder,  # noqa: ANN001
                                                             caplog: pytest.LogCaptureFixture) -> None:
    from openai_server import OpenAIServer

    from slimrag.config import IndexConfig
    from slimrag.embed.remote import RemoteEmbedder

    root = write_tree(tmp_path / "small", {"lamp.txt": "The keeper lit the lamp at dusk. " * 200})
    assert embedder.max_tokens == 256  # MiniLM's max_seq_length, read from its folder

    def window_warnings(config: IndexConfig, emb, out: str) -> list[str]:  # noqa: ANN001
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="slimrag"):
            Index.build(root, tmp_path / out, embedder=emb, config=config).close()
        return [r.getMessage() for r in caplog.records if "input window" in r.getMessage()]

    over = window_warnings(IndexConfig(chunk_tokens=100_000), embedder, "over.slimrag")
    assert over == ["chunk_tokens 100000 is over the 256-token input window of the embedder "
                    "sentence-transformers/all-MiniLM-L6-v2: only the first 256 tokens of each chunk (its heading "
                    "included) reach vector search, the rest is found by keyword search alone; use --chunk-tokens "
                    "256 or less (the default 200 leaves room for headings)"]
    assert window_warnings(IndexConfig(), embedder, "default.slimrag") == []
    assert window_warnings(IndexConfig(chunk_tokens=256), embedder, "edge.slimrag") == []
    with OpenAIServer(dim=64) as server:  # a remote window is not known here: no warning, no refusal
        remote = RemoteEmbedder(server.base_url, "test-model", dim=64, timeout=10)
        assert remote.max_tokens is None
        assert window_warnings(IndexConfig(chunk_tokens=100_000), remote, "remote.slimrag") == []


def test_the_summary_names_chunks_an_earlier_run_left_that_this_one_embedded() -> None:
    """A new user's report: a sync after an interrupted build embedded 8,384 waiting chunks for
    minutes and summed up "0 added, 0 updated, 0 unchanged, 0 chunks"."""
    from slimrag.index.report import AddReport

    left = AddReport(embedded=8384)
    assert "8,384 chunks left by an earlier run embedded" in left.summary()
    own = AddReport(added=1, chunks=3, embedded=3)  # its own chunks only: the line as before
    assert own.summary().startswith("1 added, 0 updated, 0 unchanged, 3 chunks, 0 skipped in ")
