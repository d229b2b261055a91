"""The document formats people have (issue 11): each file is written by its own library (python-docx,
python-pptx, pypdf, zipfile for EPUB, json in nbformat's shape, email/mailbox, csv), indexed by
`Index.build` with the real embedder, and found by a query for a phrase it holds. Corrupt zip-based
files are skipped with one warning each while the rest of the folder is indexed; a PDF citation
names the page its passage is on."""

from __future__ import annotations

import csv
import email.policy
import io
import json
import logging
import mailbox
import zipfile
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import make_pdf

from slimrag.cli import cli
from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.ingest import rawfile
from slimrag.ingest.outcome import PARSE_ERROR, TOO_LARGE, UNREADABLE, SkipFile
from slimrag.ingest.readers import read_file

CONTAINER = ('<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">'
             '<rootfiles><rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/>'
             "</rootfiles></container>")
OPF = ('<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" version="3.0" unique-identifier="id">'
       '<metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>Sea Stories</dc:title></metadata>'
       '<manifest><item id="c2" href="text/chapter%20two.xhtml" media-type="application/xhtml+xml"/>'
       '<item id="c1" href="text/one.xhtml" media-type="application/xhtml+xml"/>'
       '<item id="css" href="style.css" media-type="text/css"/></manifest>'
       '<spine><itemref idref="c1"/><itemref idref="c2"/></spine></package>')


def chapter(title: str, text: str) -> str:
    return (f'<?xml version="1.0" encoding="utf-8"?><html xmlns="http://www.w3.org/1999/xhtml"><head>'
            f"<title>{title}</title></head><body><h1>{title}</h1><p>{text}</p></body></html>")


def write_docx(p: Path) -> None:
    from docx import Document

    doc = Document()
    doc.add_paragraph("Field notes from the northern survey.")
    doc.add_heading("Expedition log", level=1)
    doc.add_paragraph("The zeppelin moored above Reykjavik harbour at dawn.")
    table = doc.add_table(rows=2, cols=3)
    table.cell(0, 0).text = "crew"
    table.cell(0, 1).merge(table.cell(0, 2)).text = "navigator Solveig"
    table.cell(1, 0).text = "fuel"
    doc.save(str(p))


def write_pptx(p: Path) -> None:
    from pptx import Presentation

    prs = Presentation()
    first = prs.slides.add_slide(prs.slide_layouts[1])
    first.shapes.title.text = "Quarterly goals"
    first.placeholders[1].text = "Grow the orchard cooperative."
    second = prs.slides.add_slide(prs.slide_layouts[1])
    second.shapes.title.text = "Mascot"
    second.placeholders[1].text = "The capybara mascot wears a bright yellow scarf."
    second.notes_slide.notes_text_frame.text = "Mention the mascot budget of forty crowns."
    prs.save(str(p))


def write_epub(p: Path) -> None:
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("mimetype", "application/epub+zip", compress_type=zipfile.ZIP_STORED)
        z.writestr("META-INF/container.xml", CONTAINER)
        # chapter two comes first in the zip: the spine, not the zip, gives the reading order
        z.writestr("OEBPS/text/chapter two.xhtml", chapter("The Lighthouse", "A narwhal surfaced beside "
                                                          "the lighthouse and the keeper rang the bell."))
        z.writestr("OEBPS/text/one.xhtml", chapter("Departure", "The schooner left Tromsø in a gale."))
        z.writestr("OEBPS/content.opf", OPF)
        z.writestr("OEBPS/style.css", "h1 { color: navy }")


def write_notebook(p: Path) -> None:
    def cell(kind: str, source: list[str], **extra: object) -> dict[str, object]:
        return {"cell_type": kind, "metadata": {}, "source": source, **extra}

    nb = {"nbformat": 4, "nbformat_minor": 5,
          "metadata": {"kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"},
                       "language_info": {"name": "python"}},
          "cells": [cell("markdown", ["# Orbital mechanics\n", "\n", "A Hohmann transfer between two circular orbits.\n"]),
                    cell("code", ["def hohmann_delta_v(r1, r2):\n", "    return r2 - r1\n"], execution_count=1,
                         outputs=[{"output_type": "stream", "name": "stdout", "text": ["quixotic sentinel output\n"]}]),
                    cell("raw", ["raw cell nbconvert directive"])]}
    p.write_text(json.dumps(nb, indent=1), encoding="utf-8")


def write_eml(p: Path) -> None:
    msg = EmailMessage()
    msg["Subject"] = "Greenhouse tomatoes"
    msg["From"] = "Ingrid <ingrid@example.org>"
    msg["To"] = "garden@example.org"
    msg["Date"] = "Tue, 03 Mar 2026 09:15:00 +0000"
    msg.set_content("The heirloom tomatoes ripened early thanks to the new greenhouse heater.\n")
    msg.add_alternative("<html><body><p>The <b>heirloom</b> tomatoes ripened early.</p></body></html>", subtype="html")
    msg.add_attachment(b"attachment secret: pelican invoice", maintype="application", subtype="octet-stream",
                       filename="invoice.bin")
    p.write_bytes(msg.as_bytes(policy=email.policy.SMTP))


def write_mbox(p: Path) -> None:
    box = mailbox.mbox(str(p))
    first = EmailMessage()
    first["Subject"], first["From"], first["Date"] = "Choir rehearsal", "olav@example.org", "Mon, 02 Mar 2026 18:00:00 +0000"
    first.set_content("Rehearsal moves to the chapel.\nFrom now on we meet on Thursdays.\n")  # escaped as >From
    second = EmailMessage()
    second["Subject"], second["From"] = "Ferry timetable", "harbour@example.org"
    second.set_content("<html><body><h2>Winter</h2><p>The ferry to Svalbard leaves at noon on Fridays.</p>"
                       "</body></html>", subtype="html")
    box.lock()
    box.add(first)
    box.add(second)
    box.flush()
    box.unlock()
    box.close()


def write_table(p: Path, delimiter: str, rows: list[list[str]]) -> None:
    with p.open("w", newline="", encoding="utf-8") as f:
        csv.writer(f, delimiter=delimiter).writerows(rows)


CITIES = [["city", "country", "rainfall_mm"]] + [[f"Town{i}", "Norway", str(700 + i)] for i in range(150)] + \
         [["Bergen", "Norway", "2250 (the rainiest, umbrellas everywhere)"]]
#: source → (keyword query, text the hit must hold)
FOUND = {
    "report.docx": ("zeppelin Reykjavik", "zeppelin moored above Reykjavik"),
    "deck.pptx": ("capybara mascot", "capybara mascot wears"),
    "book.epub": ("narwhal lighthouse", "narwhal surfaced"),
    "orbits.ipynb": ("hohmann_delta_v", "def hohmann_delta_v"),
    "tomatoes.eml": ("heirloom greenhouse", "heirloom tomatoes ripened early"),
    "club.mbox": ("ferry Svalbard", "ferry to Svalbard leaves at noon"),
    "rain.csv": ("umbrellas rainiest", "city: Bergen\ncountry: Norway\nrainfall_mm: 2250"),
    "semi.csv": ("walrus", "animal: walrus\nweight_kg: 1200"),
    "birds.tsv": ("puffin", 'bird: puffin\nnote: "clown of the sea"'),
}
CORRUPT = {"broken.docx": PARSE_ERROR, "broken.pptx": PARSE_ERROR, "broken.epub": PARSE_ERROR,
           "locked.docx": UNREADABLE}


@dataclass
class Built:
    """The index of every format, the folder it was built from, the warnings its build logged."""

    idx: Index
    docs: Path
    warnings: list[str]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Built:
    """One index of every format, the corrupt files beside them."""
    root = tmp_path_factory.mktemp("formats")
    docs = root / "docs"
    docs.mkdir()
    write_docx(docs / "report.docx")
    write_pptx(docs / "deck.pptx")
    write_epub(docs / "book.epub")
    write_notebook(docs / "orbits.ipynb")
    write_eml(docs / "tomatoes.eml")
    write_mbox(docs / "club.mbox")
    write_table(docs / "rain.csv", ",", CITIES)
    write_table(docs / "semi.csv", ";", [["animal", "weight_kg"], ["walrus", "1200"], ["seal", "90"]])
    write_table(docs / "birds.tsv", "\t", [["bird", "note"], ["puffin", '"clown of the sea"'], ["gull", "loud"]])
    good = (docs / "report.docx").read_bytes()
    (docs / "broken.docx").write_bytes(good[: len(good) // 2])  # truncated: no central directory
    (docs / "broken.pptx").write_bytes(_zip({"hello.txt": "a zip, but not a presentation"}))
    (docs / "broken.epub").write_bytes(_zip({"mimetype": "application/epub+zip", "OEBPS/a.xhtml": "<p>x</p>"}))
    (docs / "locked.docx").write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(504))  # an encrypted OOXML is OLE
    warnings: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("slimrag").addHandler(handler)
    try:
        idx = Index.build(docs, root / "f.slimrag", embedder=embedder)
    finally:
        logging.getLogger("slimrag").removeHandler(handler)
    return Built(idx, docs, warnings)


def _zip(members: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, text in members.items():
            z.writestr(name, text)
    return buf.getvalue()


@pytest.mark.parametrize("source", list(FOUND))
def test_each_format_is_indexed_and_found(built: Built, source: str) -> None:
    idx = built.idx
    query, text = FOUND[source]
    hits = idx.search(query, k=3, mode="keyword")
    assert hits and hits[0].source == source, (source, [h.source for h in hits])
    assert text in hits[0].text, hits[0].text


def test_vector_search_finds_a_slide_by_meaning(built: Built) -> None:
    hits = built.idx.search("which animal is the team's mascot?", k=3, mode="vector")
    assert hits[0].source == "deck.pptx" and hits[0].metadata["heading"] == "slide 2: Mascot"


@pytest.mark.parametrize("source", list(CORRUPT))
def test_corrupt_zip_documents_are_skipped_with_one_warning(built: Built, source: str) -> None:
    idx, warnings = built.idx, built.warnings
    rep = idx.last_report
    assert {s.source: s.kind for s in rep.skipped} == CORRUPT
    assert [w for w in warnings if source in w] == [f"skipped {source}: {next(s.reason for s in rep.skipped if s.source == source)}"]
    assert rep.added == len(FOUND)  # everything else was indexed
    assert sorted(d.source for d in idx.documents()) == sorted(FOUND)


def test_docx_headings_and_tables(built: Built) -> None:
    sections = read_file(built.docs / "report.docx")
    assert [s.heading for s in sections] == ["", "Expedition log"]
    assert "crew | navigator Solveig" in sections[1].text  # the merged cell written once
    assert sections[1].text.splitlines()[-1] == "fuel"  # the empty cells at the end of the row dropped


def test_epub_follows_the_spine_and_notebook_drops_outputs(built: Built) -> None:
    docs = built.docs
    book = read_file(docs / "book.epub")  # each chapter's <title> is text before its <h1>, as on a web page
    assert [s.heading for s in book if s.heading] == ["Departure", "The Lighthouse"]
    text = "\n".join(s.text for s in book)
    assert text.index("schooner left Tromsø") < text.index("narwhal") and "navy" not in text
    nb = read_file(docs / "orbits.ipynb")
    assert [s.heading for s in nb] == ["Orbital mechanics", "Orbital mechanics"]
    assert nb[1].text.startswith("```python\ndef hohmann_delta_v")
    text = "\n".join(s.text for s in nb)
    assert "quixotic" not in text and "nbconvert" not in text  # no outputs, no raw cells
    assert built.idx.search("quixotic sentinel", k=3, mode="keyword") == []


def test_mail_headings_bodies_and_attachments(built: Built) -> None:
    docs = built.docs
    (eml,) = read_file(docs / "tomatoes.eml")
    assert eml.heading == "Greenhouse tomatoes · Ingrid <ingrid@example.org> · Tue, 03 Mar 2026 09:15:00 +0000"
    assert "From: Ingrid" in eml.text and "<b>" not in eml.text and "pelican" not in eml.text
    first, second = read_file(docs / "club.mbox")
    assert first.heading.startswith("Choir rehearsal · olav@example.org") and ">From now on" in first.text
    assert second.heading == "Ferry timetable · harbour@example.org" and "<h2>" not in second.text


def test_csv_rows_are_grouped_under_their_lines(built: Built) -> None:
    sections = read_file(built.docs / "rain.csv")
    assert len(sections) > 3 and all(len(s.text) <= 1000 for s in sections)
    assert sections[0].heading.startswith("rows 2-") and sections[-1].heading.endswith("-152")
    assert sections[0].text.startswith("city: Town0\ncountry: Norway\nrainfall_mm: 700\n\ncity: Town1")


def test_zip_bombs_and_non_zips_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rawfile, "MAX_UNZIPPED_BYTES", 1 << 20)
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("word/document.xml", bytes(2 << 20))  # 2 MiB of NULs in a few KB
    with pytest.raises(SkipFile) as e:
        rawfile.open_zip(bomb.getvalue(), "Word document")
    assert e.value.kind == TOO_LARGE and "2.0 MiB" in str(e.value)
    with pytest.raises(SkipFile) as e:
        rawfile.open_zip(b"just text", "EPUB")
    assert e.value.kind == PARSE_ERROR and "corrupt EPUB" in str(e.value)


def three_page_pdf() -> bytes:
    """Three pages, written by pypdf from one-page PDFs; the phrase is on page 2."""
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter()
    for text in ("Chapter one covers the harbour.", "The albatross nests on the cliffs of page two.",
                 "Chapter three covers the lighthouse."):
        writer.add_page(PdfReader(io.BytesIO(make_pdf(text))).pages[0])
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def test_pdf_citation_shows_the_page(tmp_path: Path, embedder: LocalEmbedder) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "guide.pdf").write_bytes(three_page_pdf())
    out = tmp_path / "p.slimrag"
    with Index.build(docs, out, embedder=embedder) as idx:
        hits = idx.search("albatross nests", k=3, mode="keyword")
        assert hits[0].page == 2 and "albatross" in hits[0].text
        assert hits[0].where == f"guide.pdf#{hits[0].metadata['ordinal']} (p. 2)"
        assert sorted(h.page for h in idx.search("chapter covers", k=3, mode="keyword")) == [1, 3]
    r = CliRunner().invoke(cli, ["search", str(out), "albatross nests", "--mode", "keyword", "-k", "1"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("1. guide.pdf#") and "(p. 2)" in r.output.splitlines()[0]
    r = CliRunner().invoke(cli, ["search", str(out), "albatross", "--mode", "keyword", "--json"])
    assert json.loads(r.output)[0]["page"] == 2


LAUGHS = ('<?xml version="1.0"?><!DOCTYPE c [<!ENTITY a "aaaaaaaaaa">'
          + "".join(f'<!ENTITY {chr(98 + i)} "{("&" + chr(97 + i) + ";") * 10}">' for i in range(9))
          + ']><container><rootfiles><rootfile full-path="&j;"/></rootfiles></container>')
XXE = ('<!DOCTYPE c [<!ENTITY e SYSTEM "file:///etc/passwd">]>'
       '<container><rootfiles><rootfile full-path="&e;"/></rootfiles></container>')
ENCRYPTED = ('<encryption xmlns="urn:oasis:names:tc:opendocument:xmlns:container" '
             'xmlns:enc="http://www.w3.org/2001/04/xmlenc#"><enc:EncryptedData><enc:CipherData>'
             '<enc:CipherReference URI="OEBPS/text/one.xhtml"/></enc:CipherData></enc:EncryptedData></encryption>')


@pytest.mark.parametrize("members,kind,words", [
    ({"META-INF/container.xml": LAUGHS}, PARSE_ERROR, "amplification"),  # a billion laughs: expat stops it
    ({"META-INF/container.xml": XXE}, PARSE_ERROR, "external entity"),  # never fetched
    ({"META-INF/container.xml": CONTAINER, "OEBPS/content.opf": OPF, "META-INF/encryption.xml": ENCRYPTED,
      "OEBPS/text/one.xhtml": "\x93\x01ciphertext"}, UNREADABLE, "DRM"),
    ({"META-INF/container.xml": CONTAINER, "OEBPS/content.opf": OPF}, PARSE_ERROR, "no chapter"),
])
def test_hostile_and_locked_epubs_are_refused(tmp_path: Path, members: dict[str, str], kind: str, words: str) -> None:
    p = tmp_path / "b.epub"
    p.write_bytes(_zip(members))
    with pytest.raises(SkipFile) as e:
        read_file(p)
    assert e.value.kind == kind and words in str(e.value)


def test_notebook_format_3_is_read(tmp_path: Path) -> None:
    nb = {"nbformat": 3, "metadata": {}, "worksheets": [{"cells": [
        {"cell_type": "heading", "level": 1, "source": ["Tide tables"]},
        {"cell_type": "code", "language": "python", "input": ["print('spring tide')"], "outputs": [
            {"output_type": "stream", "text": ["spring tide output"]}]}]}]}
    (tmp_path / "old.ipynb").write_text(json.dumps(nb), encoding="utf-8")
    sections = read_file(tmp_path / "old.ipynb")
    assert [s.heading for s in sections] == ["Tide tables", "Tide tables"]
    assert sections[1].text == "```python\nprint('spring tide')\n```"


def test_a_header_the_email_parser_trips_on_does_not_lose_the_message(tmp_path: Path) -> None:
    # policy.default raises AttributeError on this group syntax (a CPython parser bug): shown as written
    raw = b"From: a:b;@c\nSubject: Kiln firing\n\nThe kiln reaches cone six by midnight.\n"
    (tmp_path / "odd.eml").write_bytes(raw)
    (section,) = read_file(tmp_path / "odd.eml")
    assert section.heading == "Kiln firing · a:b;@c" and "cone six by midnight" in section.text
