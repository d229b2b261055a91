"""The catalog: one SQLite file holding documents, chunk text and metadata, and keyword search.

Why SQLite: it is in the standard library, a single file, transactional, and FTS5 gives BM25
keyword search for free. WAL mode lets readers (a server answering queries) run while a writer
adds documents.

Tables
- ``documents(source PK, doc_id, mtime, size)``: ``doc_id`` is the SHA-256 of the file's bytes, so
  re-adding an unchanged file is detected without reading its chunks.
- ``chunks(chunk_id PK, source, ordinal, text, metadata JSON)``: chunk ids are assigned by the
  index (never reused, see `slimrag.index.layout`), because vectors on disk refer to them.
- ``chunks_fts``: an external-content FTS5 table over ``chunks.text``, kept in sync by triggers.
- ``tombstones(chunk_id)``: chunks removed since the last compaction; their vectors still sit in
  the index files and are masked out at search time.

Thread-safety: one connection per `Catalog`; use one `Catalog` per thread (``check_same_thread``
is left on so misuse fails loudly).
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from slimrag.types import Chunk, Document

SCHEMA = """
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

_WORD = re.compile(r"\w+", re.UNICODE)


class Catalog:
    """Documents, chunks and FTS5 keyword search in one SQLite file."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.db = sqlite3.connect(self.path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA foreign_keys=ON")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        """Close the connection (checkpointing the WAL)."""
        self.db.close()

    # -- transactions ---------------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One write transaction around the ``with`` block: committed when the block ends,
        rolled back when anything escapes it (KeyboardInterrupt included), which is re-raised.
        ``BEGIN IMMEDIATE`` takes the write lock at once, so a second writer waits (or fails with
        "database is locked") before it has done any work. Not re-entrant."""
        self.begin()
        try:
            yield
        except BaseException:
            self.rollback()
            raise
        self.commit()

    def begin(self) -> None:
        """Start a write transaction; pair with :meth:`commit` or :meth:`rollback` (or use
        :meth:`transaction`, which does both)."""
        self.db.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        """Commit the transaction :meth:`begin` started."""
        self.db.execute("COMMIT")

    def rollback(self) -> None:
        """Undo the transaction :meth:`begin` started."""
        self.db.execute("ROLLBACK")

    def data_version(self) -> int:
        """SQLite's ``PRAGMA data_version`` of this connection: it changes when *another*
        connection (another `Catalog`, another process) commits, never for this one's commits."""
        return int(self.db.execute("PRAGMA data_version").fetchone()[0])

    # -- documents ------------------------------------------------------------------------------
    def document(self, source: str) -> Document | None:
        """The stored document at ``source``, or None."""
        row = self.db.execute(
            "SELECT doc_id, source, mtime, size FROM documents WHERE source=?", (source,)
        ).fetchone()
        return Document(*row) if row else None

    def documents(self) -> list[Document]:
        """All documents, sorted by source."""
        rows = self.db.execute("SELECT doc_id, source, mtime, size FROM documents ORDER BY source")
        return [Document(*r) for r in rows]

    def put_document(self, doc: Document) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO documents(source, doc_id, mtime, size) VALUES (?,?,?,?)",
            (doc.source, doc.doc_id, doc.mtime, doc.size),
        )

    def touch_documents(self, rows: Iterable[tuple[float, int, str]]) -> None:
        """Set ``(mtime, size)`` of stored documents by source, leaving their chunks alone (a
        plain UPDATE: `put_document`'s INSERT OR REPLACE would cascade to the chunks)."""
        self.db.executemany("UPDATE documents SET mtime=?, size=? WHERE source=?", rows)

    def delete_document(self, source: str) -> list[int]:
        """Delete a document and its chunks (tombstoning them); returns the removed chunk ids."""
        ids = [r[0] for r in self.db.execute("SELECT chunk_id FROM chunks WHERE source=?", (source,))]
        self.db.execute("DELETE FROM chunks WHERE source=?", (source,))
        self.db.execute("DELETE FROM documents WHERE source=?", (source,))
        return ids

    # -- chunks ---------------------------------------------------------------------------------
    def put_chunks(self, chunks: Iterable[Chunk]) -> None:
        self.db.executemany(
            "INSERT INTO chunks(chunk_id, source, ordinal, text, metadata) VALUES (?,?,?,?,?)",
            ((c.chunk_id, c.source, c.ordinal, c.text, json.dumps(c.metadata)) for c in chunks),
        )

    def chunks(self, ids: Sequence[int]) -> dict[int, Chunk]:
        """Chunks by id (missing ids are absent from the result)."""
        out: dict[int, Chunk] = {}
        ids = [int(i) for i in ids]
        for start in range(0, len(ids), 900):  # SQLite's bound-parameter limit
            part = ids[start : start + 900]
            q = ",".join("?" * len(part))
            for cid, doc, source, ordinal, text, meta in self.db.execute(
                f"SELECT c.chunk_id, d.doc_id, c.source, c.ordinal, c.text, c.metadata FROM chunks c "
                f"JOIN documents d ON d.source=c.source WHERE c.chunk_id IN ({q})", part
            ):
                out[cid] = Chunk(cid, doc, source, ordinal, text, json.loads(meta))
        return out

    def chunks_of(self, source: str, lo: int, hi: int) -> list[Chunk]:
        """The chunks of ``source`` whose ordinal is in ``[lo, hi]``, in reading order (a range
        scan of the ``chunks_source`` index: a citation's neighbours cost one query)."""
        rows = self.db.execute(
            "SELECT c.chunk_id, d.doc_id, c.source, c.ordinal, c.text, c.metadata FROM chunks c "
            "JOIN documents d ON d.source=c.source WHERE c.source=? AND c.ordinal BETWEEN ? AND ? "
            "ORDER BY c.ordinal", (source, int(lo), int(hi)))
        return [Chunk(cid, doc, src, ordinal, text, json.loads(meta)) for cid, doc, src, ordinal, text, meta in rows]

    def texts(self, ids: Sequence[int]) -> list[str]:
        """Texts of chunks in the order of ``ids`` (used to recompute embeddings)."""
        got = self.chunks(ids)
        return [got[int(i)].text for i in ids]

    def live_ids(self, source_glob: str | None = None) -> list[int]:
        """Ids of all stored chunks, optionally only those whose source matches a glob
        (``docs/*.md``; ``*`` also crosses ``/``)."""
        if source_glob is None:
            return [r[0] for r in self.db.execute("SELECT chunk_id FROM chunks ORDER BY chunk_id")]
        return [r[0] for r in self.db.execute(
            "SELECT chunk_id FROM chunks WHERE source GLOB ? ORDER BY chunk_id", (source_glob,))]

    def max_chunk_id(self) -> int:
        """The largest chunk id ever stored here (live or tombstoned), or -1."""
        a = self.db.execute("SELECT MAX(chunk_id) FROM chunks").fetchone()[0]
        b = self.db.execute("SELECT MAX(chunk_id) FROM tombstones").fetchone()[0]
        return max(x for x in (a, b, -1) if x is not None)

    def has_chunk_id(self, chunk_id: int) -> bool:
        """True when ``chunk_id`` was committed here: stored, or removed since the last compaction."""
        q = "SELECT 1 FROM chunks WHERE chunk_id=? UNION ALL SELECT 1 FROM tombstones WHERE chunk_id=? LIMIT 1"
        return self.db.execute(q, (int(chunk_id), int(chunk_id))).fetchone() is not None

    def tombstone_ids(self) -> list[int]:
        """Ids of chunks removed since the last compaction, ascending."""
        return [r[0] for r in self.db.execute("SELECT chunk_id FROM tombstones ORDER BY chunk_id")]

    def clear_tombstones(self, ids: Sequence[int] | None = None) -> None:
        """Forget tombstones once a compaction has dropped their vectors."""
        if ids is None:
            self.db.execute("DELETE FROM tombstones")
        else:
            self.db.executemany("DELETE FROM tombstones WHERE chunk_id=?", ((int(i),) for i in ids))

    def counts(self) -> dict[str, int]:
        """Numbers of documents, chunks and tombstones."""
        q = self.db.execute
        return {
            "documents": q("SELECT COUNT(*) FROM documents").fetchone()[0],
            "chunks": q("SELECT COUNT(*) FROM chunks").fetchone()[0],
            "tombstones": q("SELECT COUNT(*) FROM tombstones").fetchone()[0],
        }

    # -- integrity ------------------------------------------------------------------------------
    def integrity_errors(self) -> list[str]:
        """What SQLite's ``PRAGMA integrity_check`` and FTS5's ``integrity-check`` (keyword index
        against the chunks table) find wrong; empty when both pass. The FTS5 check is a write
        statement: call it with no write transaction of another connection pending for long."""
        errors = [r[0] for r in self.db.execute("PRAGMA integrity_check") if r[0] != "ok"]
        try:
            self.db.execute("INSERT INTO chunks_fts(chunks_fts, rank) VALUES('integrity-check', 1)")
        except sqlite3.DatabaseError as e:  # SQLITE_CORRUPT_VTAB: the keyword index disagrees
            errors.append(f"fts5: {e}")
        return errors

    def rebuild_keyword_index(self) -> None:
        """Rebuild the FTS5 keyword index from the chunks table (repairs what `integrity_errors`
        reports as ``fts5: ...``)."""
        self.db.execute("INSERT INTO chunks_fts(chunks_fts) VALUES('rebuild')")

    # -- keyword search -------------------------------------------------------------------------
    def keyword_search(self, query: str, k: int, source_glob: str | None = None) -> list[tuple[int, float]]:
        """BM25 keyword search. Returns (chunk_id, score) best first, score = -bm25 (higher is better).

        The query is reduced to its words, OR-ed together and each quoted, so user text with FTS5
        syntax characters (quotes, ``-``, ``:``) never raises a syntax error.
        """
        words = _WORD.findall(query)
        if not words:
            return []
        match = " OR ".join('"' + w.replace('"', '""') + '"' for w in words)
        sql = ("SELECT f.rowid, -bm25(chunks_fts) AS s FROM chunks_fts f "
               + ("JOIN chunks c ON c.chunk_id=f.rowid WHERE chunks_fts MATCH ? AND c.source GLOB ? "
                  if source_glob else "WHERE chunks_fts MATCH ? ")
               + "ORDER BY bm25(chunks_fts) LIMIT ?")
        args: tuple[Any, ...] = (match, source_glob, k) if source_glob else (match, k)
        return [(int(r[0]), float(r[1])) for r in self.db.execute(sql, args)]
