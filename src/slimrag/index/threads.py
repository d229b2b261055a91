"""What lets one open `Index` be searched from many threads at once: a catalog connection per
thread, and a lock that lets searches overlap while the view of the folder changes alone.

Why. A process serving one index (``slimrag serve``'s pools, the MCP worker, the router's planner)
keeps ONE `Index` open and current (`slimrag.rag.session`): one vector view, one slim searcher and
so one cache of recomputed rows, caught up in place when another process writes
(`IndexState.catch_up`) instead of reopened per thread. Two things of an index are not
thread-safe, and this module makes them so:

- **SQLite connections belong to the thread that opened them** (Python's ``check_same_thread``,
  kept on so misuse fails loudly), and the catalog keeps Python-level caches (decoded text blocks,
  the layout chosen at a schema version) per connection. `ThreadCatalogs` gives each thread its own
  `Catalog` on the folder's catalog file, opened on the thread's first use (one ``open`` and three
  pragmas: ~0.2 ms). A thread's catalog is closed when the thread ends (its thread-local slot is
  dropped on that thread), by `ThreadCatalogs.release` on it, or, for the thread that closes the
  index, by `ThreadCatalogs.close`; after that, every other thread closes its own at its next use
  and gets `sqlite3.ProgrammingError`, as a closed catalog's queries always raised. A catalog
  *file* replaced under the folder (``build --force`` swaps in a new index) is followed by
  `renew`: each thread reopens at its next use.
- **The vector view is mutated by catch-up and by this handle's own writes** (a delta part
  appended, the liveness mask re-read, a compaction's generation switched in), which a search in
  flight must not see half done. `ReadWrite` lets any number of searches hold it shared and a
  mutation hold it alone; the writer side is re-entrant for its thread (a write's ``refresh`` inside
  ``locked``). A mutation that waits goes before searches that arrive after it (under 8 threads
  searching without a pause, a catch-up would otherwise wait for a gap that never comes), so a
  thread must not take it shared twice, nor ask for it alone while holding it shared (nothing
  does: a search takes it once and never mutates the view). Mutations are short (a manifest read,
  a few mmaps, one ``live_ids`` query), so a search waits at most that long; searches never wait
  for each other.

Cost per search: one uncontended condition acquire and release, well under a microsecond beside
the milliseconds of an embedding.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from slimrag.catalog import Catalog


class ThreadCatalogs:
    """One `Catalog` per thread on the catalog file at ``path`` (module header). ``first`` is the
    catalog the opening thread already has."""

    def __init__(self, path: Path, first: Catalog) -> None:
        self.path = Path(path)
        self._local = threading.local()
        self._epoch = 0  # moved by `renew` and `close`: a thread's catalog of an older epoch is reopened
        self._closed = False
        self._local.catalog, self._local.epoch = first, 0

    def get(self) -> Catalog:
        """This thread's catalog, opened on first use. Once the index is closed, a thread's own
        is closed at its next use and `sqlite3.ProgrammingError` raised, as a closed catalog's
        queries raise."""
        held: Catalog | None = getattr(self._local, "catalog", None)
        if held is not None and self._local.epoch == self._epoch:
            return held
        self.release()
        if self._closed:
            raise sqlite3.ProgrammingError(f"the index of {self.path.parent} is closed; open it again")
        fresh = Catalog(self.path)
        self._local.catalog, self._local.epoch = fresh, self._epoch
        return fresh

    def renew(self) -> None:
        """The file was replaced: every thread reopens its catalog at its next use."""
        self._epoch += 1

    def release(self) -> None:
        """Close this thread's catalog now (a worker thread that stops using the index)."""
        held: Catalog | None = getattr(self._local, "catalog", None)
        if held is not None:
            held.close()
            del self._local.catalog

    def close(self) -> None:
        """Close this thread's catalog; the others close theirs at their next use or their end."""
        self._closed = True
        self._epoch += 1
        self.release()


class ReadWrite:
    """Shared holds for searches, an exclusive and re-entrant one for mutations (module header)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer: int | None = None  # the thread holding it alone
        self._depth = 0
        self._waiting = 0  # mutations waiting: new searches let them go first

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Held shared over a ``with`` block: waits while another thread mutates or waits to."""
        me = threading.get_ident()
        with self._cond:
            while self._writer != me and (self._writer is not None or self._waiting):
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Held alone over a ``with`` block: waits for the searches in flight to end."""
        me = threading.get_ident()
        with self._cond:
            if self._writer != me:
                self._waiting += 1
                try:
                    while self._writer is not None or self._readers:
                        self._cond.wait()
                except BaseException:  # interrupted while waiting: let the searches it held back go
                    self._waiting -= 1
                    self._cond.notify_all()
                    raise
                self._waiting -= 1
                self._writer = me
            self._depth += 1
        try:
            yield
        finally:
            with self._cond:
                self._depth -= 1
                if not self._depth:
                    self._writer = None
                    self._cond.notify_all()
