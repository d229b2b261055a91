"""What the CLI's messages about stored names need beyond the matching itself (which lives in
`slimrag.index.sources`, so `Index.remove` reads a path as ``slimrag remove`` does)."""

from __future__ import annotations

from collections.abc import Sequence


def example_names(names: Sequence[str], n: int = 3) -> str:
    """A few stored names, for an error message that shows what names look like."""
    shown = ", ".join(repr(s) for s in list(names)[:n])
    return shown + (", ..." if len(names) > n else "") if names else "(the index is empty)"
