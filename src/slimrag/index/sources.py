"""Paths as a user types them, matched to the source names an index stores.

Used by `Index.remove` (and so by ``slimrag remove``) and by the CLI's ``--source`` filter; it
lives in the index room so that the Python API and the command line read a path the same way.

An index stores a file's source name by one rule (`slimrag.ingest.source.source_name`): relative
to the folder it was built from (``guide/cats.md`` for ``docs/guide/cats.md`` built from ``docs``),
or absolute for any file outside that folder, and for every file of an index built from files or
texts, which has no such folder. Indexes built before the rule stored the same names, but for a
folder added to an index with no indexed folder (its files relative to that folder): spelling 2
below still finds those. A user types what their shell shows: a path relative to the
current folder (``docs/guide/cats.md``), one relative to the indexed folder (``guide/cats.md``),
an absolute path, a folder (``guide``, ``dpkg``), or a glob (``'guide/*.md'``). This module turns
one such argument into the stored names it means.

Spellings tried, the first that matches anything wins (so a path never removes two different
files by two readings of it):

1. the path resolved against the current folder, relative to the indexed folder (first when it
   exists on disk, since the shell completed it);
2. the argument as typed (a stored name);
3. the resolved path, relative to the indexed folder, when it does not exist on disk;
4. the resolved absolute path (files added from outside the indexed folder).

Each spelling matches: exactly, as a folder (every name under ``spelling/``), or, when the
argument has glob characters (``*``, ``?``, ``[``), as a glob whose ``*`` also crosses ``/``
(SQLite's GLOB, which the catalog's ``source`` filter uses, and `fnmatch.fnmatchcase` agree).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

GLOB_CHARS = frozenset("*?[")


def is_glob(text: str) -> bool:
    """Whether ``text`` has a glob character."""
    return any(c in GLOB_CHARS for c in text)


def escape_glob(text: str) -> str:
    """``text`` as a GLOB pattern that matches only itself (``[`` → ``[[]`` and so on)."""
    return "".join(f"[{c}]" if c in GLOB_CHARS else c for c in text)


def spellings(arg: str, root: str | Path | None, cwd: Path) -> list[str]:
    """The stored-name spellings ``arg`` may stand for, in the order tried (module header)."""
    typed = arg.rstrip("/") or arg
    path = Path(typed).expanduser()
    absolute = (path if path.is_absolute() else cwd / path).resolve()
    relative = None
    if root is not None and absolute.is_relative_to(Path(root)):
        relative = absolute.relative_to(Path(root)).as_posix()
    on_disk = not is_glob(typed) and absolute.exists()
    order = [relative, typed] if on_disk else [typed, relative]
    order.append(absolute.as_posix())
    return list(dict.fromkeys(s for s in order if s and s != "."))


def _matches(spelling: str, names: Sequence[str], glob: bool) -> list[str]:
    if spelling in names:  # before the glob: a stored name may hold '[' itself
        return [spelling]
    if glob:
        return [n for n in names if fnmatch.fnmatchcase(n, spelling)]
    prefix = spelling.rstrip("/") + "/"
    return [n for n in names if n.startswith(prefix)]


def match_one(arg: str, names: Sequence[str], root: str | Path | None, cwd: Path) -> tuple[str, list[str]]:
    """The spelling of ``arg`` that matched and the stored ``names`` it matched (sorted), or
    ``("", [])`` when none did."""
    glob = is_glob(arg)
    for spelling in spellings(arg, root, cwd):
        found = _matches(spelling, names, glob)
        if found:
            return spelling, sorted(found)
    return "", []


@dataclass(frozen=True, slots=True)
class SourceMatch:
    """What a list of arguments matched: the stored ``sources`` (sorted, each once) and the
    arguments that matched ``nothing``, in the order given."""

    sources: list[str]
    nothing: list[str]


@dataclass(frozen=True, slots=True)
class Removal:
    """What `Index.remove_matching` did: the stored ``sources`` removed (sorted), the arguments
    that matched ``nothing`` (each logged as a warning), and the number of ``chunks`` removed."""

    sources: list[str]
    nothing: list[str]
    chunks: int


def match_sources(args: Iterable[str], names: Sequence[str], root: str | Path | None,
                  cwd: Path | None = None) -> SourceMatch:
    """Match each argument (module header) against the stored ``names``."""
    cwd = cwd or Path.cwd()
    found: set[str] = set()
    nothing: list[str] = []
    for arg in args:
        _, hits = match_one(arg, names, root, cwd)
        found.update(hits)
        if not hits:
            nothing.append(arg)
    return SourceMatch(sorted(found), nothing)


def source_glob(arg: str, names: Sequence[str], root: str | Path | None, cwd: Path | None = None) -> str | None:
    """The GLOB pattern for a ``--source`` argument (a stored name, a folder, a path as typed, or a
    glob), or None when it matches no stored name."""
    spelling, hits = match_one(arg, names, root, cwd or Path.cwd())
    if not hits:
        return None
    if hits == [spelling]:  # a stored name, even one with glob characters in it
        return escape_glob(spelling)
    if is_glob(arg):
        return spelling
    return escape_glob(spelling.rstrip("/")) + "/*"
