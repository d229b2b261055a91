"""`AddReport`: what an add, build or sync did to each input, counted by outcome."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from slimrag.ingest.crawl import Skipped

log = logging.getLogger("slimrag.index")


@dataclass
class AddReport:
    """What an `add` (or `build`) did."""

    added: int = 0
    updated: int = 0
    unchanged: int = 0
    chunks: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    seconds: float = 0.0

    def skip(self, source: str, reason: str) -> None:
        """Record a document passed over, with one warning line (the same wherever it was parsed)."""
        log.warning("skipped %s: %s", source, reason)
        self.skipped.append(Skipped(source, reason))
