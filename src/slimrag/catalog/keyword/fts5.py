"""The FTS5 keyword index: what catalogs made before the postings hold, and ``detail=none`` or
``full`` asked for by name.

In the compact layout the FTS5 table is external content over the ``chunk_text`` view, so the
text is stored once, and a delete trigger removes a deleted chunk's terms (and tombstones it).
``detail=full`` keeps term positions and counts and chunk lengths (``columnsize``), so a query
reads only the index; ``detail=none`` (with ``columnsize=0``) keeps only which chunks hold a
term, and FTS5 re-reads and re-tokenizes each matched chunk to score it: the same scores for
~0.45 of the bytes and 13-25x slower queries. The legacy layout's FTS5 table is over
``chunks.text`` and kept by that layout's own triggers (`slimrag.catalog.schema`).

Knobs
    `MERGE_PAGES` = 500: pages a bounded merge step (`Fts5Keywords.merge` with ``full=False``)
    works through, so the compaction of a large index does not rewrite all of it each time.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from slimrag.catalog.keyword.base import ChunkSource, KeywordDamage
from slimrag.catalog.keyword.words import match_expression
from slimrag.catalog.schema import BLOCK_OF

MERGE_PAGES = 500


def tables(detail: str, columnsize: bool | None = None) -> list[str]:
    """The compact layout's FTS5 table of ``detail`` over ``chunk_text`` and the trigger that
    keeps it (and the tombstones) current when chunks are deleted. ``columnsize=0`` goes with
    ``detail=none`` unless ``columnsize`` says otherwise: ``none`` re-reads each matched chunk
    anyway, and keeping the lengths bought only 15% of its query time for 2% more bytes
    (disfl_qa, `bench.text_store details`)."""
    if columnsize is None:
        columnsize = detail != "none"
    return [
        "CREATE VIRTUAL TABLE chunks_fts USING fts5(text, content='chunk_text', content_rowid='chunk_id', "
        f"detail={detail}{'' if columnsize else ', columnsize=0'})",
        f"""CREATE TRIGGER chunks_ad AFTER DELETE ON chunks BEGIN
    INSERT INTO chunks_fts(chunks_fts, rowid, text) SELECT 'delete', old.chunk_id,
        slimrag_text(old.chunk_id, b.first, b.body) FROM blocks b WHERE b.first=({BLOCK_OF.format(id='old.chunk_id')});
    INSERT OR IGNORE INTO tombstones(chunk_id) VALUES (old.chunk_id);
END""",
    ]


def detail_of(db: sqlite3.Connection) -> str | None:
    """The ``detail`` option of the catalog's FTS5 table (``full`` when not given), or None when
    it has none."""
    row = db.execute("SELECT sql FROM sqlite_schema WHERE name='chunks_fts'").fetchone()
    if row is None:
        return None
    sql = row[0].replace(" ", "").lower()
    for d in ("none", "column"):
        if f"detail={d}" in sql:
            return d
    return "full"


def drop(db: sqlite3.Connection) -> None:
    """Drop the FTS5 table and its delete trigger (inside the caller's transaction)."""
    db.execute("DROP TRIGGER IF EXISTS chunks_ad")
    db.execute("DROP TABLE IF EXISTS chunks_fts")


class Fts5Keywords:
    """`KeywordIndex` on the catalog's FTS5 table. ``compact``: the catalog's layout, which decides
    how a chunk finds its source (a source filter) and whether new rows need indexing (the legacy
    layout's insert trigger does it)."""

    def __init__(self, db: sqlite3.Connection, detail: str, compact: bool) -> None:
        self.db, self.kind, self.compact = db, detail, compact

    def add(self, rows: Sequence[tuple[int, str]]) -> None:
        if self.compact:
            self.db.executemany("INSERT INTO chunks_fts(rowid, text) VALUES (?,?)", rows)

    def search(self, query: str, k: int, source_glob: str | None,
               chunks: ChunkSource) -> list[tuple[int, float]]:
        match = match_expression(query, self.kind)
        if match is None:
            return []
        if not source_glob:
            sql = "SELECT f.rowid, -bm25(chunks_fts) FROM chunks_fts f WHERE chunks_fts MATCH ? "
            args: tuple[Any, ...] = (match, k)
        else:
            sql = ("SELECT f.rowid, -bm25(chunks_fts) FROM chunks_fts f JOIN chunks c ON c.chunk_id=f.rowid "
                   + ("JOIN documents d ON d.doc=c.doc WHERE chunks_fts MATCH ? AND d.source GLOB ? " if self.compact
                      else "WHERE chunks_fts MATCH ? AND c.source GLOB ? "))
            args = (match, source_glob, k)
        sql += "ORDER BY bm25(chunks_fts) LIMIT ?"
        return [(int(r[0]), float(r[1])) for r in self.db.execute(sql, args)]

    def check(self) -> list[KeywordDamage]:
        """FTS5's ``integrity-check`` (the index against the chunks' text); a write statement:
        call it with no write transaction of another connection pending for long."""
        try:
            self.db.execute("INSERT INTO chunks_fts(chunks_fts, rank) VALUES('integrity-check', 1)")
        except sqlite3.DatabaseError as e:  # SQLITE_CORRUPT_VTAB: the keyword index disagrees
            return [KeywordDamage(f"fts5: {e}")]
        return []

    def rebuild(self) -> None:
        self.db.execute("INSERT INTO chunks_fts(chunks_fts) VALUES('rebuild')")

    def merge(self, full: bool) -> None:
        """``full``: FTS5 ``optimize`` (one b-tree of terms instead of one per commit, ~7% smaller
        on disfl_qa); else a ``merge`` step of `MERGE_PAGES`."""
        if full:
            self.db.execute("INSERT INTO chunks_fts(chunks_fts) VALUES('optimize')")
        else:
            self.db.execute("INSERT INTO chunks_fts(chunks_fts, rank) VALUES('merge', ?)", (MERGE_PAGES,))

    def forget(self) -> None:
        """Nothing is cached here: SQLite reads FTS5's pages."""
