"""Readers, chunker and crawler on real files, including the bad ones a real folder holds."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import make_pdf, write_tree

from slimrag.embed.local import default_model_dir
from slimrag.errors import IngestError
from slimrag.ingest.chunker import Chunker, load_tokenizer
from slimrag.ingest.crawl import Skipped, crawl
from slimrag.ingest.outcome import IGNORED, NOT_PROSE, OUTSIDE, UNSUPPORTED
from slimrag.ingest.readers import read_file


def test_readers_extract_text_and_headings(docs_dir: Path) -> None:
    md = read_file(docs_dir / "guide/install.md")
    assert [s.heading for s in md] == ["Installing", "Windows"]
    rst = read_file(docs_dir / "notes/recipes.rst")
    assert [s.heading for s in rst] == ["Bread", "Soup"] and "lentils" in rst[1].text
    html = read_file(docs_dir / "site/index.html")
    assert html[0].heading == "Lighthouse" and "keeper" in html[0].text and "var x" not in html[0].text
    pdf = read_file(docs_dir / "papers/telescope.pdf")
    assert pdf[0].page == 1 and "Andromeda" in pdf[0].text
    js = read_file(docs_dir / "data/planets.json")
    assert "planets[0].note: the red planet has two moons" in js[0].text
    jl = read_file(docs_dir / "data/people.jsonl")
    assert len(jl) == 2 and "Turing" in jl[1].text


@pytest.mark.parametrize("name,data,reason", [
    ("bad.pdf", b"%PDF-1.4\n1 0 obj << /Type /Catalog >> garbage", "PDF"),
    ("blob.txt", b"\x00\x01\x02binary\x00" * 100, "binary"),
    ("latin1.md", "caf\xe9 cr\xe8me".encode("latin-1"), "UTF-8"),
    ("broken.json", b'{"a": [1, 2', "JSON"),
    ("list.ipynb", b"[1, 2]", "not a Jupyter notebook"),
    ("cells.ipynb", b'{"nbformat": 4}', "no 'cells'"),
    ("note.mbox", b"Dear diary,\nFrom today on I write every day.\n", "not an mbox"),
    ("nul.eml", b"Subject: x\n\n\x00\x01\x02", "binary"),
    ("wide.csv", b"a,b\n1," + b"x" * 200_000, "field larger than field limit"),
    ("empty.docx", b"", "corrupt Word document: not a readable zip"),
    ("old.pptx", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(504), "password-protected or in the old binary format"),
])
def test_bad_files_raise_ingest_error(tmp_path: Path, name: str, data: bytes, reason: str) -> None:
    p = tmp_path / name
    p.write_bytes(data)
    with pytest.raises(IngestError, match=reason):
        read_file(p)


def test_chunker_windows_overlap_and_exact_text() -> None:
    tok = load_tokenizer(str(default_model_dir()))
    from slimrag.ingest.readers import Section

    words = " ".join(f"word{i}" for i in range(400))
    chunks = Chunker(tok, size=64, overlap=16).chunk([Section("Long", words)])
    assert len(chunks) > 5
    assert all(c.metadata["tokens"] <= 64 for c in chunks)
    assert all(c.text in words for c in chunks)  # exact slices of the source text
    # consecutive windows overlap: the end of one reappears at the start of the next
    assert chunks[0].text.split()[-1] in chunks[1].text
    # short sections are merged up to the chunk size, keeping the first heading
    merged = Chunker(tok, size=64, overlap=16).chunk([Section("A", "alpha beta"), Section("B", "gamma delta")])
    assert len(merged) == 1 and merged[0].metadata["heading"] == "A" and "gamma" in merged[0].text


def test_crawl_skips_hidden_ignored_and_outside_symlinks(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "root", {
        "a.md": "a", "sub/b.txt": "b", ".hidden/c.txt": "c", ".secret.txt": "s",
        "build/out.txt": "o", "sub/skip.log": "l", "sub/keep.log": "k", "image.png": "x",
        ".gitignore": "build/\n*.log\n!keep.log\n",
    })
    outside = write_tree(tmp_path / "outside", {"private.txt": "p"})
    os.symlink(outside / "private.txt", root / "link.txt")
    os.symlink(outside, root / "linkdir")
    os.symlink(root / "sub", root / "inner")  # inside the root: not descended, sub/ is read once
    skipped: list[Skipped] = []
    found = [f.source for f in crawl(root, skipped=skipped)]
    assert found == ["a.md", "sub/b.txt", "sub/keep.log"]  # inner/ is sub/ again: indexed once
    # every other entry is accounted for, with its reason; an ignored folder counts once
    assert {s.source: s.kind for s in skipped} == {
        ".gitignore": IGNORED, ".hidden/": IGNORED, ".secret.txt": IGNORED, "build/": IGNORED,
        "sub/skip.log": IGNORED, "inner/": IGNORED, "image.png": UNSUPPORTED,
        "link.txt": OUTSIDE, "linkdir": OUTSIDE}


def test_crawl_never_reads_a_hidden_file_through_a_visible_link(tmp_path: Path) -> None:
    """``notes.md -> .env`` inside the root: the link's visible name must not carry the hidden
    file's text into the index (the hidden rule holds for what is read, not only for names)."""
    root = write_tree(tmp_path / "root", {"a.md": "a", ".env": "TOKEN=1", ".keys/id": "key"})
    os.symlink(root / ".env", root / "notes.md")
    os.mkdir(root / "sub")
    os.symlink(root / ".keys" / "id", root / "sub" / "peek.txt")
    skipped: list[Skipped] = []
    assert [f.source for f in crawl(root, skipped=skipped)] == ["a.md"]
    kinds = {s.source: (s.kind, s.reason) for s in skipped}
    assert kinds["notes.md"] == (IGNORED, "ignored: link to a hidden file or folder")
    assert kinds["sub/peek.txt"] == (IGNORED, "ignored: link to a hidden file or folder")


def test_crawl_skips_huge_file_without_reading_it(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "r", {"ok.txt": "fine"})
    with open(root / "huge.txt", "wb") as f:
        f.truncate(200 * 2**20)  # sparse: 200 MB on paper, nothing written
    skipped: list[Skipped] = []
    assert [f.source for f in crawl(root, max_bytes=20 * 2**20, skipped=skipped)] == ["ok.txt"]
    assert skipped[0].source == "huge.txt" and "MiB" in skipped[0].reason


def test_make_pdf_is_valid() -> None:
    from io import BytesIO

    from pypdf import PdfReader

    assert "hello" in PdfReader(BytesIO(make_pdf("hello"))).pages[0].extract_text()


#: A manual's folder as a web server holds it: pages, and the files that dress them.
SITE = {
    "index.html": "<html><body><h1>Manual</h1><p>The manual of the harbour light.</p></body></html>",
    "notes.md": "# Notes\n\nThe lamp is lit at dusk.\n",
    "app.js": "function light() { return 'lit'; }\n",
    "stylesheet.css": "body { color: #222; }\n",
    "theme/print.scss": "$ink: #000;\n",
    "figures/lens.svg": '<svg xmlns="http://www.w3.org/2000/svg"><text>lens</text></svg>',
    "app.min.js": "var a=1;",
    "app.js.map": '{"version": 3, "mappings": "AAAA"}',
    "site.min.css": "a{b:c}",
    "yarn.lock": "# yarn lockfile v1\n",
    "Cargo.lock": "[[package]]\n",
    "package-lock.json": '{"lockfileVersion": 3}',
    "go.sum": "example.org/x v1.0.0 h1:abc=\n",
}
NOT_PROSE_FILES = sorted(set(SITE) - {"index.html", "notes.md", "app.js"})


def test_crawl_counts_stylesheets_svg_maps_and_lock_files_as_not_prose(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "site", SITE)
    skipped: list[Skipped] = []
    found = sorted(f.source for f in crawl(root, skipped=skipped))
    assert found == ["app.js", "index.html", "notes.md"]
    assert sorted(s.source for s in skipped if s.kind == NOT_PROSE) == NOT_PROSE_FILES
    assert all(s.quiet for s in skipped)  # counted and listed with --verbose, no warning line each
    # named directly, a file is read whatever its kind
    assert [f.source for f in crawl(root / "stylesheet.css")] == ["stylesheet.css"]


def test_a_negated_pattern_includes_non_prose_files_again(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "site", {**SITE, ".slimragignore": "!*.svg\n"})
    skipped: list[Skipped] = []
    found = {f.source for f in crawl(root, skipped=skipped)}
    assert "figures/lens.svg" in found and "stylesheet.css" not in found
    found = {f.source for f in crawl(root, ignore=("!*.css", "!*.lock"), skipped=[])}  # --ignore '!*.css'
    assert {"stylesheet.css", "site.min.css", "yarn.lock", "Cargo.lock"} <= found and "app.js.map" not in found


def test_the_build_report_counts_not_prose(tmp_path: Path, embedder) -> None:  # noqa: ANN001
    from slimrag.index.core import Index

    root = write_tree(tmp_path / "site", SITE)
    with Index.build(root, tmp_path / "s.slimrag", embedder=embedder) as idx:
        rep = idx.last_report.to_dict()
        assert sorted(d.source for d in idx.documents()) == ["app.js", "index.html", "notes.md"]
    assert rep["skipped_by_reason"][NOT_PROSE] == len(NOT_PROSE_FILES)
    assert f"{len(NOT_PROSE_FILES)} not prose" in idx.last_report.summary()
