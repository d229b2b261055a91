"""The keyword index: BM25 over the chunks' text, two kinds behind one interface.

- `base`: `KeywordIndex`, what the catalog asks of either kind, and `KeywordDamage`.
- `postings`: the default: BM25 postings without positions in zstd blocks (`postings_block`),
  tokenized by FTS5's own tokenizer (`tokenizer`), scored as FTS5 scores (`bm25`), bit for bit.
- `fts5`: FTS5 itself, with or without positions (catalogs made before the postings).
- `words`: a query's words, and FTS5 match expressions.

`open_index` is the one place that decides which kind a catalog holds; `create` and `drop`
are the only places that make or remove one.
"""

from __future__ import annotations

import sqlite3

from slimrag.catalog.keyword import fts5, postings
from slimrag.catalog.keyword.base import ChunkSource, KeywordDamage, KeywordIndex

__all__ = ["ChunkSource", "KeywordDamage", "KeywordIndex", "create", "drop", "kind_of", "open_index"]


def kind_of(db: sqlite3.Connection) -> str:
    """The kind of keyword index ``db`` holds: ``postings``, or FTS5's ``detail`` option (``full``
    when not given, and for a catalog with none yet)."""
    if postings.present(db):
        return "postings"
    return fts5.detail_of(db) or "full"


def open_index(db: sqlite3.Connection, compact: bool) -> KeywordIndex:
    """The keyword index of the catalog on ``db`` (``compact``: its layout)."""
    kind = kind_of(db)
    return postings.Postings(db) if kind == "postings" else fts5.Fts5Keywords(db, kind, compact)


def create(db: sqlite3.Connection, kind: str, columnsize: bool | None = None) -> None:
    """Create an empty keyword index of ``kind`` in the compact layout (inside the caller's
    transaction; `KeywordIndex.rebuild` fills it). ``columnsize``: FTS5's option (`fts5.tables`)."""
    for stmt in (postings.TABLES if kind == "postings" else fts5.tables(kind, columnsize)):
        db.execute(stmt)


def drop(db: sqlite3.Connection) -> None:
    """Drop whichever keyword index ``db`` holds, and its delete trigger."""
    fts5.drop(db)
    postings.drop(db)
