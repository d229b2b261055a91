"""HTML pages are indexed without their chrome (issue 20, item 3): on pages with a real manual's
layout (tests/fixtures/manual: a DocBook page with the PostgreSQL manual's "Prev Up Chapter Home
Next" bars, and a documentation-site page with a header menu, a sidebar, breadcrumbs,
previous/next links and a footer), no navigation text is left in any chunk, every paragraph of
the content is found by search, and headings and code blocks are kept.

Ground truth is tests/fixtures/manual/truth.json, written by hand from the pages.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.ingest.html import page_sections
from slimrag.ingest.mainhtml import main_sections
from slimrag.ingest.readers import read_file

MANUAL = Path(__file__).parent / "fixtures" / "manual"
TRUTH = {page: t for page, t in json.loads((MANUAL / "truth.json").read_text()).items() if not page.startswith("_")}


def fold(text: str) -> str:
    return " ".join(text.split())


def chrome_in(text: str, chrome: list[str]) -> list[str]:
    """The chrome strings found in ``text`` as whole words (case-sensitive: "Next", not "next")."""
    return [c for c in chrome if re.search(rf"(?<!\w){re.escape(c)}(?!\w)", fold(text))]


@pytest.mark.parametrize("page", sorted(TRUTH))
def test_a_page_reads_as_its_content(page: str) -> None:
    truth = TRUTH[page]
    sections = read_file(MANUAL / page)
    text = "\n\n".join(s.text for s in sections)
    assert chrome_in(text, truth["chrome"]) == []
    assert [p for p in truth["paragraphs"] if p not in fold(text)] == []
    assert [s.heading for s in sections if s.heading in truth["headings"]] == truth["headings"]
    for code in truth["code"]:
        assert code in text  # line for line, indentation included
    # the whole-page parser the reader used before leaves the chrome in: the fixture shows it
    assert chrome_in("\n".join(s.text for s in page_sections((MANUAL / page).read_text())), truth["chrome"])


def test_a_page_of_links_only_is_read_whole() -> None:
    """A table of contents has no main content by the extractor's measure: it is kept whole."""
    toc = ("<html><body><h1>Contents</h1><ul>" + "".join(f'<li><a href="c{i}.html">Chapter {i}</a></li>'
                                                          for i in range(1, 6)) + "</ul></body></html>")
    text = "\n".join(s.text for s in main_sections(toc))
    assert all(f"Chapter {i}" in text for i in range(1, 6))


def test_every_paragraph_is_searchable_and_no_chunk_holds_chrome(tmp_path: Path, embedder: LocalEmbedder) -> None:
    docs = tmp_path / "manual"
    docs.mkdir()
    for page in TRUTH:
        shutil.copy(MANUAL / page, docs / page)
    with Index.build(docs, tmp_path / "m.slimrag", embedder=embedder) as idx:
        chunks = list(idx.catalog.chunks(idx.catalog.live_ids()).values())
        for chunk in chunks:
            assert chrome_in(chunk.text, TRUTH[chunk.source]["chrome"]) == [], chunk.text
        for page, truth in TRUTH.items():
            for paragraph in truth["paragraphs"]:
                hits = idx.search(paragraph, k=3, mode="keyword")
                assert any(h.source == page and paragraph in fold(h.text) for h in hits), paragraph
                hits = idx.search(paragraph, k=3, mode="vector")
                assert any(h.source == page and paragraph in fold(h.text) for h in hits), paragraph
