"""The main content of a web page, without its chrome (navigation bars, sidebars, breadcrumbs,
footers), split at its headings, with code blocks kept line for line.

Why two passes
    Deciding what is content is a solved problem with a well-kept library: trafilatura scores the
    page's blocks by text density, link density and markup (it is what web-scale corpora use).
    But its text loses what slimrag's chunks need: on a DocBook page (the PostgreSQL manual's
    layout) it drops the section headings, and its plain text folds code. readability-lxml keeps
    the markup but dropped a section heading, a list and two of seven paragraphs of the same
    page. Measured on tests/fixtures/manual (two pages, 13 paragraphs, 5 headings, 3 code
    blocks, 23 pieces of chrome): trafilatura kept 13/13 paragraphs and 3/3 code blocks, left
    no chrome, but kept 3/5 headings; readability-lxml kept 11/13 paragraphs, 4/5 headings.
    So trafilatura decides, and slimrag's own parse keeps the structure:

    1. `page_blocks` cuts the page into blocks at block-level tags (a paragraph, a list item, a
       table row, a code block, a heading), whitespace folded except inside ``<pre>``, and notes
       which blocks are only link text.
    2. trafilatura extracts the page's main text. Both texts are reduced to lower-case word
       tokens (so punctuation, table pipes and markup differences do not matter) and each block
       is looked up in the extracted tokens, in page order, from where the last match ended.
    3. The content region runs from the first to the last block of at least `LONG` words that was
       found: chrome lives outside it (a header and sidebar before, the footer and next/previous
       links after). Inside it a block is kept when it was found, or when it is more than link
       text (content trafilatura judged too short, such as a one-line paragraph between two
       code blocks); a short block must be found next to the previous match (within `NEAR`
       characters), so "Next" in a footer never matches a "next" in the text.
    4. A heading is kept when content follows it before the next heading, wherever it stands (the
       heading just above the first paragraph is outside the region).

    A page where trafilatura finds no main content (a table of contents, a page of links) is read
    whole, as every page was before (`slimrag.ingest.html.page_sections`).

Knobs: `LONG` (6 words): a block this long anchors the region; shorter blocks are list items,
cells and captions that could also be chrome. `NEAR` (120 characters of the token string): how far
past the last match a short block may be found.
Cost: trafilatura parses the page with lxml; 2-20 ms a page on the fixture, linear in its size.
A page trafilatura cannot parse is read whole, and its log line about it is silenced.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from html.parser import HTMLParser

from slimrag.ingest.html import defuse, page_sections
from slimrag.ingest.text import Section

# trafilatura logs an ERROR for a page it cannot parse ("empty HTML tree"); the page is then read
# whole (`main_sections`), or skipped with slimrag's one warning: its own lines would be a second.
logging.getLogger("trafilatura").setLevel(logging.CRITICAL)

LONG = 6
NEAR = 120

_HEADINGS = {"h1", "h2", "h3", "h4", "h5", "h6"}
#: Tags that end a block of text (and start the next).
_BLOCK_TAGS = _HEADINGS | {
    "address", "article", "aside", "blockquote", "body", "br", "caption", "dd", "details", "div", "dl",
    "dt", "fieldset", "figcaption", "figure", "footer", "form", "header", "hr", "li", "main", "nav", "ol",
    "p", "pre", "section", "summary", "table", "tbody", "td", "tfoot", "th", "thead", "tr", "ul",
}
_SKIP = {"script", "style", "noscript", "template", "svg", "head", "title"}
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class Block:
    """One block of a page: its text (folded, or as written for code), and what kind it is."""

    text: str
    heading: bool = False
    code: bool = False
    links_only: bool = False


class _BlockParser(HTMLParser):
    """Cuts a page into `Block`s at block-level tags; drops script, style and the like."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[Block] = []
        self.parts: list[str] = []
        self.plain = False  # text outside any link in the current block
        self.skip = self.pre = self.link = 0
        self.heading = False

    def end_block(self) -> None:
        raw = "".join(self.parts)
        text = raw.strip("\n").rstrip() if self.pre else " ".join(raw.split())
        if text.strip():
            self.blocks.append(Block(text, heading=self.heading, code=bool(self.pre),
                                     links_only=not self.plain))
        self.parts, self.plain = [], False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIP:
            self.skip += 1
        elif tag == "a":
            self.link += 1
        elif tag in _BLOCK_TAGS and not self.pre:
            self.end_block()
            self.heading = tag in _HEADINGS
            self.pre += tag == "pre"

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP:
            self.skip = max(0, self.skip - 1)
        elif tag == "a":
            self.link = max(0, self.link - 1)
        elif tag == "pre" and self.pre:
            self.end_block()
            self.pre = 0
        elif tag in _BLOCK_TAGS and not self.pre:
            self.end_block()
            self.heading = False

    def handle_data(self, data: str) -> None:
        if self.skip:
            return
        self.parts.append(data)
        if not self.link and data.strip():
            self.plain = True


def page_blocks(text: str) -> list[Block]:
    """The blocks of a decoded page, in order (raises AssertionError on markup ``_markupbase``
    refuses, as `slimrag.ingest.html.html_sections` does)."""
    parser = _BlockParser()
    parser.feed(defuse(text))
    parser.close()
    parser.end_block()
    return parser.blocks


def _tokens(text: str) -> str:
    """Lower-case word tokens, space-joined and space-padded (so a find is whole words)."""
    return " " + " ".join(_WORD.findall(text.lower())) + " "


def main_text(text: str) -> str | None:
    """trafilatura's main text of the page, or None when it finds none."""
    import trafilatura

    return trafilatura.extract(text, output_format="txt", include_comments=False, include_tables=True,
                               include_links=False, deduplicate=False, fast=True)


def keep_blocks(blocks: list[Block], content: str) -> list[Block]:
    """The blocks of the main content (see the module header, steps 2-4)."""
    wanted = _tokens(content)
    found: list[bool] = []
    cursor = 0
    for b in blocks:
        needle = _tokens(b.text)
        at = wanted.find(needle, cursor) if needle.strip() else -1
        short = len(needle.split()) < LONG
        if at != -1 and (not short or at - cursor <= NEAR):
            found.append(True)
            cursor = at + len(needle) - 1
        else:
            found.append(False)
    anchors = [i for i, (b, hit) in enumerate(zip(blocks, found, strict=True))
               if hit and not b.heading and len(b.text.split()) >= LONG]
    if not anchors:
        return []
    first, last = anchors[0], anchors[-1]
    body = [i for i in range(first, last + 1)
            if not blocks[i].heading and (found[i] or not blocks[i].links_only)]
    kept = set(body)
    for i in sorted(body):  # the nearest heading above each kept block
        for j in range(i - 1, -1, -1):
            if blocks[j].heading:
                kept.add(j)
                break
            if j in kept:
                break
    return [blocks[i] for i in sorted(kept)]


def sections_of(blocks: list[Block]) -> list[Section]:
    """`Section`s: a new one at each heading; blocks joined by blank lines."""
    sections: list[Section] = []
    heading, parts = "", []
    for b in blocks:
        if b.heading:
            if parts:
                sections.append(Section(heading, "\n\n".join(parts)))
            heading, parts = b.text, [b.text]
        else:
            parts.append(b.text)
    if parts:
        sections.append(Section(heading, "\n\n".join(parts)))
    return sections


def main_sections(text: str) -> list[Section]:
    """The sections of a decoded page's main content; the whole page when no main content is
    found. Raises `SkipFile` (parse error) for markup the parser refuses."""
    content = main_text(text)
    if content:
        try:
            kept = keep_blocks(page_blocks(text), content)
        except AssertionError:  # _markupbase on "<![foo[": page_sections says so as a skip
            kept = []
        if kept:
            return sections_of(kept)
    return page_sections(text)
