"""`AddReport`: what an add, build or sync did to each input, counted by outcome.

Every input the add met ends in one outcome: added, updated, unchanged, or skipped for one reason
from the fixed set in `slimrag.ingest.outcome` (unsupported type, binary, encoding, too large,
ignored, symlink outside the folder, unreadable, parse error, no text). The summary line counts
them all, so a folder of 11 files never reports "2 added, 0 skipped"; `listing` names the files
behind each count (``--verbose`` and ``--json``).

The names of added, updated and unchanged documents are known only when the writer records them
with `note`; the skipped ones always are.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from slimrag.ingest.outcome import ADDED, SKIP_REASONS, UNCHANGED, UPDATED, Skipped, counted

log = logging.getLogger("slimrag.index")

OUTCOMES = (ADDED, UPDATED, UNCHANGED)


@dataclass
class AddReport:
    """What an `add` (or `build`) did: counts by outcome, the skipped inputs with their reasons,
    and (when the writer notes them) the sources behind each count."""

    added: int = 0
    updated: int = 0
    unchanged: int = 0
    chunks: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    seconds: float = 0.0
    #: chunks embedded by this run: its own, and any an earlier, interrupted run left awaiting vectors
    embedded: int = 0
    #: seconds from the start of the write until every chunk's text was stored (keyword search and
    #: evidence answers cover the input from then on; the rest of ``seconds`` is embedding)
    searchable_s: float | None = None
    #: outcome (added / updated / unchanged) → sources, in the order they were written
    files: dict[str, list[str]] = field(default_factory=dict)

    def skip(self, source: str, reason: str, kind: str = "") -> None:
        """Record an input passed over, with one warning line (an info line for the quiet reasons:
        ignored, unsupported type); the same wherever it was parsed. ``kind`` defaults to the
        reason the message starts with."""
        s = Skipped(source, reason, kind)
        (log.info if s.quiet else log.warning)("skipped %s: %s", source, reason)
        self.skipped.append(s)

    def note(self, outcome: str, source: str) -> None:
        """Count one document as added, updated or unchanged, and remember its source."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
        setattr(self, outcome, getattr(self, outcome) + 1)
        self.files.setdefault(outcome, []).append(source)

    def skipped_by_reason(self) -> dict[str, int]:
        """Skip counts by reason, in the fixed order of `SKIP_REASONS`, reasons with none left out."""
        counts = {k: 0 for k in SKIP_REASONS}
        for s in self.skipped:
            counts[s.kind] = counts.get(s.kind, 0) + 1
        return {k: n for k, n in counts.items() if n}

    @property
    def total(self) -> int:
        """Every input met: documents read (added, updated, unchanged) and entries skipped."""
        return self.added + self.updated + self.unchanged + len(self.skipped)

    def summary(self) -> str:
        """One line: ``3 added, 0 updated, 1 unchanged, 12 chunks, 4 skipped (2 ignored, 1 binary,
        1 too large) in 1.2s``, naming the chunks an earlier, interrupted run left that this one
        embedded (``0 chunks, 8,384 chunks left by an earlier run embedded, ...``)."""
        reasons = ", ".join(f"{n} {k}" for k, n in self.skipped_by_reason().items())
        # chunks an earlier, interrupted run left awaiting vectors, embedded now: the run's work too
        left = self.embedded - self.chunks
        earlier = f"{counted(left, 'chunk', ',')} left by an earlier run embedded, " if left > 0 else ""
        return (f"{self.added} added, {self.updated} updated, {self.unchanged} unchanged, {counted(self.chunks, 'chunk')}, "
                f"{earlier}{len(self.skipped)} skipped{f' ({reasons})' if reasons else ''} in {self.seconds:.1f}s")

    def listing(self) -> dict[str, list[str]]:
        """The sources behind each count: outcome or skip reason → sources (empty ones left out)."""
        out = {k: list(self.files[k]) for k in OUTCOMES if self.files.get(k)}
        for s in self.skipped:
            out.setdefault(s.kind, []).append(s.source)
        return out

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data: counts, skip counts by reason, every skip with its
        message, and the listing."""
        return {"added": self.added, "updated": self.updated, "unchanged": self.unchanged, "chunks": self.chunks,
                "seconds": self.seconds, "embedded": self.embedded,
                "searchable_s": self.searchable_s, "skipped_by_reason": self.skipped_by_reason(),
                "skipped": [{"source": s.source, "reason": s.reason, "kind": s.kind} for s in self.skipped],
                "files": self.listing()}
