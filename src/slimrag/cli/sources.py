"""Paths as a user types them, for the CLI: the matching itself lives in `slimrag.index.sources`
(so `Index.remove` reads a path as ``slimrag remove`` does); this module re-exports it and adds
what only messages need."""

from __future__ import annotations

from collections.abc import Sequence

from slimrag.index.sources import (
    SourceMatch,
    escape_glob,
    is_glob,
    match_one,
    match_sources,
    source_glob,
    spellings,
)

__all__ = ["SourceMatch", "escape_glob", "example_names", "is_glob", "match_one", "match_sources",
           "source_glob", "spellings"]


def example_names(names: Sequence[str], n: int = 3) -> str:
    """A few stored names, for an error message that shows what names look like."""
    shown = ", ".join(repr(s) for s in list(names)[:n])
    return shown + (", ..." if len(names) > n else "") if names else "(the index is empty)"
