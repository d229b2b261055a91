"""One progress display for a whole build, add (or sync): files done of the total, chunks searchable
(their text stored: keyword search and evidence answers find them), chunks embedded, chunks per
second and the time left, drawn from `slimrag.index.progress.AddProgress` snapshots.

Two ways to draw, chosen by whether the stream (stderr) is a terminal:

- `Bar` (a terminal): one line redrawn in place with ``\\r``, at most every ``BAR_EVERY_S``
  (0.1 s), ended with a newline by the final snapshot. One bar for the run: the writer's commit
  transactions (2,048 chunks each) move it, they do not restart it. ``#`` is the embedded share of
  the chunks, ``+`` the share searchable by keyword only (stored, awaiting vectors), ``.`` the rest.
- `LogLines` (a pipe, a file, CI): a plain line when the first total is known, then whenever
  ``LOG_EVERY_S`` (10 s) have passed or the files done crossed another ``LOG_EVERY_SHARE`` (10%)
  of the total or the chunks embedded another tenth, and a final line with every file counted.
  Nothing is redrawn, so a log stays readable.

Use: ``with show_progress(): Index.build(...)``; the report printed afterwards (`print_report`)
is unchanged.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO

from slimrag.index.progress import AddProgress, reporting
from slimrag.ingest.outcome import counted

#: seconds between two redraws of the terminal bar
BAR_EVERY_S = 0.1
#: seconds after which a log line is written even if the share below was not crossed
LOG_EVERY_S = 10.0
#: share of the files after which a log line is written
LOG_EVERY_SHARE = 0.10
#: width of the bar, in characters
BAR_WIDTH = 24


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``: short enough for a status line."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def describe(p: AddProgress) -> str:
    """The words both displays print: ``files 1098/1098 (100%), 5,120 chunks searchable, 1,024/5,120
    embedded, 84.2 chunks/s, ETA 48s``: chunks searchable have their text stored (keyword search and
    evidence answers find them); embedded ones are found by vector search too. The chunk total is
    marked ``~`` while it is an estimate (files still unread: ``1,024/~64,171 embedded``)."""
    files = f"files {p.files_done}/{p.files_total}" if p.files_total is not None else f"files {p.files_done}"
    if p.files_total:
        files += f" ({100 * p.files_done // p.files_total}%)"
    expected = p.chunks_expected
    # while files are still being read the total is estimated from their bytes: "~" says so
    about = "~" if p.files_total is None or p.files_done < p.files_total else ""
    embedded = (f"{p.chunks_done:,}/{about}{expected:,} embedded" if expected and not p.final and p.chunks_done < expected
                else f"{p.chunks_done:,} embedded")
    parts = [files, f"{counted(p.chunks_stored, 'chunk', ',')} searchable", embedded]
    if p.chunks_done:
        parts.append(f"{p.rate:.1f} chunks/s")
    if p.final:
        parts.append(f"in {duration(p.elapsed)}")
    elif (eta := p.eta) is not None:
        parts.append(f"ETA {duration(eta)}")
    return ", ".join(parts)


class Bar:
    """The terminal display: one line redrawn in place (see the module header)."""

    def __init__(self, stream: IO[str], clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self.clock = clock
        self._last = -float("inf")
        self._width = 0

    def __call__(self, p: AddProgress) -> None:
        now = self.clock()
        if not p.final and now - self._last < BAR_EVERY_S:
            return
        self._last = now
        embedded = round(p.embedded_share * BAR_WIDTH)
        searchable = max(0, round(max(p.searchable_share, p.embedded_share) * BAR_WIDTH) - embedded)
        line = f"[{'#' * embedded}{'+' * searchable}{'.' * (BAR_WIDTH - embedded - searchable)}] {describe(p)}"
        pad = " " * max(0, self._width - len(line))  # wipe what a longer previous line left
        self._width = len(line)
        self.stream.write(f"\r{line}{pad}" + ("\n" if p.final else ""))
        self.stream.flush()


class LogLines:
    """The display for a stream that is not a terminal: plain periodic lines (see the module header)."""

    def __init__(self, stream: IO[str], clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self.clock = clock
        self._last_t: float | None = None
        self._last_step = -1

    def __call__(self, p: AddProgress) -> None:
        now = self.clock()
        step = (int(p.files_done / p.files_total / LOG_EVERY_SHARE) if p.files_total else 0) \
            + int(p.embedded_share / LOG_EVERY_SHARE)
        due = (p.final or self._last_t is None or now - self._last_t >= LOG_EVERY_S or step > self._last_step)
        if not due:
            return
        self._last_t, self._last_step = now, step
        self.stream.write(("indexed: " if p.final else "indexing: ") + describe(p) + "\n")
        self.stream.flush()


def display_for(stream: IO[str]) -> Callable[[AddProgress], None]:
    """`Bar` on a terminal, `LogLines` otherwise."""
    isatty = getattr(stream, "isatty", None)
    return Bar(stream) if isatty is not None and isatty() else LogLines(stream)


@contextmanager
def show_progress(stream: IO[str] | None = None) -> Iterator[None]:
    """Show every add run inside the block as one display on ``stream`` (default: stderr)."""
    with reporting(display_for(stream if stream is not None else sys.stderr)):
        yield
