"""Bringing a catalog to its smallest form: a legacy catalog converted to the compact layout, a
compact one given a dictionary it lacked, the keyword index merged, free pages returned.

`convert` runs in one write transaction (SQLite DDL is transactional): a crash or an error in the
middle leaves the legacy catalog as it was. It keeps every chunk id, document, tombstone and text;
vectors refer to chunk ids, so nothing else in the index folder changes. `finish` runs after the
commit: FTS5 ``optimize`` after a rewrite or below `OPTIMIZE_BELOW_CHUNKS` chunks (one b-tree
of terms instead of one per commit, ~7% smaller on disfl_qa), a bounded ``merge`` step
otherwise, and ``VACUUM`` when the chunks were rewritten or at least `VACUUM_SHARE` of the pages are free (a
converted catalog keeps the legacy tables' pages free until then).
"""

from __future__ import annotations

import json
import sqlite3

from slimrag.catalog import codec, keyword
from slimrag.catalog.compact import install_dictionary, sha_bytes, write_blocks
from slimrag.catalog.schema import COMPACT, POLICIES, compact_tables, compact_views, own_bytes

#: VACUUM when free pages are at least this share of the file (it rewrites the whole file)
VACUUM_SHARE = 0.125
#: below this many chunks any free page is vacuumed away (tens of ms; the postings' merges free
#: pages that no later write may reuse: 53 KB, 6% of disfl_qa's catalog)
VACUUM_BELOW_CHUNKS = 20_000
#: rewrite the text blocks when more than this share of their slots hold deleted chunks
DEAD_SHARE = 0.25
#: below this many chunks a compaction merges the whole keyword index (FTS5 'optimize': on
#: disfl_qa 7% smaller; seconds at most); from it on, a bounded step
#: (`slimrag.catalog.keyword.fts5.MERGE_PAGES`; the postings merge by their own levels)
OPTIMIZE_BELOW_CHUNKS = 100_000
#: chunks read and written per batch while converting
BATCH = 2048


def convert(db: sqlite3.Connection, coder: codec.Codec, detail: str) -> None:
    """Convert a legacy catalog to the compact layout, with a keyword index of ``detail``; call
    inside a write transaction."""
    for stmt in compact_tables("_new"):  # statement by statement: executescript would commit
        db.execute(stmt)
    db.executemany("INSERT INTO documents_new(key, source, sha, mtime, size) VALUES (slimrag_key(?1),?1,?,?,?)",
                   ((s, sha_bytes(h), m, n) for s, h, m, n in
                    db.execute("SELECT source, doc_id, mtime, size FROM documents ORDER BY source").fetchall()))
    first = db.execute(f"SELECT text, metadata FROM chunks ORDER BY chunk_id LIMIT {codec.TRAIN_MAX_CHUNKS}")
    install_dictionary(db, coder, [codec.payload(t, json.loads(m)) for t, m in first])
    last, prev = -1, None
    while True:
        rows = db.execute(
            "SELECT c.chunk_id, d.doc, c.ordinal, c.text, c.metadata FROM chunks c JOIN documents_new d "
            "ON d.source=c.source WHERE c.chunk_id>? ORDER BY c.chunk_id LIMIT ?", (last, BATCH)).fetchall()
        if not rows:
            break
        metas = [json.loads(m) for *_, m in rows]
        own = []
        for (_, doc, o, t, _), m in zip(rows, metas, strict=True):
            own.append(own_bytes(t, m, prev[2:] if prev and prev[:2] == (doc, o - 1) else None))
            prev = (doc, o, t, m)
        db.executemany("INSERT INTO chunks_new(chunk_id, doc, ordinal, nbytes) VALUES (?,?,?,?)",
                       ((cid, doc, o, n) for (cid, doc, o, _, _), n in zip(rows, own, strict=True)))
        write_blocks(db, coder, [(r[0], codec.payload(r[3], m)) for r, m in zip(rows, metas, strict=True)],
                     "blocks_new")
        last = rows[-1][0]
    for stmt in ("DROP TRIGGER IF EXISTS chunks_ai", "DROP TRIGGER IF EXISTS chunks_ad", "DROP TABLE chunks_fts",
                 "DROP INDEX IF EXISTS chunks_source", "DROP TABLE chunks", "DROP TABLE documents",
                 "ALTER TABLE documents_new RENAME TO documents", "ALTER TABLE chunks_new RENAME TO chunks",
                 "ALTER TABLE blocks_new RENAME TO blocks", *compact_views()):
        db.execute(stmt)
    keyword.create(db, detail)
    keyword.open_index(db, True).rebuild()
    db.execute(f"PRAGMA application_id={POLICIES.index(detail)}")  # the policy, as a new catalog records it
    db.execute(f"PRAGMA user_version={COMPACT}")


def set_keyword_detail(db: sqlite3.Connection, detail: str, columnsize: bool | None = None) -> None:
    """Recreate the keyword index with another detail (an FTS5 option, or ``postings``) and fill
    it from the text; call inside a write transaction (the old index stays until it commits).
    An open `Catalog` on ``db`` sees the schema change and opens the new index."""
    keyword.drop(db)
    keyword.create(db, detail, columnsize)
    keyword.open_index(db, True).rebuild()


def rewrite_blocks(db: sqlite3.Connection, coder: codec.Codec) -> int:
    """Re-encode every block with the coder's dictionary, emptying the slots of deleted chunks
    and dropping blocks with none left; call inside a write transaction. Returns the number of
    blocks written."""
    db.execute("DELETE FROM blocks WHERE NOT EXISTS "
               "(SELECT 1 FROM chunks c WHERE c.chunk_id>=blocks.first AND c.chunk_id<blocks.first+blocks.n)")
    written, last = 0, -1
    while True:
        rows = db.execute("SELECT first, n, body FROM blocks WHERE first>? ORDER BY first LIMIT ?",
                          (last, BATCH // codec.BLOCK_CHUNKS)).fetchall()
        if not rows:
            return written
        for first, n, body in rows:
            live = {r[0] for r in db.execute("SELECT chunk_id FROM chunks WHERE chunk_id>=? AND chunk_id<?",
                                             (first, first + n))}
            slots = coder.payloads(first, body)
            kept = [p if first + i in live else "" for i, p in enumerate(slots)]
            db.execute("UPDATE blocks SET body=? WHERE first=?", (coder.encode(kept), first))
            written += 1
        last = rows[-1][0]


def add_dictionary(db: sqlite3.Connection, coder: codec.Codec) -> bool:
    """Give a compact catalog without a dictionary one, trained on its first chunks, and
    re-encode every block with it; call inside a write transaction. False when it has one
    already, or too little text to train on."""
    if db.execute("SELECT 1 FROM dictionaries LIMIT 1").fetchone():
        return False
    samples: list[str] = []
    for first, body in db.execute("SELECT first, body FROM blocks ORDER BY first").fetchall():
        samples += [p for p in coder.payloads(first, body) if p]
        if len(samples) >= codec.TRAIN_MAX_CHUNKS:
            break
    if not install_dictionary(db, coder, samples):
        return False
    rewrite_blocks(db, coder)
    return True


def wanted_detail(db: sqlite3.Connection, compact: bool, current: str, default: str, full_from: int) -> str:
    """The keyword index's detail that the catalog's policy (``PRAGMA application_id``, see
    `schema.POLICIES`; ``default`` for a legacy catalog and for code 0) asks for now:
    ``postings``, ``full`` or ``none`` as named, and ``auto`` (opt-in) ``none`` below ``full_from`` chunks, then ``full`` for good
    (never back: an index shrinking near the bound would flip each time)."""
    code = int(db.execute("PRAGMA application_id").fetchone()[0]) if compact else -1
    policy = POLICIES[code] if 0 < code < len(POLICIES) else default
    if policy != "auto":
        return policy
    if current == "full":
        return "full"
    return "full" if int(db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]) >= full_from else "none"


def finish(db: sqlite3.Connection, rewritten: bool, index: keyword.KeywordIndex) -> None:
    """Merge the keyword index ``index`` (all of it after a rewrite or below
    `OPTIMIZE_BELOW_CHUNKS` chunks, otherwise a bounded step, so a compaction of a large index
    does not rewrite its whole keyword index each time), then VACUUM when the chunks were
    ``rewritten`` (their pages are left part-filled) or enough pages are free; outside a
    transaction."""
    n = int(db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0])
    db.execute("BEGIN IMMEDIATE")
    try:
        index.merge(rewritten or n < OPTIMIZE_BELOW_CHUNKS)
    except BaseException:
        db.execute("ROLLBACK")
        index.forget()
        raise
    db.execute("COMMIT")
    free = int(db.execute("PRAGMA freelist_count").fetchone()[0])
    pages = int(db.execute("PRAGMA page_count").fetchone()[0])
    if rewritten or (pages and free >= VACUUM_SHARE * pages) or (free and n < VACUUM_BELOW_CHUNKS):
        db.execute("VACUUM")
