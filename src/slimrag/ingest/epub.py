"""The EPUB reader: a zip of XHTML chapters, read in the order the book's spine gives.

An EPUB (2 or 3) is found through three files, all plain XML inside the zip:

1. ``META-INF/container.xml`` names the package document (the OPF), e.g. ``OEBPS/content.opf``;
2. the OPF's ``<manifest>`` maps item ids to files (paths relative to the OPF, URL-escaped) and
   media types; its ``<spine>`` lists item ids in reading order;
3. each spine item of an (X)HTML media type is a chapter: it goes through the HTML reader
   (`slimrag.ingest.html.page_sections`), so chapters split at their ``<h1>``..``<h6>`` as web
   pages do, and the sections come in reading order, not in zip order.

Spine items missing from the zip are passed over (sloppy books exist), and a chapter the spine
lists twice is read once (a spine of 10,000 references to one large chapter would otherwise ask
for 10,000 copies of it); the text is counted against `slimrag.ingest.bounds.PACKED_EXPANSION`
(100) times the book's size as it is read. A book none of whose chapters can be read is a parse
error. A book whose chapters are listed in
``META-INF/encryption.xml`` is DRM-protected: refused as unreadable, not indexed as ciphertext
(font obfuscation lists only fonts and does not count). Navigation documents, images and styles
are not read.

XML is parsed with the standard library's expat, which does not fetch external entities and,
from expat 2.4.1 on, stops entity-expansion bombs; the zip itself is checked by
`slimrag.ingest.rawfile.open_zip` (no bomb). Every failure raises `SkipFile`: one warning.
zipfile and ElementTree are imported on first use, not when the registry is loaded.
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote

from slimrag.ingest.bounds import PACKED_EXPANSION, Budget
from slimrag.ingest.html import page_sections
from slimrag.ingest.outcome import PARSE_ERROR, UNREADABLE, SkipFile
from slimrag.ingest.rawfile import open_zip
from slimrag.ingest.text import Section, decode

if TYPE_CHECKING:
    import zipfile
    from xml.etree import ElementTree

CONTAINER = "META-INF/container.xml"
ENCRYPTION = "META-INF/encryption.xml"
#: media types of spine items read as chapters
CHAPTER_TYPES = frozenset({"application/xhtml+xml", "text/html", "application/x-dtbook+xml"})


def _xml(archive: zipfile.ZipFile, name: str) -> ElementTree.Element:
    """A member of the book parsed as XML; raises `SkipFile` when it is missing or malformed."""
    from xml.etree import ElementTree

    try:
        return ElementTree.fromstring(archive.read(name))
    except KeyError as e:
        raise SkipFile(PARSE_ERROR, f"not an EPUB: {name} is missing") from e
    except ElementTree.ParseError as e:
        raise SkipFile(PARSE_ERROR, f"EPUB {name} is not well-formed XML ({e})") from e


def _member(base: str, href: str) -> str:
    """The zip name of ``href`` (URL-escaped, relative to the folder ``base``), fragment dropped."""
    return posixpath.normpath(posixpath.join(base, unquote(href.split("#", 1)[0]))).lstrip("/")


def spine(archive: zipfile.ZipFile) -> list[str]:
    """The zip names of the book's chapters in reading order (see the module header)."""
    rootfile = next((r.get("full-path") for r in _xml(archive, CONTAINER).iterfind(".//{*}rootfile")
                     if r.get("full-path")), None)
    if rootfile is None:
        raise SkipFile(PARSE_ERROR, f"not an EPUB: {CONTAINER} names no package document")
    opf = _xml(archive, rootfile)
    base = posixpath.dirname(rootfile)
    items = {i.get("id"): (i.get("href") or "", i.get("media-type") or "") for i in opf.iterfind(".//{*}item")}
    chapters = []
    for ref in opf.iterfind(".//{*}itemref"):
        href, media_type = items.get(ref.get("idref"), ("", ""))
        if href and media_type in CHAPTER_TYPES:
            chapters.append(_member(base, href))
    return chapters


def _encrypted(archive: zipfile.ZipFile) -> set[str]:
    """Zip names listed as encrypted in ``META-INF/encryption.xml`` (empty when there is none)."""
    if ENCRYPTION not in archive.namelist():
        return set()
    return {_member("", uri) for ref in _xml(archive, ENCRYPTION).iterfind(".//{*}CipherReference")
            if (uri := ref.get("URI"))}


def read_epub(data: bytes, path: Path) -> list[Section]:
    """EPUB: the chapters of the spine, in reading order, each split at its HTML headings."""
    import zipfile
    import zlib

    archive = open_zip(data, "EPUB")
    with archive:
        chapters = spine(archive)
        locked = _encrypted(archive).intersection(chapters)
        if locked:
            raise SkipFile(UNREADABLE, f"EPUB is DRM-protected ({len(locked)} encrypted chapters); "
                                       "only DRM-free books can be read")
        names = set(archive.namelist())
        sections: list[Section] = []
        budget = Budget("EPUB", len(data), PACKED_EXPANSION)
        read = 0
        for name in dict.fromkeys(chapters):  # each chapter once, in spine order
            if name not in names:
                continue
            # a damaged member: a CRC mismatch, bad deflate data, an unknown compression method
            try:
                raw = archive.read(name)
            except (zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError, EOFError) as e:
                raise SkipFile(PARSE_ERROR, f"corrupt EPUB: cannot unzip {name} ({e})") from e
            chapter = page_sections(decode(raw))
            budget.take(sum(len(s.text) + len(s.heading) for s in chapter))
            sections.extend(chapter)
            read += 1
    if not read:
        raise SkipFile(PARSE_ERROR, "EPUB spine lists no chapter found in the book")
    return sections
