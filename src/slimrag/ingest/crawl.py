"""Walk a folder and yield the files slimrag should read.

Rules, in order:
- hidden files and folders (name starts with ``.``) are skipped: ``.git``, ``.venv``, editor state;
- ignore patterns in gitignore syntax are honoured: ``.gitignore`` and ``.slimragignore`` files at
  any level (each applies below its own folder, as git does), plus patterns given by the caller;
- a symlinked file is read only when its target stays inside the root folder; a link pointing
  outside is skipped with a warning, so indexing a folder never reads ``/etc``. Symlinked folders
  are never descended into: inside the root their files are indexed under their real path once,
  outside it they are skipped with a warning (and loops cannot happen);
- files without a reader, or larger than ``max_bytes``, are skipped (the latter with a warning).

The walk is sorted, so two builds of the same folder see files in the same order and give the
same chunk ids.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pathspec

from slimrag.ingest.readers import reader_for

log = logging.getLogger("slimrag.ingest")

IGNORE_FILES = (".gitignore", ".slimragignore")


@dataclass(frozen=True, slots=True)
class FoundFile:
    """A file to read: absolute path and the path relative to the root (the stored source)."""

    path: Path
    source: str
    size: int
    mtime: float


@dataclass
class Skipped:
    """A file that was not read, and why (shown to the user as one warning line)."""

    source: str
    reason: str


def _spec(lines: list[str]) -> pathspec.PathSpec:
    return pathspec.PathSpec.from_lines("gitwildmatch", lines)


def crawl(root: Path, ignore: tuple[str, ...] = (), max_bytes: int = 20 * 1024 * 1024,
          skipped: list[Skipped] | None = None) -> Iterator[FoundFile]:
    """Yield readable files under ``root`` in sorted order. Files passed over for a reason worth
    telling (too large, symlink outside) are appended to ``skipped`` and logged once."""
    root = root.resolve()
    if root.is_file():
        st = root.stat()
        yield FoundFile(root, root.name, st.st_size, st.st_mtime)
        return
    specs: list[tuple[Path, pathspec.PathSpec]] = [(root, _spec(list(ignore)))] if ignore else []

    def skip(source: str, reason: str) -> None:
        log.warning("skipped %s: %s", source, reason)
        if skipped is not None:
            skipped.append(Skipped(source, reason))

    def ignored(path: Path, is_dir: bool) -> bool:
        for base, spec in specs:
            try:
                rel = path.relative_to(base).as_posix()
            except ValueError:
                continue
            if spec.match_file(rel + ("/" if is_dir else "")):
                return True
        return False

    for dirpath, dirnames, filenames in os.walk(root):  # does not descend into linked folders
        d = Path(dirpath)
        for n in dirnames:
            if (d / n).is_symlink() and not (d / n).resolve().is_relative_to(root):
                skip((d / n).relative_to(root).as_posix(), "symlink points outside the folder")
        for name in IGNORE_FILES:
            f = d / name
            if f.is_file():
                specs.append((d, _spec(f.read_text(errors="replace").splitlines())))
        dirnames[:] = sorted(n for n in dirnames
                             if not n.startswith(".") and not (d / n).is_symlink() and not ignored(d / n, True))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            p = d / name
            source = p.relative_to(root).as_posix()
            if ignored(p, False) or reader_for(p) is None:
                continue
            if p.is_symlink() and not p.resolve().is_relative_to(root):
                skip(source, "symlink points outside the folder")
                continue
            try:
                st = p.stat()
            except OSError as e:
                skip(source, f"cannot stat ({e.strerror})")
                continue
            if st.st_size > max_bytes:
                skip(source, f"{st.st_size / 2**20:.0f} MiB is over the {max_bytes / 2**20:.0f} MiB limit "
                             "(raise IndexConfig.max_file_bytes to include it)")
                continue
            yield FoundFile(p, source, st.st_size, st.st_mtime)
