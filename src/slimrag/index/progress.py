"""Progress of a whole add run (build, add, and later sync), reported to one callback.

Why: the embedder's own bar (`Embedder.embed`'s tqdm) covers one embedding call, and the writer
embeds once per commit transaction (`writer.COMMIT_CHUNKS`, 2,048 chunks), so on a big folder that
bar restarted every transaction and never knew the files left. Here one `AddTracker` lives for the
whole run and hands an `AddProgress` snapshot (files done of the total, chunks embedded, elapsed
seconds) to a `ProgressFn` after every file read and every embedded step; how to draw it (a bar
on a terminal, log lines elsewhere) is the caller's, see `slimrag.cli.progress`.

How a caller subscribes: ``with reporting(fn): Index.build(...)`` (or ``idx.add(...)``). The
tracker sits in a context variable rather than in a parameter so that `Index.build`, `Index.add`
and anything composed of several adds (a sync) report to one display without every signature
between the CLI and the writer carrying it; outside a ``reporting`` block the writer sees
`NULL_TRACKER` and behaves exactly as before (one embed call per transaction, the embedder's own
bar on a terminal).

What a tracked run costs:

- The crawl is listed before the first file is read (`AddTracker.counts_files`), so the total is
  known: one `os.scandir` walk held as a list of small `InputItem`s, negligible next to reading
  and embedding. Inline ``(source, text)`` inputs are materialized too (a caller streaming huge
  inline texts should not subscribe).
- Each transaction is embedded in steps of ``STEP_BATCHES`` embedder batches (default 8: 512
  chunks at the default ``embed_batch`` 64), so the display moves several times per transaction.
  A step is sorted by length inside `Embedder.embed` as a whole transaction was; with chunks
  mostly at the full chunk size the extra padding is small. Measured (MiniLM, 1,024 Python-doc
  paragraphs of mixed length, one call against steps of 512, 5 alternated pairs on the shared
  2-core machine at load ~5): 279 s against 262 s in all, no cost above the noise; the vectors
  agree to 4e-8.

A write runs in two phases (`slimrag.index.writer`): the text of every file is stored first
(`AddTracker.stored`: those chunks are searchable by keyword from then on), then the chunks awaiting
vectors are embedded (`AddTracker.embedding` announces how many, this run's and any an earlier,
interrupted run left). A snapshot carries both counts, so a display can say what is searchable
and how much of it vector search reaches.

Chunks per second and the remaining time are derived from a snapshot (`AddProgress.rate`,
`AddProgress.eta`): the rate counts from the start of embedding (the text phase embeds nothing),
and until the embedding phase announces its count the total is estimated from the chunks per
file read so far.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from slimrag.embed.base import Embedder

#: embedder batches per tracked embedding step: more steps move the display more often, fewer
#: keep more of a transaction's length sorting (see the module header)
STEP_BATCHES = 8


@dataclass(frozen=True, slots=True)
class AddProgress:
    """One snapshot of a run. files_done counts every input met (read, unchanged or skipped),
    as `AddReport.total` does; files_total is None until the crawl is listed. chunks_seen: chunks
    the files read so far were cut into; chunks_done: those embedded (or given with vectors) so far.
    final: the run is over (the last snapshot). chunks_stored: chunks whose text is committed,
    searchable by keyword (and by evidence answers) from then on. chunks_to_embed: the chunks the
    embedding phases of the run announced (None before the first), earlier runs' leftovers
    included. embed_elapsed: seconds since the first embedding phase began (0.0 before)."""

    files_done: int
    files_total: int | None
    chunks_seen: int
    chunks_done: int
    elapsed: float
    final: bool = False
    chunks_stored: int = 0
    chunks_to_embed: int | None = None
    embed_elapsed: float = 0.0

    @property
    def rate(self) -> float:
        """Chunks embedded per second since embedding began (over the whole run when no
        embedding phase was announced: vectors given by Ray ingest); 0.0 before any."""
        seconds = self.embed_elapsed if self.embed_elapsed > 0 else self.elapsed
        return self.chunks_done / seconds if seconds > 0 else 0.0

    @property
    def chunks_expected(self) -> int | None:
        """The run's chunk count: once every file is read and embedding was announced, what it
        announced (plus chunks done otherwise); before, estimated from the chunks per file read so
        far (exact once every file is read); None before any file is read or while the total is
        unknown."""
        if self.files_total is None or self.files_done == 0:
            return self.chunks_to_embed
        if self.files_done >= self.files_total:
            return max(self.chunks_seen, self.chunks_to_embed or 0)
        return max(self.chunks_seen, round(self.chunks_seen / self.files_done * self.files_total))

    @property
    def searchable_share(self) -> float:
        """The share of the expected chunks whose text is stored (0.0 while unknown)."""
        expected = self.chunks_expected
        return min(1.0, self.chunks_stored / expected) if expected else 0.0

    @property
    def embedded_share(self) -> float:
        """The share of the expected chunks embedded (0.0 while unknown; 1.0 when final)."""
        if self.final:
            return 1.0
        expected = self.chunks_expected
        return min(1.0, self.chunks_done / expected) if expected else 0.0

    @property
    def eta(self) -> float | None:
        """Seconds left at the current rate, or None while it cannot be estimated."""
        expected = self.chunks_expected
        if self.final:
            return 0.0
        if expected is None or self.rate <= 0:
            return None
        return max(0, expected - self.chunks_done) / self.rate


ProgressFn = Callable[[AddProgress], None]


class NullTracker:
    """No subscriber: counts nothing and embeds as an untracked add always did."""

    counts_files = False

    def start(self, files: int, done: int = 0) -> None:
        """Ignored."""

    def file(self, chunks: int = 0) -> None:
        """Ignored."""

    def chunks(self, n: int) -> None:
        """Ignored."""

    def stored(self, n: int) -> None:
        """Ignored."""

    def embedding(self, n: int) -> None:
        """Ignored."""

    def embed(self, embedder: Embedder, texts: Sequence[str], batch_size: int) -> np.ndarray:
        """One `Embedder.embed` call (its own bar on a terminal, as before)."""
        return embedder.embed(texts, batch_size=batch_size)


NULL_TRACKER = NullTracker()


class AddTracker(NullTracker):
    """The counters of one run, handed to ``fn`` as an `AddProgress` after every change. Not
    thread-safe: the writer that updates it runs on one thread (the writer lock)."""

    counts_files = True

    def __init__(self, fn: ProgressFn, clock: Callable[[], float] = time.monotonic) -> None:
        self.fn = fn
        self.clock = clock
        self.t0 = clock()
        self.files_total: int | None = None
        self.files_done = 0
        self.chunks_seen = 0
        self.chunks_done = 0
        self.chunks_stored = 0
        self.chunks_to_embed: int | None = None
        self.embed_t0: float | None = None

    def snapshot(self, final: bool = False) -> AddProgress:
        """The counters now."""
        now = self.clock()
        return AddProgress(self.files_done, self.files_total, self.chunks_seen, self.chunks_done,
                           now - self.t0, final, self.chunks_stored, self.chunks_to_embed,
                           now - self.embed_t0 if self.embed_t0 is not None else 0.0)

    def _emit(self) -> None:
        self.fn(self.snapshot())

    def start(self, files: int, done: int = 0) -> None:
        """An add listed ``files`` inputs, ``done`` of them already accounted for (entries the crawl
        skipped). Totals add up, so several adds in one ``reporting`` block share one display."""
        self.files_total = (self.files_total or 0) + files
        self.files_done += done
        self._emit()

    def file(self, chunks: int = 0) -> None:
        """One input met: read and cut into ``chunks`` chunks (0: unchanged or skipped)."""
        self.files_done += 1
        self.chunks_seen += chunks
        self._emit()

    def chunks(self, n: int) -> None:
        """``n`` chunks stored with vectors computed elsewhere (Ray ingest): done without embedding."""
        if n:
            self.chunks_done += n
            self.chunks_to_embed = (self.chunks_to_embed or 0) + n
            self._emit()

    def stored(self, n: int) -> None:
        """``n`` chunks' text committed: searchable by keyword from now on."""
        if n:
            self.chunks_stored += n
            self._emit()

    def embedding(self, n: int) -> None:
        """An embedding phase begins, for ``n`` chunks awaiting vectors (totals add up over the
        writes of one ``reporting`` block; the rate counts from the first)."""
        if self.embed_t0 is None:
            self.embed_t0 = self.clock()
        self.chunks_to_embed = (self.chunks_to_embed or 0) + n
        self._emit()

    def embed(self, embedder: Embedder, texts: Sequence[str], batch_size: int) -> np.ndarray:
        """`Embedder.embed` in steps of `STEP_BATCHES` batches, reporting after each; the same
        rows as one call (row i is text i), without the embedder's per-call bar."""
        step = max(1, batch_size * STEP_BATCHES)
        parts = []
        for s in range(0, len(texts), step):
            part = texts[s: s + step]
            parts.append(embedder.embed(part, batch_size=batch_size, progress=False))
            self.chunks_done += len(part)
            self._emit()
        return np.concatenate(parts) if parts else embedder.embed(texts, batch_size=batch_size, progress=False)

    def finish(self) -> None:
        """Hand over the last snapshot (``final=True``)."""
        self.fn(self.snapshot(final=True))


_CURRENT: ContextVar[NullTracker] = ContextVar("slimrag_add_tracker", default=NULL_TRACKER)


def current_tracker() -> NullTracker:
    """The tracker of the innermost ``reporting`` block, else `NULL_TRACKER` (what the writer calls)."""
    return _CURRENT.get()


@contextmanager
def reporting(fn: ProgressFn) -> Iterator[AddTracker]:
    """Report every add run inside the block to ``fn``, as one run: one tracker for the block,
    its final snapshot handed over when the block ends without an exception."""
    tracker = AddTracker(fn)
    token = _CURRENT.set(tracker)
    try:
        yield tracker
    finally:
        _CURRENT.reset(token)
    tracker.finish()
