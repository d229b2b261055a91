"""What the catalog asks of a keyword index, whichever kind it is.

Two kinds stand behind this interface: the postings (`slimrag.catalog.keyword.postings`, the
default) and FTS5 (`slimrag.catalog.keyword.fts5`, what catalogs made before the postings hold).
Both rank by FTS5's BM25, ids and scores bit for bit, so a caller never needs to know which it
has; `slimrag.catalog.keyword.open_index` is the one place that decides.

Writes (`add`, `rebuild`, `merge`) run inside the caller's write transaction. A damaged index is
reported by `check` as `KeywordDamage`, which `rebuild` repairs from the chunks' stored text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class KeywordDamage(str):
    """One problem `KeywordIndex.check` found: a message (``keyword: ...`` or ``fts5: ...``) whose
    type says that `KeywordIndex.rebuild` repairs it, where SQLite's own damage cannot be."""

    __slots__ = ()


class ChunkSource(Protocol):
    """What a search reads of the catalog besides the index: passed per call, never kept, so an
    index holds no reference back to its catalog (an unclosed catalog is freed when dropped)."""

    def texts(self, ids: Sequence[int]) -> list[str]:
        """Texts of chunks in the order of ``ids`` (a phrase re-reads its candidate chunks)."""
        ...

    def live_ids(self, source_glob: str | None = None) -> list[int]:
        """Ids of the stored chunks, ascending; with a glob only those whose source matches."""
        ...


class KeywordIndex(Protocol):
    """BM25 keyword search over the chunks' text, and its upkeep."""

    #: ``postings``, or FTS5's detail option (``full``, ``none``, ``column``)
    kind: str

    def add(self, rows: Sequence[tuple[int, str]]) -> None:
        """Index chunks ``(chunk_id, text)`` whose rows were just stored."""
        ...

    def search(self, query: str, k: int, source_glob: str | None,
               chunks: ChunkSource) -> list[tuple[int, float]]:
        """The ``k`` best chunks for ``query``: (chunk_id, -bm25) best first."""
        ...

    def check(self) -> list[KeywordDamage]:
        """What disagrees between the index and the stored chunks; empty when nothing does."""
        ...

    def rebuild(self) -> None:
        """Index every stored chunk's text anew (repairs what `check` reports)."""
        ...

    def merge(self, full: bool) -> None:
        """Merge the index's parts: all of them when ``full``, else a bounded step."""
        ...

    def forget(self) -> None:
        """Drop what is cached from the file (after a rollback or a delete)."""
        ...
