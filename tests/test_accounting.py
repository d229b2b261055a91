"""Every file accounted for (issue 13, part 1): a build's summary counts every file of a mixed folder
by outcome and skip reason, and each readable one (gzip, suffix-less, Latin-1 HTML and XML that
declare it, text with an unknown suffix) is searchable."""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import write_tree

from slimrag.cli import cli
from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.index.report import AddReport
from slimrag.ingest.outcome import (
    ADDED,
    BINARY,
    ENCODING,
    IGNORED,
    SKIP_REASONS,
    TOO_LARGE,
    UNSUPPORTED,
    SkipFile,
    Skipped,
    kind_of,
)
from slimrag.ingest.rawfile import declared_charset, gunzip_bounded, looks_like_text
from slimrag.ingest.readers import read_file

LATIN1_HTML = ('<html><head><meta http-equiv="Content-Type" content="text/html; charset=iso-8859-1">'
               "</head><body><h1>Cr\xe8me br\xfbl\xe9e</h1><p>Caramelise the sugar with a blowtorch.</p>"
               "</body></html>").encode("latin-1")

#: source → (query, a word of the passage that must come back)
READABLE = {
    "guide.md": ("moon tides ocean bulges", "bulges"),
    "README": ("planetarium projector switch", "projector"),
    "copyright": ("orchard cooperative copyright permission", "Orchard"),
    "docs/FAQ.gz": ("why is the sky blue scattering", "Rayleigh"),
    "docs/manual.html.gz": ("telescope eyepiece focus knob", "eyepiece"),
    "latin1.html": ("caramelise sugar blowtorch", "Crème"),
    "feed.xml": ("greetings from the glacier hut", "Grüße"),
    "notes.org": ("queen bee eggs per day", "queen"),
}
#: source → skip reason
SKIPPED = {
    ".gitignore": IGNORED, "scratch.tmp": IGNORED, "photo.png": UNSUPPORTED, "report.xlsx": UNSUPPORTED,
    "blob.xyz": UNSUPPORTED, "bad.txt": ENCODING,
}


def write_mixed_folder(root: Path) -> Path:
    """Fourteen files: the eight of `READABLE` and the six of `SKIPPED`."""
    return write_tree(root, {
        "guide.md": "# Tides\n\nThe moon pulls the oceans into two bulges, so most coasts see two tides a day.\n",
        "README": "Start the planetarium projector with the blue switch behind the dome.\n",
        "copyright": "Copyright 2024 The Orchard Cooperative.\nPermission is granted to copy this guide.\n",
        "docs/FAQ.gz": gzip.compress(b"Q: Why is the sky blue?\nA: Rayleigh scattering of sunlight by air.\n"),
        "docs/manual.html.gz": gzip.compress(b"<html><body><h1>Focusing</h1><p>Turn the eyepiece focus knob "
                                             b"of the telescope slowly.</p></body></html>"),
        "latin1.html": LATIN1_HTML,
        "feed.xml": '<?xml version="1.0" encoding="ISO-8859-1"?>\n<note>Gr\xfc\xdfe from the glacier hut, '
                    "where greetings are written in the book.</note>\n".encode("latin-1"),
        "notes.org": "* Beekeeping\nA healthy queen bee lays up to two thousand eggs per day.\n",
        ".gitignore": "*.tmp\n",
        "scratch.tmp": "temporary",
        "photo.png": b"\x89PNG\r\n\x1a\n" + bytes(64),
        "report.xlsx": b"PK\x03\x04\x14\x00\x06\x00" + bytes(64),
        "blob.xyz": bytes(range(256)),
        "bad.txt": "na\xefve caf\xe9, no charset declared".encode("latin-1"),
    })


def test_mixed_folder_every_file_counted_and_readable_ones_found(tmp_path: Path, embedder: LocalEmbedder,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    root = write_mixed_folder(tmp_path / "mixed")
    n_files = sum(1 for p in root.rglob("*") if p.is_file())
    with caplog.at_level(logging.WARNING, logger="slimrag"):
        idx = Index.build(root, tmp_path / "m.slimrag", embedder=embedder)
    rep = idx.last_report
    assert rep.total == n_files == len(READABLE) + len(SKIPPED)
    assert rep.added == len(READABLE) and (rep.updated, rep.unchanged) == (0, 0)
    assert {s.source: s.kind for s in rep.skipped} == SKIPPED
    assert rep.skipped_by_reason() == {UNSUPPORTED: 3, ENCODING: 1, IGNORED: 2}
    assert rep.summary().startswith(f"8 added, 0 updated, 0 unchanged, {rep.chunks} chunks, "
                                    "6 skipped (3 unsupported type, 1 encoding, 2 ignored) in ")
    # only the file that looked readable and was not warns; ignored and unsupported are counted
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        "skipped bad.txt: encoding: not valid UTF-8 (byte 2) and no charset declared; convert it to UTF-8 "
        "to include it"]
    assert sorted(d.source for d in idx.documents()) == sorted(READABLE)
    for source, (query, word) in READABLE.items():
        hits = idx.search(query, k=3, mode="hybrid")
        assert any(h.source == source and word in h.text for h in hits), (source, [h.source for h in hits])

    again = idx.add(root)
    assert (again.added, again.updated, again.unchanged, again.total) == (0, 0, len(READABLE), n_files)


def test_cli_lists_the_files_behind_each_count(tmp_path: Path) -> None:
    root = write_mixed_folder(tmp_path / "mixed")
    out = str(tmp_path / "c.slimrag")
    runner = CliRunner()
    r = runner.invoke(cli, ["build", str(root), "-o", out])
    assert r.exit_code == 0, r.output
    assert "8 added, 0 updated, 0 unchanged" in r.output and "6 skipped (3 unsupported type" in r.output
    assert "photo.png" not in r.output  # counted, listed only on request

    r = runner.invoke(cli, ["-v", "add", out, str(root)])
    assert r.exit_code == 0, r.output
    listing = r.output[r.output.index("0 added, 0 updated, 8 unchanged"):]
    for reason, names in {"unsupported type": ["photo.png", "report.xlsx", "blob.xyz"], "encoding": ["bad.txt"],
                          "ignored": [".gitignore", "scratch.tmp"]}.items():
        block = listing[listing.index(f"  {reason} ({len(names)}):"):]
        assert all(f"    {n}\n" in block for n in names), (reason, listing)

    r = runner.invoke(cli, ["add", out, str(root), "--json"])
    rep = json.loads(r.output.strip().splitlines()[-1])
    assert rep["unchanged"] == 8 and rep["skipped_by_reason"] == {UNSUPPORTED: 3, ENCODING: 1, IGNORED: 2}
    assert sorted(rep["files"][UNSUPPORTED]) == ["blob.xyz", "photo.png", "report.xlsx"]
    assert {s["source"]: s["kind"] for s in rep["skipped"]} == SKIPPED


def test_declared_charsets_are_honoured_and_utf8_comes_first(tmp_path: Path) -> None:
    (tmp_path / "p.html").write_bytes(LATIN1_HTML)
    assert read_file(tmp_path / "p.html")[0].heading == "Crème brûlée"
    assert declared_charset(b'<meta charset="windows-1252">') == "cp1252"
    assert declared_charset(b"<?xml version='1.0' encoding='latin-1'?>") == "iso8859-1"
    assert declared_charset(b"# -*- coding: latin-1 -*-\nx = 1\n") == "iso8859-1"
    assert declared_charset(b'<meta charset="zlib">') is None  # not a text encoding
    assert declared_charset(b"no declaration") is None
    # a page that declares Latin-1 but is UTF-8 (a common mislabel) reads as UTF-8
    (tmp_path / "m.html").write_bytes('<meta charset="iso-8859-1"><p>café</p>'.encode())
    assert "café" in read_file(tmp_path / "m.html")[0].text
    # a declared charset the bytes do not fit is an encoding skip, not a crash
    (tmp_path / "x.xml").write_bytes(b'<?xml version="1.0" encoding="ascii"?><a>\xff</a>')
    with pytest.raises(SkipFile, match="encoding: ") as e:
        read_file(tmp_path / "x.xml")
    assert e.value.kind == ENCODING


def test_text_sniffing_and_suffixless_names(tmp_path: Path) -> None:
    assert looks_like_text("plain words, déjà vu".encode())
    assert looks_like_text("é".encode()[:1])  # a character cut at the end of the sniffed bytes is allowed
    assert looks_like_text(("x" * 8191 + "é").encode())  # cut at the 8 KB boundary
    assert not looks_like_text(b"\x7fELF\x00\x00")
    assert not looks_like_text(bytes(range(128, 256)))
    write_tree(tmp_path, {"ChangeLog": "2024-01-01  fixed the kettle", "Makefile": "all:\n\techo hi\n",
                          "LICENSE": "MIT", "notes.weird": "some text", "x.bin": "text, but a binary suffix"})
    for name in ("ChangeLog", "Makefile", "LICENSE", "notes.weird"):
        assert read_file(tmp_path / name)[0].text.strip(), name
    with pytest.raises(SkipFile) as e:
        read_file(tmp_path / "x.bin")
    assert e.value.kind == UNSUPPORTED
    (tmp_path / "README").write_bytes(b"\x00\x01binary readme")
    with pytest.raises(SkipFile) as e:
        read_file(tmp_path / "README")
    assert e.value.kind == BINARY  # a name that promises text warns when it is not


def test_gzip_is_bounded_and_multi_member() -> None:
    two = gzip.compress(b"first member. ") + gzip.compress(b"second member.")
    assert gunzip_bounded(two, 1000) == b"first member. second member."
    with pytest.raises(SkipFile) as e:
        gunzip_bounded(gzip.compress(bytes(5 * 2**20)), 2**20)
    assert e.value.kind == TOO_LARGE
    with pytest.raises(SkipFile, match="truncated"):
        gunzip_bounded(gzip.compress(b"some text to cut short" * 50)[:-30], 2**20)


def test_report_counts_and_reasons(caplog: pytest.LogCaptureFixture) -> None:
    rep = AddReport()
    with caplog.at_level(logging.INFO, logger="slimrag"):
        rep.skip("a.png", "unsupported type: no reader for '.png' files")
        rep.skip("b.txt", "no text")  # the writer's message: the reason alone
        rep.skip("c.pdf", "something a reader said")  # a message of unknown form counts as a parse error
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "skipped a.png: unsupported type: no reader for '.png' files"),
        (logging.WARNING, "skipped b.txt: no text"), (logging.WARNING, "skipped c.pdf: something a reader said")]
    rep.note(ADDED, "d.md")
    assert rep.added == 1 and rep.total == 4
    assert rep.listing() == {ADDED: ["d.md"], UNSUPPORTED: ["a.png"], "no text": ["b.txt"], "parse error": ["c.pdf"]}
    with pytest.raises(ValueError, match="outcome"):
        rep.note("exploded", "e.md")
    assert all(kind_of(Skipped.because("s", k, "detail").reason) == k for k in SKIP_REASONS)
