"""Walk a folder and yield the files slimrag should read; account for every other entry.

Rules, in order, for each entry of a folder (sorted by name):
- hidden files and folders (name starts with ``.``: ``.git``, ``.venv``, editor state) and entries
  matched by ignore patterns are ``ignored``. Patterns are in gitignore syntax: ``.gitignore`` and
  ``.slimragignore`` files at any level (each applies below its own folder, as git does), plus
  patterns given by the caller. An ignored folder counts once and is not walked. Patterns are
  matched by `slimrag.ingest.ignore` in time linear in the path, so a hostile ``.gitignore``
  cannot hang the walk; a pattern line too long or too complex to use is left out with a warning;
- a file that is text for machines, not prose (`NOT_PROSE_PATTERNS`: stylesheets, SVG, source
  maps, minified scripts, lock files) is ``not prose``: a manual's ``stylesheet.css`` and its
  SVG figures would otherwise be indexed, and cited, as documents. A negated ignore pattern
  includes them again: a ``!*.svg`` line in ``.slimragignore``, or ``--ignore '!*.svg'`` on the
  command line (`IndexConfig.ignore`). A file named directly is read whatever its kind;
- a name that is not valid UTF-8 is skipped (``encoding``): it could not be stored or shown;
- a symlink whose target leaves the root is skipped (``symlink outside the folder``), so indexing a
  folder never reads ``/etc``. A symlinked folder is never descended into: inside the root its
  files are indexed under their real path once (the link itself counts as ``ignored``), so loops
  cannot happen; a symlinked file inside the root is read (unless its target is hidden: then it is
  ``ignored`` too, so a visible link never reads ``.env``), and one that loops is ``unreadable``;
- only regular files are read: a FIFO, socket or device is ``unreadable`` and never opened (an
  open FIFO would block the build forever);
- a file larger than ``max_bytes`` is ``too large`` (judged by ``stat``, never read);
- a name whose suffix is a known binary format (``.png``, ``.xlsx``...) is an ``unsupported type``;
  a name no reader claims is sniffed (first 8 KB: no NUL, UTF-8 or a declared charset) and read
  as plain text when it is text, else it is an ``unsupported type`` too;
- a folder that cannot be listed (permission denied, a path too long) is ``unreadable``, with a
  warning: its files are not silently missing.

The walk keeps its own stack (no recursion: folders nested thousands deep are fine) and is sorted,
depth first, each folder's files before its subfolders, so two builds of the same folder see files
in the same order and give the same chunk ids. A file named directly (``root`` is a file) goes
through the same checks.

Every skip is appended to ``skipped`` with its reason (`slimrag.ingest.outcome`) and logged: a
warning for the loud reasons, an info line for ``ignored`` and ``unsupported type``.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from slimrag.ingest.ignore import IgnoreRules
from slimrag.ingest.outcome import ENCODING, IGNORED, NOT_PROSE, OUTSIDE, UNSUPPORTED, SkipFile, Skipped
from slimrag.ingest.rawfile import looks_like_text, not_regular, os_error, read_bounded, read_head, too_large
from slimrag.ingest.readers import reader_for, refused_by_name

log = logging.getLogger("slimrag.ingest")

IGNORE_FILES = (".gitignore", ".slimragignore")
#: ignore files larger than this are not read (a pattern file is a few KB)
MAX_IGNORE_FILE_BYTES = 1 << 20

#: Files that are text but not prose, skipped as ``not prose`` unless a negated pattern names them
#: (gitignore syntax, matched like the ignore files' patterns).
NOT_PROSE_PATTERNS = (
    "*.css", "*.scss", "*.sass", "*.less", "*.svg", "*.map", "*.min.js", "*.min.mjs", "*.min.css",
    "*.lock", "package-lock.json", "npm-shrinkwrap.json", "pnpm-lock.yaml", "go.sum",
)
_NOT_PROSE = IgnoreRules(NOT_PROSE_PATTERNS, "NOT_PROSE_PATTERNS")

__all__ = ["IGNORE_FILES", "NOT_PROSE_PATTERNS", "FoundFile", "Skipped", "crawl", "printable"]


@dataclass(frozen=True, slots=True)
class FoundFile:
    """A file to read: absolute path and the path relative to the root (the stored source)."""

    path: Path
    source: str
    size: int
    mtime: float


def printable(name: str) -> str:
    """A name as it can be shown and stored: bytes that are not UTF-8 written as ``\\xff``."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # os.fsdecode turned undecodable bytes into lone surrogates
        return False
    return True


class _Walk:
    """One crawl's state: the root, the ignore specs met so far, and where skips go."""

    def __init__(self, root: Path, ignore: tuple[str, ...], max_bytes: int, skipped: list[Skipped] | None) -> None:
        self.root, self.max_bytes, self.skipped = root, max_bytes, skipped
        self.specs: list[tuple[Path, IgnoreRules]] = [(root, IgnoreRules(ignore, "--ignore"))] if ignore else []

    def skip(self, source: str, kind: str, detail: str = "") -> None:
        s = Skipped.because(source, kind, detail)
        (log.info if s.quiet else log.warning)("skipped %s: %s", source, s.reason)
        if self.skipped is not None:
            self.skipped.append(s)

    def refuse(self, source: str, e: SkipFile) -> None:
        self.skip(source, e.kind, e.detail)

    def ignored(self, path: Path, is_dir: bool) -> bool:
        for base, spec in self.specs:
            try:
                rel = path.relative_to(base).as_posix()
            except ValueError:
                continue
            if spec.match(rel + ("/" if is_dir else "")):
                return True
        return False

    def included_again(self, path: Path) -> bool:
        """True when a negated pattern (``!*.svg``) of an ignore file or of the caller names ``path``."""
        for base, spec in self.specs:
            try:
                rel = path.relative_to(base).as_posix()
            except ValueError:
                continue
            if spec.check(rel) is False:
                return True
        return False

    def read_ignore_files(self, d: Path, names: set[str]) -> None:
        for name in IGNORE_FILES:
            if name not in names:
                continue
            try:
                text = read_bounded(d / name, MAX_IGNORE_FILE_BYTES).decode("utf-8", "replace")
            except SkipFile as e:
                self.refuse((d / name).relative_to(self.root).as_posix(), e)
                continue
            origin = printable((d / name).relative_to(self.root).as_posix())
            self.specs.append((d, IgnoreRules(text.splitlines(), origin)))

    def check_file(self, p: Path, source: str, st: os.stat_result) -> FoundFile | None:
        """The checks every file passes, walked or named directly: a regular file, under the
        size limit, of a type slimrag reads."""
        bad = not_regular(st.st_mode)
        if bad is not None:
            self.refuse(source, bad)
            return None
        if refused_by_name(p):
            self.skip(source, UNSUPPORTED, f"no reader for {p.suffix!r} files")
            return None
        if st.st_size > self.max_bytes:
            self.refuse(source, too_large(st.st_size, self.max_bytes))
            return None
        if reader_for(p) is None:
            try:
                head = read_head(p)
            except SkipFile as e:
                self.refuse(source, e)
                return None
            if not looks_like_text(head):
                self.skip(source, UNSUPPORTED, "not text, and no reader for this name")
                return None
        return FoundFile(p, source, st.st_size, st.st_mtime)

    def walk(self) -> Iterator[FoundFile]:
        stack = [self.root]
        while stack:
            d = stack.pop()
            rel_d = d.relative_to(self.root).as_posix()
            try:
                with os.scandir(d) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError as e:
                self.refuse(printable(rel_d) + "/", os_error(e))
                continue
            self.read_ignore_files(d, {e.name for e in entries})
            subdirs: list[Path] = []
            for entry in entries:
                p = d / entry.name
                source = p.relative_to(self.root).as_posix()
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                    is_link = entry.is_symlink()
                except OSError as e:
                    self.refuse(printable(source), os_error(e))
                    continue
                shown = printable(source) + ("/" if is_dir else "")
                if entry.name.startswith("."):
                    self.skip(shown, IGNORED, "hidden")
                    continue
                if self.ignored(p, is_dir):
                    self.skip(shown, IGNORED, "matched an ignore pattern")
                    continue
                if not _utf8(entry.name):
                    self.skip(shown, ENCODING, "file name is not valid UTF-8; rename it to include it")
                    continue
                if is_link:
                    target = Path(os.path.realpath(p))
                    if not target.is_relative_to(self.root):
                        self.skip(source, OUTSIDE, f"points to {printable(str(target))}")
                        continue
                    if any(part.startswith(".") for part in target.relative_to(self.root).parts):
                        # a visible name must not read a hidden file's text (``notes.md -> .env``)
                        self.skip(source, IGNORED, "link to a hidden file or folder")
                        continue
                    if target.is_dir():
                        self.skip(source + "/", IGNORED, "link to a folder inside the root (indexed there)")
                        continue
                if is_dir:
                    subdirs.append(p)
                    continue
                if _NOT_PROSE.match(entry.name) and not self.included_again(p):
                    self.skip(shown, NOT_PROSE, "a stylesheet, image, source map or lock file; "
                                                "a '!' pattern in .slimragignore includes it")
                    continue
                try:
                    st = p.stat()  # follows a link inside the root
                except OSError as e:
                    self.refuse(source, os_error(e))
                    continue
                found = self.check_file(p, source, st)
                if found is not None:
                    yield found
            stack.extend(reversed(subdirs))


def crawl(root: Path, ignore: tuple[str, ...] = (), max_bytes: int = 20 * 1024 * 1024,
          skipped: list[Skipped] | None = None) -> Iterator[FoundFile]:
    """Yield readable files under ``root`` (a folder, or one file) in sorted order. Every entry
    passed over is appended to ``skipped`` with its reason and logged once (see the module
    header). Never raises for one bad entry."""
    root = Path(root)
    try:
        st = root.stat()
    except OSError as e:  # a dangling or looping symlink named directly
        _Walk(root, ignore, max_bytes, skipped).refuse(printable(root.name), os_error(e))
        return
    if stat.S_ISDIR(st.st_mode):
        yield from _Walk(Path(os.path.realpath(root)), ignore, max_bytes, skipped).walk()
        return
    w = _Walk(root.absolute().parent, ignore, max_bytes, skipped)
    if not _utf8(root.name):
        w.skip(printable(root.name), ENCODING, "file name is not valid UTF-8; rename it to include it")
        return
    found = w.check_file(root, root.name, st)
    if found is not None:
        yield FoundFile(Path(os.path.realpath(root)), found.source, found.size, found.mtime)
