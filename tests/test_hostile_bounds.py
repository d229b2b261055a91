"""Files cost what they weigh (issue 27, item 5): each reader's output stays within its stated
multiple of its input (`slimrag.ingest.bounds`) on the amplification inputs of the issue, or the
file is skipped as too large, before the memory is spent; a zip of XML that would expand past its
bounds is refused from its central directory.

Inputs are real files of each format, written here (python-docx for Word, zipfile for the
bombs); memory is measured with `tracemalloc` where the old readers would have asked for
gigabytes.
"""

from __future__ import annotations

import io
import json
import os
import time
import tracemalloc
import zipfile
from pathlib import Path

import pytest
from conftest import pdf_with_content

from slimrag.index.state import embed_input
from slimrag.ingest import rawfile
from slimrag.ingest.bounds import (
    HEADER_NAME_CHARS,
    HEADING_CHARS,
    KEY_PATH_CHARS,
    SLACK_CHARS,
    TABLE_EXPANSION,
    output_chars,
)
from slimrag.ingest.chunker import Chunker, load_tokenizer
from slimrag.ingest.outcome import TOO_LARGE, SkipFile
from slimrag.ingest.readers import EXPANSION, TEXT_EXPANSION, read_file, reader_for

MIB = 2**20


def _within_multiple(path: Path) -> tuple[int, int, int]:
    """Read ``path`` and return (output characters, input bytes, the reader's multiple), asserting
    the bound of `slimrag.ingest.bounds`."""
    sections = read_file(path)
    size = path.stat().st_size
    reader = reader_for(path)
    assert reader is not None
    multiple = EXPANSION.get(reader, TEXT_EXPANSION)
    used = output_chars(sections)
    assert used <= multiple * size + SLACK_CHARS, (path.name, used, size, multiple)
    return used, size, multiple


def _peak_mib(fn: object) -> float:
    """Peak Python memory of calling ``fn`` (any exception it raises is re-raised after)."""
    tracemalloc.start()
    try:
        fn()  # type: ignore[operator]
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak / MIB


# -- JSON: a leaf carries its key path, cut to its last KEY_PATH_CHARS ------------------------------
def _deep_json(levels: int, key_chars: int, leaves: int) -> bytes:
    """``levels`` nested objects with keys of ``key_chars`` characters, over a list of ``leaves``
    zeros: the old reader wrote the whole path (``levels * key_chars``) before every zero."""
    inner = "[" + ",".join(["0"] * leaves) + "]"
    for i in range(levels):
        inner = json.dumps({f"{i:03d}" + "k" * (key_chars - 3): "x"})[:-1].replace('"x"', inner) + "}"
    return inner.encode()


def test_json_key_paths_are_cut_and_the_output_is_within_its_multiple(tmp_path: Path) -> None:
    p = tmp_path / "deep.json"
    p.write_bytes(_deep_json(levels=100, key_chars=10_000, leaves=5_000))  # a 1 MB path over 5,000 leaves
    used, size, multiple = _within_multiple(p)
    lines = read_file(p)[0].text.splitlines()
    assert len(lines) == 5_000
    assert all(len(line) <= KEY_PATH_CHARS + len(": 0") for line in lines)
    assert lines[0].startswith("…") and lines[0].endswith("[0]: 0") and lines[-1].endswith("[4999]: 0")
    assert used < 2 * size  # the old walk: 5,000 copies of a 1 MB path, 5 GB


def test_json_over_its_multiple_is_skipped_before_the_memory_is_spent(tmp_path: Path) -> None:
    """The issue's shape at scale: a 1 MB key path over 500,000 leaves (2 MB of input; 500 GB
    for the old reader). Cut paths still give 62 MB of lines, over 16x: skipped as too large,
    having built at most its bound."""
    p = tmp_path / "bomb.json"
    p.write_bytes(_deep_json(levels=100, key_chars=10_000, leaves=500_000))
    size = p.stat().st_size
    caught: list[SkipFile] = []

    def read() -> None:
        try:
            read_file(p)
        except SkipFile as e:
            caught.append(e)

    peak = _peak_mib(read)
    assert caught and caught[0].kind == TOO_LARGE and "16x" in str(caught[0]), caught
    # the bound (16 x 2 MB of characters, as 260,000 Python strings of 49 bytes of header each),
    # the decoded text and the parsed document: 88 MiB measured, against 500 GB asked for before
    assert peak < 64 * size / MIB, peak


# -- CSV: every cell repeats its column's name, cut to HEADER_NAME_CHARS ----------------------------
def test_a_wide_csv_of_long_names_is_within_its_multiple(tmp_path: Path) -> None:
    """20 column names of 100,000 characters over 1,000 rows of ones: the old reader wrote 2 GB."""
    p = tmp_path / "wide.csv"
    header = ",".join(f"c{i}" + "n" * 100_000 for i in range(20))
    p.write_text(header + "\n" + ("1," * 19 + "1\n") * 1000)
    used, size, _ = _within_multiple(p)
    first_row = read_file(p)[0].text.split("\n\n")[0].splitlines()
    assert len(first_row) == 20 and all(len(line) == HEADER_NAME_CHARS + len(": 1") for line in first_row)
    assert first_row[0].endswith("…: 1")
    assert used < size


def test_a_csv_over_its_multiple_is_skipped(tmp_path: Path) -> None:
    """Names at the cap over one-character cells: 34 characters written per 2 bytes, over 32x."""
    p = tmp_path / "survey.csv"
    names = [f"q{i:04d}" + "x" * (HEADER_NAME_CHARS - 5) for i in range(1000)]
    p.write_text(",".join(names) + "\n" + ("1," * 999 + "1\n") * 600)
    with pytest.raises(SkipFile, match=f"{TABLE_EXPANSION}x") as e:
        read_file(p)
    assert e.value.kind == TOO_LARGE


# -- headings: a long heading is cut in every chunk's metadata and embedding input ------------------
def test_a_long_heading_is_cut_in_every_chunk(tmp_path: Path) -> None:
    from slimrag.embed.local import default_model_dir

    p = tmp_path / "heading.md"
    heading = "Title " + "very " * 200_000  # a 1 MB heading line
    p.write_text(f"# {heading}\n\n" + "The orchard keeps forty beehives near the river. " * 4000)
    _within_multiple(p)
    chunks = Chunker(load_tokenizer(str(default_model_dir())), 200, 40).chunk(read_file(p))
    assert len(chunks) > 50
    for c in chunks:
        assert len(c.metadata["heading"]) <= HEADING_CHARS
        assert len(embed_input(c)) <= len(c.text) + HEADING_CHARS + 1
    assert chunks[-1].metadata["heading"].startswith("Title very") and chunks[-1].metadata["heading"].endswith("…")


# -- Word tables: a vertically merged cell is written once ------------------------------------------
def test_a_vertically_merged_word_cell_is_written_once(tmp_path: Path) -> None:
    """A cell of 100,000 characters merged down 300 rows: python-docx's ``row.cells`` gives it in
    every row (30 MB of text from a file of a few KB, and a recursion per row)."""
    from docx import Document

    doc = Document()
    table = doc.add_table(rows=300, cols=2)
    top = table.cell(0, 0).merge(table.cell(299, 0))
    top.text = "glacier " * 12_500
    for r in range(300):
        table.cell(r, 1).text = f"row {r}"
    p = tmp_path / "merged.docx"
    doc.save(str(p))
    used, size, _ = _within_multiple(p)
    text = read_file(p)[0].text
    assert text.count("glacier") == 12_500
    assert text.splitlines()[0].endswith("| row 0") and text.splitlines()[299] == "row 299"
    assert used < 200_000


# -- zips: XML bounded in proportion to the file, and per part --------------------------------------
def _zip(members: dict[str, bytes], stored: tuple[str, ...] = ()) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data, compress_type=zipfile.ZIP_STORED if name in stored else zipfile.ZIP_DEFLATED)
    return buf.getvalue()


@pytest.mark.parametrize("name", ["bomb.docx", "bomb.pptx", "bomb.epub"])
def test_a_zip_of_xml_past_100x_its_size_is_skipped(tmp_path: Path, name: str) -> None:
    """40 MiB of repeated XML deflates to about 40 KiB: a 1,000x ratio, refused from the central
    directory (the old guard admitted 256 MiB) in well under a second, nothing inflated."""
    data = _zip({"[Content_Types].xml": b"<Types/>", "word/document.xml": b"<w:p/>" * (40 * MIB // 6)})
    assert len(data) < 200_000
    p = tmp_path / name
    p.write_bytes(data)
    start = time.perf_counter()
    with pytest.raises(SkipFile, match="100x its size") as e:
        read_file(p)
    assert e.value.kind == TOO_LARGE and time.perf_counter() - start < 1.0


def test_one_xml_part_past_its_bound_is_skipped_even_within_the_ratio(tmp_path: Path) -> None:
    """A 33 MiB XML part beside 400 KiB of stored noise: within 100x the file, over the per-part
    bound of what an lxml tree is built from."""
    data = _zip({"word/document.xml": b"<w:p/>" * (33 * MIB // 6), "media/noise.bin": os.urandom(400 * 1024)},
                stored=("media/noise.bin",))
    total = 33 * MIB + 400 * 1024
    assert total <= rawfile.MAX_UNZIP_RATIO * len(data) + rawfile.UNZIP_SLACK_BYTES
    with pytest.raises(SkipFile, match="part word/document.xml .* per part") as e:
        rawfile.open_zip(data, "Word document")
    assert e.value.kind == TOO_LARGE


def test_real_office_templates_are_well_within_the_zip_bounds() -> None:
    """The documents python-docx and python-pptx start from (the measurements of the header)."""
    import docx
    import pptx

    for template in (Path(docx.__file__).parent / "templates" / "default.docx",
                     Path(pptx.__file__).parent / "templates" / "default.pptx"):
        data = template.read_bytes()
        with rawfile.open_zip(data, template.name) as z:
            members = z.infolist()
        total = sum(m.file_size for m in members)
        assert total <= 25 * len(data) and max(m.file_size for m in members) < MIB, template


# -- every reader: good files stay within their multiple --------------------------------------------
def test_every_reader_keeps_ordinary_files_within_its_multiple(tmp_path: Path) -> None:
    """One ordinary file per text format, among them the shapes that expand most legitimately (a
    TSV of short cells, JSON numbers under nested keys): each within its multiple."""
    files = {
        "a.md": "# Install\n\nRun make.\n\n## Windows\n\nUse WSL.\n" * 200,
        "a.rst": "Title\n=====\n\nBody text here.\n\n" * 200,
        "a.html": "<html><body><h1>Lamp</h1><p>The keeper lights the lamp.</p></body></html>" * 100,
        "a.txt": "plain words " * 1000,
        "a.json": json.dumps({"series": {"temperature_celsius": list(range(2000))}}),
        "a.jsonl": "\n".join(json.dumps({"name": f"n{i}", "v": i}) for i in range(500)),
        "a.tsv": "\t".join(f"column_{i}" for i in range(30)) + "\n" + ("\t".join("1" * 30) + "\n") * 300,
        "a.csv": "year,city,rainfall\n" + "1987,Oslo,4.2\n" * 1000,
        "a.ipynb": json.dumps({"nbformat": 4, "metadata": {}, "cells": [
            {"cell_type": "markdown", "source": "# Setup"}, *[{"cell_type": "code", "source": f"x = {i}"}
                                                            for i in range(300)]]}),
    }
    for name, text in files.items():
        p = tmp_path / name
        p.write_text(text)
        _within_multiple(p)


def test_an_epub_spine_repeating_one_chapter_reads_it_once(tmp_path: Path) -> None:
    """10,000 spine references to one chapter of 200 KB: a 300 KB book the old reader turned into
    2 GB of text."""
    body = "<p>" + "The narwhal surfaced beside the lighthouse. " * 4500 + "</p>"
    refs = "".join('<itemref idref="c"/>' for _ in range(10_000))
    opf = ('<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" version="3.0"><manifest>'
           '<item id="c" href="c.xhtml" media-type="application/xhtml+xml"/></manifest>'
           f"<spine>{refs}</spine></package>")
    container = ('<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:'
                 'container"><rootfiles><rootfile full-path="OEBPS/content.opf" '
                 'media-type="application/oebps-package+xml"/></rootfiles></container>')
    p = tmp_path / "spine.epub"
    p.write_bytes(_zip({"mimetype": b"application/epub+zip", "META-INF/container.xml": container.encode(),
                        "OEBPS/content.opf": opf.encode(),
                        "OEBPS/c.xhtml": f"<html><body><h1>Ice</h1>{body}</body></html>".encode()},
                       stored=("mimetype",)))
    used, size, _ = _within_multiple(p)
    assert sum(s.text.count("narwhal") for s in read_file(p)) == 4500
    assert used < 250_000


def test_a_pdf_whose_text_expands_past_100x_is_skipped(tmp_path: Path) -> None:
    """A page of 1.2 MB of text in a Flate stream of a few KB: over 100x the file, too large."""
    p = tmp_path / "bomb.pdf"
    page = b"BT /F1 12 Tf 72 720 Td " + (b"(" + b"a" * 200 + b") Tj ") * 6000 + b"ET"
    p.write_bytes(pdf_with_content(page, flate=True))
    assert p.stat().st_size < 10_000
    with pytest.raises(SkipFile, match="100x") as e:
        read_file(p)
    assert e.value.kind == TOO_LARGE
    ok = tmp_path / "ok.pdf"
    ok.write_bytes(pdf_with_content(b"BT /F1 12 Tf 72 720 Td (The glacier calved at noon.) Tj ET", flate=True))
    assert "glacier" in read_file(ok)[0].text
