"""The catalog's tables, in two layouts: ``compact`` (written by this version) and ``legacy``
(indexes built before it; read and written as they are until `Catalog.upgrade` converts them).

Compact layout (``PRAGMA user_version`` = `COMPACT`)
- ``documents(doc INTEGER PK, source UNIQUE, sha BLOB, mtime, size)``: ``sha`` is the 32 raw
  bytes of the SHA-256 (half its hex), ``doc`` the small integer that chunks refer to, so a
  source name is stored in the documents table and its unique index only, never per chunk.
- ``chunks(chunk_id INTEGER PK, doc, ordinal, body BLOB)`` with an index on ``(doc, ordinal)``:
  ``body`` holds the metadata and the text, compressed (`slimrag.catalog.codec`).
- ``dictionaries(id INTEGER PK, data BLOB)``: the zstd dictionaries bodies name.
- ``chunk_text``: a view of ``(chunk_id, text)`` that decodes bodies through the SQL function
  ``slimrag_text``, registered on every connection the `Catalog` opens (a bare ``sqlite3`` shell
  cannot read the text, and cannot write chunks: the delete trigger calls the function too).
- ``chunks_fts``: FTS5, external content over ``chunk_text``, so the text is stored once. With
  ``detail=none`` the index keeps only which chunks hold a term; BM25 needs the term counts
  per chunk too, and FTS5 gets them by re-reading the matched chunks' text through the view, so
  scores and ranking are those of ``detail=full`` (tested), for ~half the index bytes and
  slower queries that match many chunks (see `KEYWORD_DETAIL` in `slimrag.catalog.store`).
- ``tombstones(chunk_id)``: as before.

Legacy layout (``user_version`` 0): ``documents(source PK, doc_id hex, mtime, size)``,
``chunks(chunk_id, source, ordinal, text, metadata JSON)``, FTS5 external content over
``chunks.text`` (detail=full) kept by triggers.
"""

from __future__ import annotations

import sqlite3

#: ``PRAGMA user_version`` of a compact catalog (legacy catalogs have 0)
COMPACT = 2
LEGACY = 0

LEGACY_SCHEMA = """
CREATE TABLE IF NOT EXISTS documents (
    source TEXT PRIMARY KEY,
    doc_id TEXT NOT NULL,
    mtime REAL NOT NULL,
    size INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS chunks (
    chunk_id INTEGER PRIMARY KEY,
    source TEXT NOT NULL REFERENCES documents(source) ON DELETE CASCADE,
    ordinal INTEGER NOT NULL,
    text TEXT NOT NULL,
    metadata TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS chunks_source ON chunks(source);
CREATE TABLE IF NOT EXISTS tombstones (chunk_id INTEGER PRIMARY KEY);
CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5(text, content='chunks', content_rowid='chunk_id');
CREATE TRIGGER IF NOT EXISTS chunks_ai AFTER INSERT ON chunks BEGIN
    INSERT INTO chunks_fts(rowid, text) VALUES (new.chunk_id, new.text);
END;
CREATE TRIGGER IF NOT EXISTS chunks_ad AFTER DELETE ON chunks BEGIN
    INSERT INTO chunks_fts(chunks_fts, rowid, text) VALUES ('delete', old.chunk_id, old.text);
    INSERT OR IGNORE INTO tombstones(chunk_id) VALUES (old.chunk_id);
END;
"""


def compact_tables(suffix: str = "") -> list[str]:
    """The compact layout's tables, one statement each; ``suffix`` names the tables of an upgrade
    in progress (renamed once the legacy ones are dropped; the index on chunks comes after)."""
    s = suffix
    return [f"""
CREATE TABLE documents{s} (
    doc INTEGER PRIMARY KEY,
    source TEXT NOT NULL UNIQUE,
    sha BLOB NOT NULL,
    mtime REAL NOT NULL,
    size INTEGER NOT NULL
)""", f"""CREATE TABLE chunks{s} (
    chunk_id INTEGER PRIMARY KEY,
    doc INTEGER NOT NULL REFERENCES documents{s}(doc) ON DELETE CASCADE,
    ordinal INTEGER NOT NULL,
    body BLOB NOT NULL
)""", "CREATE TABLE IF NOT EXISTS dictionaries (id INTEGER PRIMARY KEY, data BLOB NOT NULL)",
            "CREATE TABLE IF NOT EXISTS tombstones (chunk_id INTEGER PRIMARY KEY)"]


def compact_views(detail: str) -> list[str]:
    """The index, view, keyword index and trigger of the compact layout, one statement each
    (created once the tables carry their final names: a view and a trigger name their table).
    ``detail``: FTS5's detail option."""
    return [
        "CREATE INDEX chunks_doc ON chunks(doc, ordinal)",
        "CREATE VIEW chunk_text AS SELECT chunk_id, slimrag_text(body) AS text FROM chunks",
        "CREATE VIRTUAL TABLE chunks_fts USING fts5(text, content='chunk_text', content_rowid='chunk_id', "
        f"detail={detail})",
        """CREATE TRIGGER chunks_ad AFTER DELETE ON chunks BEGIN
    INSERT INTO chunks_fts(chunks_fts, rowid, text) VALUES ('delete', old.chunk_id, slimrag_text(old.body));
    INSERT OR IGNORE INTO tombstones(chunk_id) VALUES (old.chunk_id);
END""",
    ]


def layout_of(db: sqlite3.Connection) -> int | None:
    """`COMPACT`, `LEGACY`, or None for an empty database (nothing created yet)."""
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version == COMPACT:
        return COMPACT
    if version != LEGACY:
        raise sqlite3.DatabaseError(
            f"catalog format {version} is newer than this slimrag knows ({COMPACT}); upgrade slimrag")
    has = db.execute("SELECT 1 FROM sqlite_schema WHERE type='table' AND name='chunks'").fetchone()
    return LEGACY if has else None


def keyword_detail(db: sqlite3.Connection) -> str:
    """The ``detail`` option the keyword index was created with (``full`` when not given)."""
    row = db.execute("SELECT sql FROM sqlite_schema WHERE name='chunks_fts'").fetchone()
    sql = (row[0] if row else "").replace(" ", "").lower()
    for d in ("none", "column"):
        if f"detail={d}" in sql:
            return d
    return "full"
