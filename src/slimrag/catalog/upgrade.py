"""Bringing a catalog to its smallest form: a legacy catalog converted to the compact layout, a
compact one given a dictionary it lacked, the keyword index merged, free pages returned.

`convert` runs in one write transaction (SQLite DDL is transactional): a crash or an error in the
middle leaves the legacy catalog as it was. It keeps every chunk id, document, tombstone and text;
vectors refer to chunk ids, so nothing else in the index folder changes. `finish` runs after the
commit: FTS5 ``optimize`` (one b-tree of terms instead of one per commit, ~7% smaller on
disfl_qa) and ``VACUUM`` when the chunks were rewritten or at least `VACUUM_SHARE` of the pages are free (a
converted catalog keeps the legacy tables' pages free until then).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from slimrag.catalog import codec
from slimrag.catalog.schema import COMPACT, compact_tables, compact_views

#: VACUUM when free pages are at least this share of the file (it rewrites the whole file)
VACUUM_SHARE = 0.125
#: chunks read and written per batch while converting
BATCH = 2048


def convert(db: sqlite3.Connection, coder: codec.Codec, detail: str) -> None:
    """Convert a legacy catalog to the compact layout; call inside a write transaction."""
    for stmt in compact_tables("_new"):  # statement by statement: executescript would commit
        db.execute(stmt)
    db.execute("INSERT INTO documents_new(source, sha, mtime, size) SELECT source, x'', mtime, size "
                "FROM documents ORDER BY source")
    db.executemany("UPDATE documents_new SET sha=? WHERE source=?",
                   ((sha_bytes(h), s) for s, h in db.execute("SELECT source, doc_id FROM documents").fetchall()))
    first = db.execute(f"SELECT text, metadata FROM chunks ORDER BY chunk_id LIMIT {codec.TRAIN_MAX_CHUNKS}")
    install_dictionary(db, coder, [codec.payload(t, _loads(m)) for t, m in first])
    last = -1
    while True:
        rows = db.execute(
            "SELECT c.chunk_id, d.doc, c.ordinal, c.text, c.metadata FROM chunks c JOIN documents_new d "
            "ON d.source=c.source WHERE c.chunk_id>? ORDER BY c.chunk_id LIMIT ?", (last, BATCH)).fetchall()
        if not rows:
            break
        db.executemany("INSERT INTO chunks_new(chunk_id, doc, ordinal, body) VALUES (?,?,?,?)",
                       ((cid, doc, o, coder.encode(t, _loads(m))) for cid, doc, o, t, m in rows))
        last = rows[-1][0]
    for stmt in ("DROP TRIGGER IF EXISTS chunks_ai", "DROP TRIGGER IF EXISTS chunks_ad", "DROP TABLE chunks_fts",
                 "DROP INDEX IF EXISTS chunks_source", "DROP TABLE chunks", "DROP TABLE documents",
                 "ALTER TABLE documents_new RENAME TO documents", "ALTER TABLE chunks_new RENAME TO chunks",
                 *compact_views(detail)):
        db.execute(stmt)
    db.execute("INSERT INTO chunks_fts(chunks_fts) VALUES('rebuild')")
    db.execute(f"PRAGMA user_version={COMPACT}")


def add_dictionary(db: sqlite3.Connection, coder: codec.Codec) -> bool:
    """Give a compact catalog without a dictionary one, trained on its first chunks, and
    re-encode every body with it; call inside a write transaction. False when it has one
    already, or too little text to train on."""
    if db.execute("SELECT 1 FROM dictionaries LIMIT 1").fetchone():
        return False
    first = db.execute(f"SELECT body FROM chunks ORDER BY chunk_id LIMIT {codec.TRAIN_MAX_CHUNKS}").fetchall()
    samples = [codec.payload(*coder.decode(b)) for (b,) in first]
    if not install_dictionary(db, coder, samples):
        return False
    last = -1
    while True:
        rows = db.execute("SELECT chunk_id, body FROM chunks WHERE chunk_id>? ORDER BY chunk_id LIMIT ?",
                          (last, BATCH)).fetchall()
        if not rows:
            return True
        db.executemany("UPDATE chunks SET body=? WHERE chunk_id=?",
                       ((coder.encode(*coder.decode(b)), cid) for cid, b in rows))
        last = rows[-1][0]


def install_dictionary(db: sqlite3.Connection, coder: codec.Codec, samples: list[bytes]) -> bool:
    """Train a dictionary on ``samples``, store it and encode with it; False when too little
    text to train on (the coder keeps what it used)."""
    data = codec.train(samples)
    if data is None:
        return False
    number = int(db.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM dictionaries").fetchone()[0])
    db.execute("INSERT INTO dictionaries(id, data) VALUES (?,?)", (number, data))
    coder.use(number, data)
    return True


def finish(db: sqlite3.Connection, rewritten: bool) -> None:
    """Merge the keyword index, then VACUUM when the chunks were ``rewritten`` (their pages are
    left part-filled) or enough pages are free; outside a transaction."""
    db.execute("INSERT INTO chunks_fts(chunks_fts) VALUES('optimize')")
    free = int(db.execute("PRAGMA freelist_count").fetchone()[0])
    pages = int(db.execute("PRAGMA page_count").fetchone()[0])
    if rewritten or (pages and free >= VACUUM_SHARE * pages):
        db.execute("VACUUM")


def sha_bytes(doc_id: str) -> bytes | str:
    """A document id as the compact layout stores it: the 32 bytes of a SHA-256 hex digest (the
    ids `Index` makes), any other id a caller gave as the string itself."""
    return bytes.fromhex(doc_id) if len(doc_id) == 64 and all(c in "0123456789abcdef" for c in doc_id) else doc_id


def _loads(meta: str) -> dict[str, Any]:
    return json.loads(meta)
