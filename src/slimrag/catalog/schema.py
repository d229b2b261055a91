"""The catalog's tables, in two layouts: ``compact`` (written by this version) and ``legacy``
(indexes built before it; read and written as they are until `Catalog.upgrade` converts them).

Compact layout (``PRAGMA user_version`` = `COMPACT`)
- ``documents(doc INTEGER PK, key, source, sha BLOB, mtime, size)`` with an index on ``key``:
  ``sha`` is the 32 raw bytes of the SHA-256 (half its hex), ``doc`` the small integer that
  chunks refer to, ``key`` a 32-bit hash of the source (`source_key`), so a source name is
  stored once: the index that finds a document by name holds 4-byte keys, not names (a
  lookup reads the few rows of a key and compares names; uniqueness is kept by `Catalog`).
- ``chunks(chunk_id INTEGER PK, doc, ordinal, nbytes)`` with an index on ``(doc, ordinal)``;
  ``nbytes`` counts the UTF-8 bytes of the chunk's text that the previous chunk of its document
  does not already hold (see `own_bytes`), so their sum is the text the documents yielded.
- ``blocks(first INTEGER PK, n, body BLOB)``: the metadata and text of chunks ``first ..
  first + n - 1``, compressed together (`slimrag.catalog.codec`). A chunk's block is the one
  with the largest ``first`` not above its id, found on the primary key: no column names it.
  Blocks hold runs of consecutive ids, and ids are never reused, so blocks never overlap.
- ``dictionaries(id INTEGER PK, data BLOB)``: the zstd dictionaries blocks name.
- ``chunk_text``: a view of ``(chunk_id, text)`` that decodes blocks through the SQL function
  ``slimrag_text``, registered on every connection the `Catalog` opens (a bare ``sqlite3`` shell
  cannot read the text, and cannot delete chunks: the delete trigger calls the function too).
- the keyword index (`slimrag.catalog.keyword`): by default ``keyword_*``, the postings of
  `slimrag.catalog.keyword.postings`
  (term counts and chunk lengths, no positions: FTS5's BM25 at 0.4x of FTS5's bytes). Catalogs
  built before it have ``chunks_fts``: FTS5, external content over ``chunk_text``, so the text
  is stored once, with ``detail=full``: term positions and counts, and chunk lengths (``columnsize``), so a
  query reads only the index. With ``detail=none`` (and ``columnsize=0``) it keeps only which
  chunks hold a term; BM25 still needs each matched chunk's term counts and length, and FTS5
  gets them by re-reading and re-tokenizing the chunk's text through the view: the same scores
  for ~0.45 of the index bytes and 13-25x slower queries (`slimrag.catalog.store`).
- ``tombstones(chunk_id)``: as before.
- ``PRAGMA application_id``: the keyword-detail policy the catalog was created with, by its
  position in `POLICIES` (``default``, ``none``, ``auto``, ``postings``, ``full``; see
  `slimrag.catalog.store`). A header
  field rather than a settings table, which would cost a page (4 KiB, 0.4% of disfl_qa's index).

Legacy layout (``user_version`` 0): ``documents(source PK, doc_id hex, mtime, size)``,
``chunks(chunk_id, source, ordinal, text, metadata JSON)``, FTS5 external content over
``chunks.text`` (detail=full) kept by triggers.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from typing import Any

#: ``PRAGMA user_version`` of a compact catalog (legacy catalogs have 0)
COMPACT = 3
LEGACY = 0
#: keyword-detail policies by their code in ``PRAGMA application_id``. 0, ``default``, is what
#: every catalog made before the policies were told apart has (a legacy file, or a compact one
#: with FTS5 ``full``, the default of its time): it follows today's default, so a compaction
#: brings it to the postings. ``full`` asked for by name is 4.
POLICIES = ("default", "none", "auto", "postings", "full")
#: the first chunk id of the block holding chunk ``{id}``
BLOCK_OF = "SELECT MAX(first) FROM blocks WHERE first<={id}"


def connect(path: Path) -> sqlite3.Connection:
    """A connection to the catalog at ``path`` as every `Catalog` opens it: autocommit (the
    catalog begins its own transactions), WAL, ``synchronous=NORMAL``, foreign keys on."""
    db = sqlite3.connect(path, isolation_level=None)
    for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON"):
        db.execute(f"PRAGMA {pragma}")
    return db


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
    key INTEGER NOT NULL,
    source TEXT NOT NULL,
    sha BLOB NOT NULL,
    mtime REAL NOT NULL,
    size INTEGER NOT NULL
)""", f"""CREATE TABLE chunks{s} (
    chunk_id INTEGER PRIMARY KEY,
    doc INTEGER NOT NULL REFERENCES documents{s}(doc) ON DELETE CASCADE,
    ordinal INTEGER NOT NULL,
    nbytes INTEGER NOT NULL
)""", f"CREATE TABLE blocks{s} (first INTEGER PRIMARY KEY, n INTEGER NOT NULL, body BLOB NOT NULL)",
            "CREATE TABLE IF NOT EXISTS dictionaries (id INTEGER PRIMARY KEY, data BLOB NOT NULL)",
            "CREATE TABLE IF NOT EXISTS tombstones (chunk_id INTEGER PRIMARY KEY)"]


def compact_views() -> list[str]:
    """The indexes and view of the compact layout, one statement each (created once the tables
    carry their final names: a view names its table). The keyword index and its delete trigger
    come after them (`slimrag.catalog.keyword.create`)."""
    return [
        "CREATE INDEX chunks_doc ON chunks(doc, ordinal)",
        "CREATE INDEX documents_key ON documents(key)",
        f"CREATE VIEW chunk_text AS SELECT c.chunk_id, slimrag_text(c.chunk_id, b.first, b.body) AS text "
        f"FROM chunks c JOIN blocks b ON b.first=({BLOCK_OF.format(id='c.chunk_id')})",
    ]


def layout_of(db: sqlite3.Connection) -> int | None:
    """`COMPACT`, `LEGACY`, or None for an empty database (nothing created yet)."""
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version == COMPACT:
        return COMPACT
    if version != LEGACY:
        raise sqlite3.DatabaseError(
            f"catalog format {version} is not one this slimrag reads ({LEGACY} or {COMPACT}); "
            "use the slimrag version that built it, or rebuild the index")
    has = db.execute("SELECT 1 FROM sqlite_schema WHERE type='table' AND name='chunks'").fetchone()
    return LEGACY if has else None


def own_bytes(text: str, metadata: dict[str, Any], prev: tuple[str, dict[str, Any]] | None) -> int:
    """UTF-8 bytes of ``text`` less its overlap with ``prev``, the previous chunk of the same
    document (text, metadata), when both are windows of one section: the chunker's
    ``char_start`` tells where each begins, so the overlap is where ``prev`` ends past this
    one's start. Measured against the documents' own text: exact on disfl_qa, 76 bytes short of
    625,549 on the pydoc modules (stripped whitespace at window edges)."""
    n = len(text.encode("utf-8"))
    if prev is None or "char_start" not in metadata or "char_start" not in prev[1]:
        return n
    overlap = min(len(text), max(0, int(prev[1]["char_start"]) + len(prev[0]) - int(metadata["char_start"])))
    return n - len(text[:overlap].encode("utf-8"))


def source_key(source: str) -> int:
    """The documents table's lookup key of a source name: 32 bits of its BLAKE2b hash (SQL
    function ``slimrag_key``)."""
    return int.from_bytes(hashlib.blake2b(source.encode("utf-8"), digest_size=4).digest(), "big", signed=True)
