"""`watch(index, folder)`: keep an index in sync with a folder live, as files change.

Loop: one full `Index.sync` at start (whatever changed while nobody watched), then file events
from `watchfiles` (inotify on Linux, FSEvents on macOS, polling where neither works) are
collected into batches, and each batch ends in one sync:

- a batch closes when no new event came for ``quiet_ms`` (default 500 ms), or ``max_batch_ms``
  (default 1000 ms) after it opened while events keep coming: an editor's save, a ``git
  checkout`` or a copy of 1,000 files costs one sync per second at most, not one per file;
- a batch of at most ``full_sync_paths`` paths (default 256) syncs those paths only
  (`Index.sync(folder, paths=...)`: each path's current state on disk decides, so the order and
  kind of events do not matter); a larger batch, or one that touches a folder or an ignore file,
  syncs the whole folder (a crawl with ``stat`` only for unchanged files). The trade-off: a
  path-only sync costs nothing for the files not named, a full sync costs one ``stat`` per file
  of the folder but needs no trust in the event stream.

Editors' save-by-rename (write ``.name.swp`` or ``name~`` or ``name.tmp``, rename it over
``name``): the batch holds the temporary name (gone, or hidden: nothing stored, nothing to do)
and ``name`` (on disk with new content: updated). Because a sync looks at the disk, not at the
event kinds, the document ends updated, never deleted. Events under hidden folders (``.git``) and
in the index folder itself are dropped before batching, except ignore files.

Stopping: ``stop`` (a `threading.Event`) ends the loop within about ``quiet_ms`` and after the
sync in progress; Ctrl-C raises KeyboardInterrupt out of `watch` (a sync it interrupts is rolled
back by its transaction, and the next sync converges: see `slimrag.index.sync`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import watchfiles

from slimrag.ingest.crawl import IGNORE_FILES

if TYPE_CHECKING:
    from slimrag.index.core import Index
    from slimrag.index.sync import SyncReport

log = logging.getLogger("slimrag.index")


@dataclass(frozen=True, slots=True)
class WatchConfig:
    """How `watch` batches file events (module header). quiet_ms: a batch closes after this long
    without a new event; max_batch_ms: at the latest this long after it opened; full_sync_paths:
    a batch naming more paths syncs the whole folder; rust_timeout_ms: how often the watcher
    wakes with no event, to notice ``stop``."""

    quiet_ms: int = 500
    max_batch_ms: int = 1000
    full_sync_paths: int = 256
    rust_timeout_ms: int = 500

    def __post_init__(self) -> None:
        if self.quiet_ms < 1:
            raise ValueError(f"quiet_ms must be >= 1 ms, got {self.quiet_ms}")
        if self.max_batch_ms < self.quiet_ms:
            raise ValueError(f"max_batch_ms ({self.max_batch_ms}) must be >= quiet_ms ({self.quiet_ms})")
        if self.full_sync_paths < 1:
            raise ValueError(f"full_sync_paths must be >= 1, got {self.full_sync_paths}")
        if self.rust_timeout_ms < 1:
            raise ValueError(f"rust_timeout_ms must be >= 1 ms, got {self.rust_timeout_ms}")


@dataclass(frozen=True, slots=True)
class Batch:
    """One sync of `watch`: how many paths the batch's events named (0 for the initial sync) and
    what the sync did (``report.full`` says whether it looked at the whole folder)."""

    paths: int
    report: SyncReport

    def summary(self) -> str:
        """One line: ``3 paths: 1 added, 1 updated, 1 removed, ...`` or ``full sync: ...``."""
        what = "full sync" if self.report.full else f"{self.paths} path{'s' if self.paths != 1 else ''}"
        return f"{what}: {self.report.summary()}"


def _keeper(folder: Path, index_root: Path) -> Callable[[watchfiles.Change, str], bool]:
    """The event filter: drop events in the index folder and under hidden names (the crawl never
    reads those), except ignore files, which change what the rest means."""

    def keep(change: watchfiles.Change, path: str) -> bool:
        p = Path(path)
        if p.is_relative_to(index_root):
            return False
        try:
            parts = p.relative_to(folder).parts
        except ValueError:
            return True
        if p.name in IGNORE_FILES:
            return True
        return not any(part.startswith(".") for part in parts)

    return keep


def watch(index: Index, folder: str | Path, *, config: WatchConfig | None = None,
          stop: threading.Event | None = None, on_batch: Callable[[Batch], None] | None = None) -> int:
    """Keep ``index`` in sync with ``folder`` until ``stop`` is set (or Ctrl-C): a full sync first,
    then one sync per batch of file events (module header). ``on_batch`` is called after each
    sync (the CLI prints its summary). Returns the number of syncs run. The `Index` must be used
    by this thread only (as always); the writer lock is taken per sync, so other writers (an
    ``add``, a ``compact``) can run between batches."""
    config = config or WatchConfig()
    root = Path(os.path.realpath(folder))
    own = Path(os.path.realpath(index.root))
    syncs = 0
    # The first yield comes once the watcher runs (an empty set after rust_timeout_ms, or the first
    # events): the initial full sync runs then, so no change made after it started is missed.
    for changes in watchfiles.watch(root, watch_filter=_keeper(root, own), debounce=config.max_batch_ms,
                                    step=config.quiet_ms, stop_event=stop, rust_timeout=config.rust_timeout_ms,
                                    yield_on_timeout=True, raise_interrupt=True):
        if syncs and not changes:
            continue  # a timeout: the generator checks ``stop`` itself
        paths = sorted({p for _, p in changes})
        full = not syncs or len(paths) > config.full_sync_paths
        report = index.sync(root, None if full else paths)
        syncs += 1
        if on_batch is not None:
            on_batch(Batch(len(paths), report))
        if stop is not None and stop.is_set():
            break
    return syncs


__all__ = ["Batch", "WatchConfig", "watch"]
