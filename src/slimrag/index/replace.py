"""Replacing an index folder (``build --force``, ``Index.create(overwrite=True)``) so that a failure
leaves the old index whole: what may be replaced, and the swap.

`replaceable` refuses anything that is not a slimrag index (a file, a folder whose ``manifest.json``
does not parse as an index's, a non-empty folder without one), deletes what an interrupted create
leaves, and otherwise hands out a hidden sibling folder to build the new index in; `swap_in` puts
it in place by two renames under the old index's writer lock. A process that holds the old index
open follows the swap on its next catch-up (`IndexState.catch_up` reopens a replaced catalog file).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

from slimrag.errors import IndexFormatError
from slimrag.files import fsync_dir
from slimrag.index.store import layout
from slimrag.index.store import manifest as manifest_file
from slimrag.index.store.lock import WriterLock

#: What a create killed before its first manifest can leave in the folder: the catalog (and its
#: WAL files), the empty generation or its temp folder, a temp manifest, the writer lock.
_UNFINISHED = ("catalog.sqlite*", "gen-*", ".tmp-*", ".manifest.json.*", "delta", "writer.lock")
#: infix of the hidden sibling folders of a replacement (``.NAME.new-XXXX``, ``.NAME.old-XXXX``); a
#: crash can leave one beside the index, deleted by hand (it is never read)
_NEW, _OLD = ".new-", ".old-"


def _unfinished_index(folder: Path) -> bool:
    """True for an empty folder, or one holding only what an interrupted create leaves (no
    manifest yet), which ``overwrite`` may delete; anything else is someone's data."""
    return all(any(p.match(pat) for pat in _UNFINISHED) for p in folder.iterdir())


def replaceable(out: Path) -> Path | None:
    """Check that ``overwrite`` may replace the existing ``out``, and say how: None when it holds
    only what an interrupted create leaves (deleted at once), else the empty hidden sibling folder
    to build the replacement in. Raises `IndexFormatError` for anything that is not a slimrag
    index: a file, a folder whose ``manifest.json`` does not parse as an index's (format and
    required fields, not just the file name: a browser extension has a ``manifest.json`` too), or
    a non-empty folder without one."""
    if not out.is_dir():
        raise IndexFormatError(f"{out} is a file, not an index; refusing to replace it. Give a folder for the index")
    if not (out / layout.MANIFEST).is_file():
        if _unfinished_index(out):
            return None
        raise IndexFormatError(f"{out} is a non-empty folder that is not an index; refusing to delete it. "
                               "Choose another folder")
    try:
        manifest_file.read(out)
    except (IndexFormatError, TypeError, ValueError, OSError) as e:
        raise IndexFormatError(f"{out} holds a {layout.MANIFEST} that is not a slimrag index's ({e}); refusing "
                               "to delete it. Choose another folder, or delete it yourself if it is an "
                               "index of another slimrag version") from None
    fresh = Path(tempfile.mkdtemp(prefix=f".{out.name}{_NEW}", dir=out.resolve().parent))
    os.chmod(fresh, stat.S_IMODE(out.stat().st_mode))  # the old index's mode, not mkdtemp's 0700
    return fresh


def swap_in(fresh: Path, out: Path, wait: float | None) -> None:
    """Put the finished index ``fresh`` in the place of the index ``out``: two renames under
    ``out``'s writer lock (a writer busy with the old index finishes first), then the old folder
    is deleted. A failure of the second rename puts the old one back."""
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}{_OLD}", dir=out.resolve().parent))
    with WriterLock(out, wait):
        os.replace(out, old)  # an empty folder is replaced by a rename
        try:
            os.rename(fresh, out)
        except OSError:
            os.rename(old, out)
            raise
    fsync_dir(out.resolve().parent)
    shutil.rmtree(old)
