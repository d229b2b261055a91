"""Visible text of an HTML page, split at its headings, in time linear in the page.

CPython's `HTMLParser` rescans to the end of the input for every ``<``, ``<!--`` or ``<![`` that is
never closed (200 KB of ``<a`` took a minute), so those openers are escaped first (`defuse`) and
read as text. A page whose markup is closed is not touched, so its text is what it always was;
only malformed markup can read slightly differently. ``_markupbase`` raises AssertionError on a
marked section it does not know (``<![foo[``); `html_sections` lets it through, `page_sections`
(what the HTML, EPUB and mail readers use) turns it into a parse-error skip.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

from slimrag.ingest.outcome import PARSE_ERROR, SkipFile
from slimrag.ingest.text import Section


class _HTMLText(HTMLParser):
    """Collects visible text, split at h1-h6; drops script/style."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.sections: list[tuple[str, str]] = []
        self.heading = ""
        self.buf: list[str] = []
        self.skip = 0
        self.in_heading = False
        self.head_buf: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style", "noscript"):
            self.skip += 1
        elif tag in ("h1", "h2", "h3", "h4", "h5", "h6"):
            self.flush()
            self.in_heading, self.head_buf = True, []
        elif tag in ("p", "br", "div", "li", "tr", "pre"):
            self.buf.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style", "noscript"):
            self.skip = max(0, self.skip - 1)
        elif tag in ("h1", "h2", "h3", "h4", "h5", "h6") and self.in_heading:
            self.in_heading = False
            self.heading = " ".join("".join(self.head_buf).split())
            self.buf.append(self.heading + "\n")

    def handle_data(self, data: str) -> None:
        if self.skip:
            return
        (self.head_buf if self.in_heading else self.buf).append(data)

    def flush(self) -> None:
        text = re.sub(r"\n\s*\n+", "\n\n", "".join(self.buf)).strip()
        if text:
            self.sections.append((self.heading, text))
        self.buf = []


_COMMENT_CLOSE = re.compile(r"--\s*>")  # what HTMLParser looks for after "<!--"
_SECTION_CLOSE = re.compile(r"]\s*>")  # the end of every marked section "<![...]>" HTMLParser accepts


def _last_end(pattern: re.Pattern[str], text: str) -> int:
    """The end of the last match of ``pattern`` in ``text``, or 0."""
    end = 0
    for m in pattern.finditer(text):
        end = m.end()
    return end


def defuse(text: str) -> str:
    """Escape the markup openers HTMLParser could never close, so it does not rescan the rest of
    the input for each of them (quadratic): a ``<`` after the last ``>``, a ``<!--`` after the last
    comment end, a ``<![`` after the last ``]>``. Each becomes text, as the parser mostly reads
    it; a well-formed page has none and is returned as is. Linear: three scans and replaces."""
    for opener, end in (("<![", _last_end(_SECTION_CLOSE, text)), ("<!--", _last_end(_COMMENT_CLOSE, text)),
                        ("<", text.rfind(">") + 1)):
        if opener in text[end:]:
            text = text[:end] + text[end:].replace(opener, "&lt;" + opener[1:])
    return text


def html_sections(text: str) -> list[tuple[str, str]]:
    """``(heading, text)`` of each run of visible text of a decoded page, split at h1-h6; script,
    style and noscript dropped. Raises AssertionError on markup ``_markupbase`` refuses."""
    parser = _HTMLText()
    parser.feed(defuse(text))
    parser.close()
    parser.flush()
    return parser.sections


def page_sections(text: str) -> list[Section]:
    """The sections of a decoded page (`html_sections`); raises `SkipFile` (parse error) for
    markup the parser refuses."""
    try:
        return [Section(h, t) for h, t in html_sections(text)]
    except AssertionError as e:  # _markupbase asserts on an unknown marked section ("<![foo[")
        raise SkipFile(PARSE_ERROR, f"malformed HTML ({e})") from e
