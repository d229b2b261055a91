"""The hostile-file corpus of issue 12 and 13, written into a test's tmp_path: every trigger that
once aborted or hung a build, beside good files that must still be indexed and found.

`write_hostile_tree` returns what the test checks against: the files that must each give one
warning (loud skips, with their reason), the ones counted quietly, and the good ones with a
query and a word that finds each.
"""

from __future__ import annotations

import gzip
import io
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from conftest import pdf_with_content

from slimrag.ingest.outcome import (
    BINARY,
    EMPTY,
    ENCODING,
    IGNORED,
    PARSE_ERROR,
    TOO_LARGE,
    UNREADABLE,
    UNSUPPORTED,
)

#: folders nested this deep hold one good file (os.walk recursed once per level)
DEEP = 1000


@dataclass
class Hostile:
    """What a hostile tree holds. loud: source → reason (one warning each); quiet: source →
    reason (counted, no warning); good: source → (query, a word of the passage found)."""

    root: Path
    loud: dict[str, str] = field(default_factory=dict)
    quiet: dict[str, str] = field(default_factory=dict)
    good: dict[str, tuple[str, str]] = field(default_factory=dict)


def write_hostile_tree(root: Path) -> Hostile:
    """Write the corpus under ``root`` (about 0.5 MB on disk; the 300 MB file is sparse)."""
    root.mkdir(parents=True)
    h = Hostile(root)

    def put(name: str, data: bytes | str) -> Path:
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        return p

    # -- good files, each must be found by its query ----------------------------------------
    put("good.md", "# Volcano\n\nMount Etna erupted again in spring, covering Catania in ash.\n")
    h.good["good.md"] = ("volcano eruption ash", "Etna")
    # the crafted heading: a run of spaces inside a heading line (the old regex was cubic in it)
    put("heading.md", "# kiwi" + " " * 4000 + "orchard\n\nKiwi fruit grow on vines in New Zealand orchards.\n")
    h.good["heading.md"] = ("kiwi fruit vines", "vines")
    put("bignum.json", '{"comment": "the accountant counted every marble", "n": ' + "7" * 100_001 + "}")
    h.good["bignum.json"] = ("accountant counting marbles", "marble")
    deep = root / "deep"
    deep.mkdir()
    for _ in range(DEEP):  # one level at a time: Path.mkdir(parents=True) recurses per level
        deep = deep / "d"
        deep.mkdir()
    (deep / "bottom.txt").write_text("The submarine dived to four hundred metres below the ice.\n")
    h.good["deep/" + "d/" * DEEP + "bottom.txt"] = ("submarine diving depth", "submarine")
    put("oneline.txt", ("The lighthouse keeper trims the wick. " * 160).strip())  # 6 KB, one line
    h.good["oneline.txt"] = ("lighthouse keeper wick", "wick")
    put("lt.html", "<p>Penguins huddle together through the polar winter.</p>" + "<a" * 800)
    h.good["lt.html"] = ("penguins huddle polar winter", "Penguins")
    put("notes.txt.gz", gzip.compress(b"Saffron is the dried stigma of the crocus flower.\n"))
    h.good["notes.txt.gz"] = ("saffron crocus stigma", "Saffron")
    # issue 27: a 100 KB heading, cut to 200 characters in each chunk's metadata
    put("longheading.md", "# Tides " + "tide " * 20_000 + "\n\nThe moon pulls the oceans into two bulges of high tide.\n")
    h.good["longheading.md"] = ("moon pulls oceans high tide", "bulges")
    # issue 27: a .gitignore of patterns Python's regex engine backtracks on, over a deep path
    put("repo/.gitignore", "*a*a*a*a*a*a*a*a*a*a*b\n**/a/**/a/**/a/**/a/**/a/**/a/**/a/**/c\n")
    h.quiet["repo/.gitignore"] = IGNORED
    deep_a = "repo/" + "a/" * 60
    put(deep_a + "c", "ignored by the second pattern\n")
    h.quiet[deep_a + "c"] = IGNORED
    put(deep_a + "a" * 200 + ".txt", "The walrus hauls out on the ice floe to rest.\n")  # the first pattern fails on it
    h.good[deep_a + "a" * 200 + ".txt"] = ("walrus ice floe", "walrus")

    # -- bad files: one warning each ----------------------------------------------------------
    bad_name = os.fsencode(root) + b"/bad\xffname.txt"
    with open(bad_name, "wb") as f:
        f.write(b"a file whose name is not UTF-8")
    h.loud["bad\\xffname.txt"] = ENCODING
    os.symlink("loop.txt", root / "loop.txt")
    h.loud["loop.txt"] = UNREADABLE
    os.mkfifo(root / "fifo.txt")
    h.loud["fifo.txt"] = UNREADABLE
    put("deep.json", "[" * 100_000 + "]" * 100_000)
    h.loud["deep.json"] = PARSE_ERROR
    put("deep.jsonl", '{"ok": "fine"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    h.loud["deep.jsonl"] = PARSE_ERROR
    put("nested.pdf", pdf_with_content(b"BT /F1 12 Tf 72 720 Td " + b"[" * 20_000 + b" (x) TJ ET"))
    h.loud["nested.pdf"] = PARSE_ERROR
    put("corrupt.pdf", b"%PDF-1.7\n%\xe2\xe3\n1 0 obj <</Type /Catalog /Pages 9 0 R>> trailer")
    h.loud["corrupt.pdf"] = PARSE_ERROR
    put("marked.html", "<p>text</p><![foo[ hidden ]]>")
    h.loud["marked.html"] = PARSE_ERROR
    put("binary.txt", bytes(range(256)) * 64)
    h.loud["binary.txt"] = BINARY
    put("latin1.txt", "na\xefve caf\xe9".encode("latin-1"))
    h.loud["latin1.txt"] = ENCODING
    put("empty.txt", b"")
    h.loud["empty.txt"] = EMPTY
    with open(root / "huge.txt", "wb") as f:  # sparse: 300 MB on paper, nothing written
        f.truncate(300 * 2**20)
    h.loud["huge.txt"] = TOO_LARGE
    put("bomb.txt.gz", gzip.compress(bytes(30 * 2**20)))  # 30 MB of NULs in ~30 KB
    h.loud["bomb.txt.gz"] = TOO_LARGE
    put("broken.md.gz", b"\x1f\x8b\x08\x00not really gzip")
    h.loud["broken.md.gz"] = UNREADABLE
    # issue 27: readers bounded by a multiple of their input (slimrag.ingest.bounds)
    leaves = "[" + ",".join(["0"] * 100_000) + "]"  # 100,000 leaves under a 20 KB key path
    put("amplify.json", '{"' + '": {"'.join("k" * 1000 for _ in range(20)) + '": ' + leaves + "}" * 20)
    h.loud["amplify.json"] = TOO_LARGE
    put("xmlbomb.docx", _xml_bomb())
    h.loud["xmlbomb.docx"] = TOO_LARGE

    # -- counted, not warned about -------------------------------------------------------------
    put("image.png", b"\x89PNG\r\n\x1a\n" + bytes(100))
    h.quiet["image.png"] = UNSUPPORTED
    put("program", b"\x7fELF\x02\x01\x01" + bytes(200))
    h.quiet["program"] = UNSUPPORTED
    put(".hidden.txt", "hidden")
    h.quiet[".hidden.txt"] = IGNORED
    return h


def _xml_bomb() -> bytes:
    """A docx-shaped zip whose document part unzips to 40 MiB of XML from about 40 KiB."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("[Content_Types].xml", "<Types/>")
        z.writestr("word/document.xml", b"<w:p/>" * (40 * 2**20 // 6))
    return buf.getvalue()


def remove_deep(root: Path) -> None:
    """Delete the nested folders under ``root / "deep"`` one level at a time, bottom up:
    shutil.rmtree (and so pytest's clean-up of old temporary folders) recurses once per level
    and fails on them."""
    deep = root / "deep"
    if not deep.is_dir():
        return
    levels = [deep]
    while (levels[-1] / "d").is_dir():
        levels.append(levels[-1] / "d")
    for level in reversed(levels):
        for f in level.iterdir():
            if not f.is_dir():
                f.unlink()
        level.rmdir()
