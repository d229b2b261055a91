"""The bytes of one file, read so that no file can hang, exhaust memory or surprise the reader.

- Only regular files are opened. The type is checked with ``stat`` before opening, and again on
  the open descriptor (``O_NONBLOCK``, so a FIFO swapped in between never blocks the open).
- At most ``max_bytes + 1`` bytes are read, whatever the size ``stat`` claimed: a file that grew,
  or one named directly on the command line, cannot be pulled into memory whole.
- ``.gz`` files are decompressed in bounded steps, so a gzip bomb stops at ``max_bytes`` of
  output. The inner name (``README.gz`` → ``README``, ``page.html.gz`` → ``page.html``) picks the
  reader.
- Zip-based documents (docx, pptx, epub) are opened through `open_zip`, which refuses a zip
  (a zip bomb, as ``too large``) whose members would unzip to more than `MAX_UNZIP_RATIO` (100)
  times the document's size plus `UNZIP_SLACK_BYTES` (1 MiB), or past `MAX_UNZIPPED_BYTES`
  (256 MiB) whatever its size; one whose XML member (``.xml``, ``.rels``, ``.xhtml``, ``.html``,
  ``.opf``, ``.ncx``) would unzip past `MAX_XML_MEMBER_BYTES` (32 MiB); or one that holds more
  than `MAX_ZIP_ENTRIES` members. All is judged from the central directory before anything is
  inflated; Python's zipfile never returns more than a member's declared size, so the check
  holds. Why per member and in proportion: python-docx and python-pptx parse each XML part into
  an lxml tree several times the XML's size, so 256 MiB of XML in one 2 MiB file (XML of
  repeated elements compresses about 1,000 times) meant gigabytes of memory. Measured: the
  templates python-docx and python-pptx start every document from unzip to 24x and 2.8x their
  size (the docx's styles part compresses well), their largest member is 438 KiB; an Office
  document of text runs 3-25x, far from 100x. A member of pictures is stored compressed
  already and is not parsed, so only the total bounds it.
- Text is recognised without a suffix: a UTF-16 or UTF-32 byte-order mark (`bom_codec`, looked
  for first: such text is full of NUL bytes) followed by text of that encoding without NUL
  characters; else no NUL byte in the first `SNIFF_BYTES` and valid UTF-8 there, or a declared
  charset (XML declaration, HTML ``<meta charset>``, an Emacs/Vim/PEP 263 ``coding:`` line) that
  Python knows. UTF-16 without a mark is not guessed at: its NUL bytes read as binary.

Every refusal raises `SkipFile` with its reason from `slimrag.ingest.outcome`.
"""

from __future__ import annotations

import codecs
import errno
import os
import re
import stat
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

from slimrag.ingest.outcome import PARSE_ERROR, TOO_LARGE, UNREADABLE, SkipFile

if TYPE_CHECKING:
    import zipfile

#: bytes looked at to decide whether an unknown file is text, and to find a declared charset
SNIFF_BYTES = 8192
#: decompression step: output produced per call, so a bomb is stopped after one step past the limit
_GZ_STEP = 1 << 20

#: the most a zip-based document may unzip to, all members together, whatever its size. A 20 MiB
#: docx of text and pictures unzips to a little more than its size (pictures are stored
#: compressed already); a bomb declares gigabytes. Bigger means more memory per document.
MAX_UNZIPPED_BYTES = 256 * 2**20
#: the most a zip-based document may unzip to per byte of the document (plus `UNZIP_SLACK_BYTES`)
MAX_UNZIP_RATIO = 100
#: what any zip-based document may unzip to on top of its ratio, so a small one is never refused
UNZIP_SLACK_BYTES = 2**20
#: the most one XML member (the parts python-docx, python-pptx and the EPUB reader parse) may
#: unzip to: an lxml tree is several times its XML
MAX_XML_MEMBER_BYTES = 32 * 2**20
#: member name endings parsed as XML by the readers of zip-based documents
XML_MEMBER_SUFFIXES = (".xml", ".rels", ".xhtml", ".html", ".htm", ".opf", ".ncx")
#: the most members a zip-based document may hold (a long EPUB has a few thousand)
MAX_ZIP_ENTRIES = 20_000
#: the first bytes of an OLE compound file: a password-protected Office file, or a .doc/.ppt
_OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"

_FILE_TYPES = {stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
               stat.S_IFBLK: "a block device", stat.S_IFDIR: "a folder"}


def mib(n: int) -> str:
    """A byte count as MiB for messages (``0.3 MiB``, ``200 MiB``)."""
    return f"{n / 2**20:.1f} MiB" if n < 10 * 2**20 else f"{n / 2**20:.0f} MiB"


def too_large(size: int, max_bytes: int, what: str = "") -> SkipFile:
    """The skip for a file over the limit, saying how to include it."""
    return SkipFile(TOO_LARGE, f"{what}{mib(size)} is over the {mib(max_bytes)} limit "
                               "(build the index with a larger --max-file-mb, IndexConfig.max_file_bytes in Python, to include it)")


def not_regular(mode: int) -> SkipFile | None:
    """The skip for a path that is not a regular file (it is never opened), else None."""
    if stat.S_ISREG(mode):
        return None
    return SkipFile(UNREADABLE, f"{_FILE_TYPES.get(stat.S_IFMT(mode), 'not a regular file')}, not read")


def os_error(e: OSError) -> SkipFile:
    """The skip for an OS error on a path, in words (a loop and a long path named as such)."""
    if e.errno == errno.ELOOP:
        return SkipFile(UNREADABLE, "symlink loop")
    if e.errno == errno.ENAMETOOLONG:
        return SkipFile(UNREADABLE, "path too long for the OS (folders nested too deep?)")
    return SkipFile(UNREADABLE, f"cannot read ({e.strerror or e})")


def read_bounded(path: Path, max_bytes: int) -> bytes:
    """The bytes of a regular file, at most ``max_bytes``; raises `SkipFile` otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise os_error(e) from e
    try:
        st = os.fstat(fd)
        bad = not_regular(st.st_mode)
        if bad is not None:
            raise bad
        if st.st_size > max_bytes:
            raise too_large(st.st_size, max_bytes)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise os_error(e) from e
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise too_large(len(data), max_bytes, "grew while read: over ")
    return data


def is_gzip(name: str) -> bool:
    """True for a name ending in ``.gz`` (read decompressed)."""
    return name.lower().endswith(".gz") and len(name) > 3


def inner_name(name: str) -> str:
    """The name that picks the reader: ``.gz`` stripped (``README.gz`` → ``README``)."""
    return name[:-3] if is_gzip(name) else name


def gunzip_bounded(raw: bytes, max_bytes: int) -> bytes:
    """Decompress gzip data (all members), refusing output beyond ``max_bytes``."""
    out: list[bytes] = []
    total = 0
    data = raw
    try:
        while data:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip header, one member
            buf = data
            while True:
                chunk = d.decompress(buf, _GZ_STEP)
                total += len(chunk)
                if total > max_bytes:
                    raise too_large(total, max_bytes, "decompressed: ")
                out.append(chunk)
                buf = d.unconsumed_tail
                if d.eof or not buf:
                    break
            if not d.eof:
                raise SkipFile(UNREADABLE, "truncated gzip file")
            data = d.unused_data.lstrip(b"\x00")  # concatenated members; padding NULs are allowed
    except zlib.error as e:
        raise SkipFile(UNREADABLE, f"corrupt gzip data ({e})") from e
    return b"".join(out)


def open_zip(data: bytes, what: str) -> zipfile.ZipFile:
    """The zip archive of a document (``what`` names its format in messages), its members checked
    against the bounds of the module header before anything is inflated; raises `SkipFile`:
    unreadable for an encrypted Office file, parse error for data that is not a zip, too large
    for a bomb."""
    import io
    import zipfile

    if data.startswith(_OLE_MAGIC):
        raise SkipFile(UNREADABLE, f"{what} is password-protected or in the old binary format; "
                                   "remove the password or save it in the current format to include it")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError) as e:
        raise SkipFile(PARSE_ERROR, f"corrupt {what}: not a readable zip archive ({e})") from e
    members = archive.infolist()
    if len(members) > MAX_ZIP_ENTRIES:
        raise SkipFile(TOO_LARGE, f"{what} holds {len(members)} zip members, over the {MAX_ZIP_ENTRIES} limit")
    unzipped = sum(m.file_size for m in members)
    limit = min(MAX_UNZIPPED_BYTES, MAX_UNZIP_RATIO * len(data) + UNZIP_SLACK_BYTES)
    if unzipped > limit:
        archive.close()
        raise SkipFile(TOO_LARGE, f"{what} would unzip to {mib(unzipped)}, over the {mib(limit)} limit of a "
                                  f"zip-based document of {mib(len(data))} ({MAX_UNZIP_RATIO}x its size + "
                                  f"{mib(UNZIP_SLACK_BYTES)}, at most {mib(MAX_UNZIPPED_BYTES)}): a zip bomb, "
                                  "or a document to save as PDF or text to include")
    big = next((m for m in members if m.file_size > MAX_XML_MEMBER_BYTES
                and m.filename.lower().endswith(XML_MEMBER_SUFFIXES)), None)
    if big is not None:
        archive.close()
        raise SkipFile(TOO_LARGE, f"{what} part {big.filename} would unzip to {mib(big.file_size)} of XML, over "
                                  f"the {mib(MAX_XML_MEMBER_BYTES)} limit per part; split the document, or "
                                  "save it as PDF or text to include it")
    return archive


_XML_DECL = re.compile(rb"^\s*<\?xml[^>]{0,200}?encoding\s*=\s*[\"']([A-Za-z0-9._:-]{1,40})[\"']")
_META = re.compile(rb"<meta\s[^>]{0,400}?charset\s*=\s*[\"']?([A-Za-z0-9._:-]{1,40})", re.IGNORECASE)
_CODING = re.compile(rb"coding[:=]\s*([A-Za-z0-9._-]{1,40})")


def declared_charset(head: bytes) -> str | None:
    """The charset a file declares in its first bytes, as a Python codec name, or None.

    Looked for, in order: an XML declaration, an HTML ``<meta charset>`` or ``http-equiv``
    content type (anywhere in ``head``), a ``coding:`` / ``coding=`` in the first two lines.
    Every pattern has bounded repetitions, so the search is linear in ``len(head)``."""
    head = head[:SNIFF_BYTES]
    m = _XML_DECL.match(head) or _META.search(head)
    if m is None:
        first_two = b"\n".join(head.split(b"\n", 2)[:2])
        m = _CODING.search(first_two)
    if m is None:
        return None
    try:
        name = codecs.lookup(m.group(1).decode("ascii")).name
        b"a".decode(name)  # LookupError for codecs that are not text encodings (zlib, rot13, hex)
    except LookupError:
        return None
    except UnicodeDecodeError:  # a text encoding that cannot decode one byte alone (utf-16)
        pass
    return name


#: byte-order marks of the wide Unicode encodings, UTF-32's first (its little-endian mark begins
#: with UTF-16's), and the codec that reads the mark, drops it and decodes the rest by it
_WIDE_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
              (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def bom_codec(head: bytes) -> str | None:
    """``"utf-16"`` or ``"utf-32"`` when ``head`` starts with that encoding's byte-order mark (what
    Windows Notepad writes as "Unicode"), else None. UTF-8's mark is read on the UTF-8 path."""
    return next((codec for bom, codec in _WIDE_BOMS if head.startswith(bom)), None)


def looks_like_text(head: bytes) -> bool:
    """True when the first bytes of a file are text: UTF-16/32 behind its byte-order mark without
    NUL characters; else no NUL, and valid UTF-8 (a character cut at the end of ``head`` is
    allowed) or decodable in the charset the file declares."""
    head = head[:SNIFF_BYTES]
    wide = bom_codec(head)
    if wide is not None:
        try:
            return "\x00" not in codecs.getincrementaldecoder(wide)().decode(head, final=False)
        except UnicodeDecodeError:
            return False
    if b"\x00" in head:
        return False
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
        return True
    except UnicodeDecodeError:
        pass
    charset = declared_charset(head)
    if charset is None:
        return False
    try:
        codecs.getincrementaldecoder(charset)().decode(head, final=False)
        return True
    except UnicodeDecodeError:
        return False


def read_head(path: Path, n: int = SNIFF_BYTES) -> bytes:
    """The first ``n`` bytes of a regular file's content (decompressed for ``.gz``), to sniff it;
    raises `SkipFile` when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise os_error(e) from e
    try:
        bad = not_regular(os.fstat(fd).st_mode)
        if bad is not None:
            raise bad
        raw = os.read(fd, n if not is_gzip(path.name) else 4 * n)
    except OSError as e:
        raise os_error(e) from e
    finally:
        os.close(fd)
    if not is_gzip(path.name):
        return raw
    try:
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(raw, n)
    except zlib.error as e:
        raise SkipFile(UNREADABLE, f"corrupt gzip data ({e})") from e
