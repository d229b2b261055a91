"""`Index.sync(folder)`: make the index hold exactly what a fresh build of ``folder`` would hold.

`add` adds or updates and never deletes; `sync` also removes what left the folder. Algorithm,
under one hold of the writer lock (`slimrag.index.store.lock`), so no other writer interleaves:

1. List the folder with the add path's own rules (`ingest.source.iter_inputs`: hidden files,
   ``.gitignore``/``.slimragignore``, ``IndexConfig.ignore``, symlinks, file types, size limit), so
   a file is named exactly as `add` names it and "readable" means what it means for a build.
2. For each listed file, compare the file's ``stat`` with the catalog's documents table: the same
   mtime and size means unchanged, and the file is not opened (``SyncReport.read`` counts the files
   that were). Otherwise the file is read and hashed (`ingest.source.prepare`): the same SHA-256 as
   stored means unchanged after all (a ``touch``, a checkout), and only the stored mtime and size are
   brought up to date so the next sync trusts ``stat`` again; a new hash replaces the old chunks
   (`IndexWriter.write`: text first, in transactions of `writer.COMMIT_CHUNKS` chunks, then the
   embedding of every chunk awaiting vectors, an interrupted build's or sync's included).
3. Remove every stored document *of this folder* that step 2 did not end as added, updated or
   unchanged: deleted files, the old name of a renamed file, and files that can no longer be
   indexed (now ignored, too large, unparsable, empty), as a fresh build would not hold them.

Which documents are "of this folder" (the only candidates for removal, so a sync of folder A never
deletes what came from folder B): names are formed by `add`'s one rule (`ingest.source.source_name`),
relative to the index's source root (the folder it was built from) for a file inside it, absolute
otherwise. So the folder's scope is the prefix ``sub/`` for a subfolder of the root, every relative
name for the root itself, ``/abs/path/`` for a folder outside it (and both, every relative name and
its own absolute prefix, for a folder that contains the root). An index with no source root
(created from files, several inputs or texts) names every file absolutely, so a folder's scope
there is its absolute prefix, plus every relative name: versions before the one naming rule stored
a synced or added folder's files relative to that folder, and the first sync replaces those names
with absolute ones (the files are read and embedded again once). A text added as a
``(source, text)`` pair under a name inside the scope is indistinguishable from a file of the
folder, and a sync removes it when no such file exists. When the index folder itself lies inside
the synced folder it is left out of the listing (an index never indexes itself).

Partial sync (``paths=``, what `slimrag.index.watch` sends after a batch of file events): only the
named paths are looked at, with the same rules (a path is admitted when a walk of the folder would
reach it: no hidden part, no ignore pattern on the way, no symlinked folder; then the crawl's file
checks). A path that no longer exists removes its document, or every document under it when it
was a folder. A touched folder or ignore file changes what many paths mean: the sync becomes full.

Crash safety: the sync keeps no state of its own. Each write it makes is one of the writer's
crash-safe transactions, so a sync killed at any moment (SIGKILL included) leaves a sound index
holding a mix of the old and new folder state, and the next sync, which starts again from
``stat`` and the catalog, converges to the folder.

Knob: `RACY_S` (default 1.0 s). A file whose mtime is less than this before the moment it is read
may be written again within the same mtime tick (coarse file-system clocks, FAT's 2 s) without its
size changing; trusting ``stat`` for it later would miss that edit (git's "racily clean" entries).
Such a document is stored with mtime 0, so the next sync reads and hashes it once more (cheap: no
embedding when the hash is unchanged) and then stores its real mtime. Larger values re-read more
just-written files once; 0 trusts ``stat`` at once.

Cost of a sync with nothing changed: the crawl (one ``scandir`` per folder, one ``stat`` per file,
the ignore files read, the first 8 KB of a file whose name no reader claims sniffed) and one read
of the documents table; no file content is read or hashed.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slimrag.errors import IngestError
from slimrag.index.progress import current_tracker
from slimrag.index.report import AddReport
from slimrag.ingest.crawl import IGNORE_FILES, MAX_IGNORE_FILE_BYTES
from slimrag.ingest.ignore import IgnoreRules
from slimrag.ingest.outcome import ADDED, OUTSIDE, UNCHANGED, UPDATED, SkipFile, Skipped, counted, message
from slimrag.ingest.rawfile import read_bounded
from slimrag.ingest.source import InputItem, PreparedDoc, iter_inputs, prepare, source_name

if TYPE_CHECKING:
    from slimrag.index.state import IndexState
    from slimrag.index.writer import IndexWriter

log = logging.getLogger("slimrag.index")

#: seconds: a file modified this recently before it is read is stored "racily clean" (mtime 0)
RACY_S = 1.0
#: the mtime stored for a racily clean document: no file has it, so the next sync re-reads it
RACY_MTIME = 0.0
REMOVED = "removed"


@dataclass
class SyncReport(AddReport):
    """What a sync did: the counts of an add (added, updated, unchanged, skipped by reason) plus
    the documents ``removed`` and ``read``, the files whose bytes were opened and hashed (new or
    with another mtime or size than stored; an unchanged file is not read). ``paths``: the paths
    a partial sync was given (0 for a full sync)."""

    removed: int = 0
    removed_chunks: int = 0
    read: int = 0
    paths: int = 0
    full: bool = True
    removed_sources: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line: ``2 added, 1 updated, 1 removed, 40 unchanged (3 read), 12 chunks, 1 skipped
        (1 ignored) in 0.3s``."""
        reasons = ", ".join(f"{n} {k}" for k, n in self.skipped_by_reason().items())
        return (f"{self.added} added, {self.updated} updated, {self.removed} removed, {self.unchanged} unchanged "
                f"({self.read} read), {counted(self.chunks, 'chunk')}, {len(self.skipped)} skipped"
                f"{f' ({reasons})' if reasons else ''} in {self.seconds:.1f}s")

    def listing(self) -> dict[str, list[str]]:
        """The sources behind each count, removed ones included."""
        out = super().listing()
        if self.removed_sources:
            out[REMOVED] = list(self.removed_sources)
        return out

    def to_dict(self) -> dict[str, Any]:
        """The add report's JSON plus ``removed``, ``removed_chunks``, ``read``, ``paths``, ``full``."""
        return {**super().to_dict(), "removed": self.removed, "removed_chunks": self.removed_chunks,
                "read": self.read, "paths": self.paths, "full": self.full}


@dataclass(frozen=True, slots=True)
class Scope:
    """The stored names one folder owns (module header): names relative to the source root that
    start with ``relative`` and absolute names that start with ``absolute`` (None: none of that
    kind). A folder that contains the source root owns both kinds."""

    relative: str | None
    absolute: str | None

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        prefix = self.absolute if name.startswith("/") else self.relative
        return prefix is not None and name.startswith(prefix)


def name_of(path: Path, naming_root: Path | None) -> str:
    """The stored name of ``path`` (which need not exist): `ingest.source.source_name`, the one
    naming rule (relative to ``naming_root`` when inside it, else absolute)."""
    return source_name(path, naming_root)


def scope_of(folder: Path, naming_root: Path | None) -> Scope:
    """The names ``folder`` (resolved) owns in an index whose names are relative to ``naming_root``
    (its source root; None when it has none, module header)."""
    if naming_root is None:  # every name absolute; relative ones are names of the older rule
        return Scope("", folder.as_posix().rstrip("/") + "/")
    if folder == naming_root:
        return Scope("", None)
    if naming_root.is_relative_to(folder):  # the root inside the folder: all of the root's names too
        return Scope("", folder.as_posix().rstrip("/") + "/")
    name = name_of(folder, naming_root)
    return Scope(None, name + "/") if name.startswith("/") else Scope(name + "/", None)


class IndexSync:
    """`sync`, a part of `Index` built on its state and its writer (`slimrag.index.state`), which
    makes every change. Not thread-safe."""

    def __init__(self, state: IndexState, writer: IndexWriter) -> None:
        self.state = state
        self.writer = writer

    def sync(self, folder: str | Path, paths: Iterable[str | Path] | None = None) -> SyncReport:
        """Make this index hold exactly the readable files of ``folder`` (module header): new and
        changed files are added, deleted, renamed and no-longer-readable ones removed, unchanged
        ones (same mtime and size as stored) not read. Documents from outside the folder are left
        alone. ``paths``: look only at these (absolute, or relative to ``folder``; a deleted
        folder's path removes everything under it); None syncs the whole folder. Holds the writer
        lock throughout. Raises IngestError when ``folder`` is not a folder."""
        if not Path(folder).is_dir():
            raise IngestError(f"{folder} is not a folder; sync mirrors a folder (use add for single files)")
        with self.state.locked():
            return _Sync(self.state, self.writer, Path(os.path.realpath(folder))).run(paths)


class _Sync:
    """One sync's state: the folder, how names are formed, the stored documents in scope."""

    def __init__(self, state: IndexState, writer: IndexWriter, folder: Path) -> None:
        self.state, self.writer, self.folder = state, writer, folder
        root = state.manifest.source_path
        self.naming_root = root
        if root and not root.is_dir() and not folder.is_relative_to(root):
            log.warning("%s: the folder it was built from, %s, is gone, and %s is not inside it: its files are "
                        "stored under absolute names, beside the old ones. If the folder moved, rebuild the "
                        "index from its new place (slimrag build FOLDER -o INDEX --force)", state.root, root, folder)
        self.scope = scope_of(folder, self.naming_root)
        self.ignore = tuple(state.config.ignore)
        own = Path(os.path.realpath(state.root))
        if own.is_relative_to(folder) and own != folder:  # never index the index
            self.ignore += ("/" + glob_escape(own.relative_to(folder).as_posix()) + "/",)
        self.stored = {d.source: d for d in state.catalog.documents() if d.source in self.scope}
        self.report = SyncReport()
        self.touched: list[tuple[float, int, str]] = []  # read, hash unchanged: (mtime, size, source)

    def run(self, paths: Iterable[str | Path] | None) -> SyncReport:
        t0 = time.perf_counter()
        full, present, owned = True, set(), set(self.stored)
        if paths is not None:
            targets = [p if Path(p).is_absolute() else self.folder / p for p in paths]
            full = any(_needs_full(Path(p)) for p in targets)
            if not full:
                self.report.full, self.report.paths = False, len(targets)
                items, owned = self._partial(Path(p) for p in targets)
        if full:
            items = iter_inputs(self.folder, self.naming_root, self.ignore, self.state.config.max_file_bytes,
                                self.report.skipped)
        self.writer.write(self._prepare(items), self.report)
        for outcome in (ADDED, UPDATED, UNCHANGED):
            present.update(self.report.files.get(outcome, ()))
        self._store_touched()
        gone = sorted(s for s in owned if s not in present)
        if gone:
            self.report.removed_chunks = self.writer.remove_sources(gone)
            self.report.removed, self.report.removed_sources = len(gone), gone
        self.report.seconds = time.perf_counter() - t0
        return self.report

    def _prepare(self, items: Iterable[InputItem]) -> Iterator[PreparedDoc]:
        """Unchanged files (stat equal to the stored mtime and size) are noted and not read; the
        rest are read, hashed and chunked, stored racily clean when just written (`RACY_S`).
        Under a progress display (`slimrag.index.progress`) the listing is taken first, for its total."""
        tracker = current_tracker()
        if tracker.counts_files:
            items = list(items)
            tracker.start(len(items) + len(self.report.skipped), done=len(self.report.skipped))
        for item in items:
            if item.source not in self.scope:
                tracker.file()
                continue  # a symlink to a file of another folder: named there, synced there
            try:
                st = os.stat(item.path) if item.path is not None else None
            except OSError:
                st = None  # vanished since the listing: prepare reports why
            old = self.stored.get(item.source)
            if st is not None and old is not None and old.mtime == st.st_mtime and old.size == st.st_size:
                self.report.note(UNCHANGED, item.source)
                tracker.file()
                continue
            if st is not None and time.time() - st.st_mtime < RACY_S:
                item = replace(item, mtime=RACY_MTIME)
            self.report.read += 1
            doc = prepare(item, old.doc_id if old is not None else None, self.writer.chunker)
            if isinstance(doc, Skipped):
                self.report.skip(doc.source, doc.reason, doc.kind)
                tracker.file()
                continue
            if old is not None and doc.doc_id == old.doc_id and st is not None:
                self.touched.append((item.mtime, st.st_size, item.source))
            tracker.file(len(doc.pieces))
            yield doc

    def _store_touched(self) -> None:
        """Bring the stored mtime and size of documents read but unchanged (same hash) up to date,
        so the next sync trusts ``stat`` for them. One transaction; the chunks are not touched."""
        if not self.touched:
            return
        with self.state.catalog.transaction():
            self.state.catalog.touch_documents(self.touched)

    def _partial(self, targets: Iterable[Path]) -> tuple[list[InputItem], set[str]]:
        """The inputs among ``targets`` (files a walk of the folder would reach, named as it names
        them) and the stored names these targets own (each target's own name, and the names under
        it when it was a folder): those not re-added are removed."""
        rules = _Rules(self.folder, self.ignore)
        items: list[InputItem] = []
        owned: set[str] = set()
        for path in dict.fromkeys(targets):
            if not path.is_relative_to(self.folder):
                log.warning("%s is outside %s; not synced", path, self.folder)
                continue
            name = name_of(path, self.naming_root)
            owned.update(s for s in self.stored if s == name or s.startswith(name + "/"))
            if not os.path.lexists(path) or not rules.admits(path):
                continue
            if not Path(os.path.realpath(path)).is_relative_to(self.folder):
                link = Path(os.path.abspath(path))  # the link's own name, as the crawl shows it
                root = self.naming_root
                shown = link.relative_to(root).as_posix() if root and link.is_relative_to(root) else link.as_posix()
                self.report.skip(shown, message(OUTSIDE, f"points to {os.path.realpath(path)}"), OUTSIDE)
                continue
            items += iter_inputs(path, self.naming_root, (), self.state.config.max_file_bytes, self.report.skipped)
        return items, owned


def _needs_full(path: Path) -> bool:
    """A path whose change can alter what many others mean: an ignore file, or a folder (a folder
    moved in brings files no event named)."""
    return path.name in IGNORE_FILES or path.is_dir()


def glob_escape(text: str) -> str:
    """``text`` as a gitignore pattern matching only itself."""
    return "".join("\\" + c if c in "*?[]!#\\" else c for c in text)


class _Rules:
    """Whether a walk of ``folder`` (`ingest.crawl`) would reach a path: no hidden part, no
    ignore pattern (the caller's, and each ignore file from the folder down to the path's parent)
    matching it or a folder on its way, no symlinked folder on its way. Ignore files are read
    once per folder per sync. Patterns match through `slimrag.ingest.ignore` (linear in the
    path), so a hostile ``.gitignore`` cannot hang ``sync PATHS`` or ``watch`` either."""

    def __init__(self, folder: Path, ignore: tuple[str, ...]) -> None:
        self.folder = folder
        self.base = [(folder, IgnoreRules(ignore, "--ignore"))] if ignore else []
        self.per_dir: dict[Path, list[tuple[Path, IgnoreRules]]] = {}

    def _specs_in(self, d: Path) -> list[tuple[Path, IgnoreRules]]:
        if d not in self.per_dir:
            found = []
            for name in IGNORE_FILES:
                if (d / name).is_file():
                    try:
                        text = read_bounded(d / name, MAX_IGNORE_FILE_BYTES).decode("utf-8", "replace")
                    except SkipFile as e:
                        log.warning("%s: %s; its patterns are not applied", d / name, e)
                        continue
                    found.append((d, IgnoreRules(text.splitlines(), str(d / name))))
            self.per_dir[d] = found
        return self.per_dir[d]

    def admits(self, path: Path) -> bool:
        parts = path.relative_to(self.folder).parts
        specs = list(self.base)
        d = self.folder
        for i, part in enumerate(parts):
            specs += self._specs_in(d)
            p = d / part
            last = i == len(parts) - 1
            if part.startswith(".") or (not last and p.is_symlink()):
                return False
            for base, spec in specs:
                if spec.match(p.relative_to(base).as_posix() + ("" if last else "/")):
                    return False
            d = p
        return True


__all__ = ["RACY_S", "IndexSync", "Scope", "SyncReport", "name_of", "scope_of"]
