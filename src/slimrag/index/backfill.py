"""`Backfill`: embed an index's chunks awaiting vectors on a background thread while it answers.

Progressive indexing (`slimrag.index.coverage`) leaves an index whose text is searchable before
its last vector; a long-running process over such an index (``slimrag serve``) finishes the
embedding itself instead of waiting for a ``build --resume``. The thread writes through the open
`Index` it is given (the server's one index, `slimrag.rag.session`: an `Index` serves many
threads, each with its own catalog connection, so each step's commit is put in the view the
server searches, with no catch-up), or opens its own on a folder with the embedder it is given
(`LocalEmbedder` serializes calls, so a query waits at most one batch behind the backfill). It
calls `Index.embed_awaiting` with a limit of `STEP` chunks at a time, so the writer lock is taken
and released per step and an ``add`` from another process gets in between; compaction is left to
the next ``compact`` or write, as after any add.

`stop` ends the thread after its current step. An error in a step is logged with the exception
and ends the thread (the index keeps every committed part and still answers); the next start, or
a ``build --resume`` or ``sync``, finishes the rest.

One per folder and process: `ensure` returns the backfill already running for a folder (a server
has several worker pools over one index) or starts one.

Knobs: `STEP` (512 chunks: at ~50-100 chunks/s a step holds the writer lock for 5-10 s; smaller
gives other writers more turns at the cost of more manifest switches).
"""

from __future__ import annotations

import logging
import threading
from contextlib import nullcontext
from pathlib import Path

from slimrag.embed.base import Embedder
from slimrag.index.core import Index

#: chunks embedded per writer-lock hold (module header)
STEP = 512

log = logging.getLogger("slimrag.index")

_running: dict[Path, Backfill] = {}  # folder -> its backfill while the thread runs (`ensure`)
_running_lock = threading.Lock()


def ensure(root: str | Path | Index, embedder: Embedder | None = None) -> Backfill:
    """The backfill running in this process for the index at ``root`` (a folder, or an open
    `Index` to write through), or a new one, started."""
    key = Path(root.root if isinstance(root, Index) else root).resolve()
    with _running_lock:
        fill = _running.get(key)
        if fill is None or not fill.running:
            fill = _running[key] = Backfill(root, embedder).start()
        return fill


class Backfill:
    """Embeds the chunks awaiting vectors of the index at ``root`` (a folder, or an open `Index`
    that stays open) on a daemon thread."""

    def __init__(self, root: str | Path | Index, embedder: Embedder | None = None, step: int = STEP) -> None:
        if step < 1:
            raise ValueError(f"step must be >= 1, got {step}")
        self._index = root if isinstance(root, Index) else None
        self.root = root.root if isinstance(root, Index) else Path(root)
        self.embedder, self.step = embedder, step
        #: chunks this backfill embedded so far
        self.embedded = 0
        #: the exception that ended the thread early, if any
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slimrag-backfill", daemon=True)

    def start(self) -> Backfill:
        """Start the thread (once); returns self."""
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        """The thread has started and not ended."""
        return self._thread.is_alive()

    def stop(self, timeout: float | None = None) -> None:
        """Ask the thread to end after its current step and wait up to ``timeout`` seconds."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout)

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to end on its own (every chunk embedded, an error or `stop`)."""
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            with (nullcontext(self._index) if self._index is not None
                  else Index.open(self.root, embedder=self.embedder)) as idx:
                while not self._stop.is_set():
                    n = idx.embed_awaiting(self.step)
                    if not n:
                        break
                    self.embedded += n
            log.info("backfill of %s: %d chunk(s) embedded", self.root, self.embedded)
        except Exception as e:  # kept for the owner and logged; the index keeps what was committed
            self.error = e
            log.exception("backfill of %s stopped after %d chunk(s); the index answers, and "
                          "`slimrag build --resume` or `sync` embeds the rest", self.root, self.embedded)
        finally:
            if self._index is not None:
                self._index.release_thread()
            with _running_lock:
                if _running.get(self.root.resolve()) is self:
                    del _running[self.root.resolve()]
