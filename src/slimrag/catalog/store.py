"""The catalog: one SQLite file holding documents, chunk text and metadata, and keyword search.

Why SQLite: it is in the standard library, a single file, transactional, and FTS5 gives BM25
keyword search. WAL mode lets readers (a server answering queries) run while a writer adds
documents. The tables are in `slimrag.catalog.schema`; text is stored once, compressed
(`slimrag.catalog.codec`), and the keyword index is external content over it.

Layouts: a catalog built before the compact store (``legacy``) is read and written in its own
layout; `Catalog.upgrade` converts it (``slimrag compact`` calls it, see `slimrag.index`). The
layout is read again at the start of each call, so a catalog that another process converts under
an open `Catalog` keeps working.

Knobs
    `KEYWORD_DETAIL` = ``"postings"``: the keyword index of a new catalog.
    ``postings`` (`slimrag.catalog.postings`) keeps term counts and chunk lengths, no positions,
    in zstd blocks: FTS5's BM25 top-k, ids and scores bit for bit, at 0.22x of the text on
    disfl_qa (FTS5 ``full``: 0.53x) and about FTS5's query time at 43k chunks (16.3 against 17.8
    ms; 3 against 0.9 ms at 1.2k). ``full`` (FTS5 with positions) is what catalogs made before
    it have; their next compaction converts them (unless ``full`` was asked for by name). ``none`` (FTS5 without positions) re-reads and re-tokenizes every
    chunk a query matches, 13-25x slower, and a word of several tokens (``max_chunk_id``)
    becomes its tokens AND-ed instead of a phrase. ``auto`` starts with ``none`` and `upgrade`
    switches to ``full`` once the catalog holds `FULL_FROM_CHUNKS` chunks, never back.
    Measured with ``python -m bench.text_store details`` (docs/benchmarks.md).
    `FULL_FROM_CHUNKS` = 5,000: for ``auto`` only.

Thread-safety: one connection per `Catalog`; use one `Catalog` per thread (``check_same_thread``
is left on so misuse fails loudly).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from slimrag.catalog import codec, keyword, postings, schema, upgrade
from slimrag.types import Chunk, Document

KEYWORD_DETAIL = "postings"
FULL_FROM_CHUNKS = 5000
_DETAILS = ("postings", "full", "none", "auto")
_PARAMS = 900  # SQLite's bound-parameter limit, with room
#: a document's id as stored: 32 raw bytes for a SHA-256 hex digest (the ids `Index` makes),
#: the string itself for any other id a caller gives
_SHA = "CASE typeof(sha) WHEN 'blob' THEN lower(hex(sha)) ELSE sha END"
#: the compact layout's lookup of a document by source (``?1``): its hashed key, then the name
_BY_SOURCE = "key=slimrag_key(?1) AND source=?1"


class Catalog:
    """Documents, chunks and BM25 keyword search in one SQLite file.

    ``keyword_detail``: ``postings``, ``full``, ``none`` or ``auto`` when this call creates the
    catalog (see `KEYWORD_DETAIL`); an existing catalog keeps its own."""

    #: how `integrity_errors` begins an error that `rebuild_keyword_index` repairs
    KEYWORD_ERRORS = ("fts5:", "keyword:")

    def __init__(self, path: Path, *, keyword_detail: str = KEYWORD_DETAIL) -> None:
        if keyword_detail not in _DETAILS:
            raise ValueError(f"keyword_detail must be one of {', '.join(_DETAILS)}, not {keyword_detail!r}")
        self.path = Path(path)
        self.db = schema.connect(self.path)
        self.codec = codec.Codec(self._dictionary)
        self.db.create_function("slimrag_text", 3, self.codec.text, deterministic=True)
        self.db.create_function("slimrag_key", 1, schema.source_key, deterministic=True)
        self.postings = postings.Postings(self.db)
        if schema.layout_of(self.db) is None:  # a new file: create (checked again under the lock)
            with self.transaction():
                if schema.layout_of(self.db) is None:
                    start = "none" if keyword_detail == "auto" else keyword_detail
                    for stmt in [*schema.compact_tables(), *schema.compact_views(start)]:
                        self.db.execute(stmt)
                    self.db.execute(f"PRAGMA application_id={schema.POLICIES.index(keyword_detail)}")
                    self.db.execute(f"PRAGMA user_version={schema.COMPACT}")

    def close(self) -> None:
        """Close the connection (checkpointing the WAL)."""
        self.db.close()

    @property
    def compact(self) -> bool:
        """True when the catalog has the compact layout (False: built before it; `upgrade`)."""
        return schema.layout_of(self.db) == schema.COMPACT

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
        """Undo the transaction :meth:`begin` started (and forget dictionaries it may have made)."""
        self.db.execute("ROLLBACK")
        self.codec.forget()
        self.postings.forget()

    def data_version(self) -> int:
        """SQLite's ``PRAGMA data_version`` of this connection: it changes when *another*
        connection (another `Catalog`, another process) commits, never for this one's commits."""
        return int(self.db.execute("PRAGMA data_version").fetchone()[0])

    # -- documents ------------------------------------------------------------------------------
    def _doc_sql(self) -> str:
        return (f"SELECT {_SHA}, source, mtime, size FROM documents" if self.compact
                else "SELECT doc_id, source, mtime, size FROM documents")

    def document(self, source: str) -> Document | None:
        """The stored document at ``source``, or None."""
        row = self.db.execute(self._doc_sql() + (f" WHERE {_BY_SOURCE}" if self.compact else " WHERE source=?"),
                              (source,)).fetchone()
        return Document(*row) if row else None

    def _doc(self, source: str) -> int | None:
        """The compact layout's integer key of the document at ``source``, or None."""
        row = self.db.execute(f"SELECT doc FROM documents WHERE {_BY_SOURCE}", (source,)).fetchone()
        return int(row[0]) if row else None

    def documents(self) -> list[Document]:
        """All documents, sorted by source."""
        return [Document(*r) for r in self.db.execute(self._doc_sql() + " ORDER BY source")]

    def put_document(self, doc: Document) -> None:
        """Store a document; one stored at the same source is replaced and its chunks deleted
        (tombstoned)."""
        if not self.compact:
            self.db.execute("INSERT OR REPLACE INTO documents(source, doc_id, mtime, size) VALUES (?,?,?,?)",
                            (doc.source, doc.doc_id, doc.mtime, doc.size))
            return
        key = self._doc(doc.source)
        if key is None:
            self.db.execute("INSERT INTO documents(key, source, sha, mtime, size) VALUES (slimrag_key(?1),?1,?,?,?)",
                            (doc.source, upgrade.sha_bytes(doc.doc_id), doc.mtime, doc.size))
            return
        self.delete_chunks("doc=?", (key,))
        self.db.execute("UPDATE documents SET sha=?, mtime=?, size=? WHERE doc=?",
                        (upgrade.sha_bytes(doc.doc_id), doc.mtime, doc.size, key))

    def touch_documents(self, rows: Iterable[tuple[float, int, str]]) -> None:
        """Set ``(mtime, size)`` of stored documents by source, leaving their chunks alone."""
        self.db.executemany("UPDATE documents SET mtime=?1, size=?2 WHERE " + (
            "key=slimrag_key(?3) AND source=?3" if self.compact else "source=?3"), rows)

    def delete_document(self, source: str) -> list[int]:
        """Delete a document and its chunks (tombstoning them); returns the removed chunk ids."""
        if self.compact:
            key = self._doc(source)
            if key is None:
                return []
            ids = self.delete_chunks("doc=?", (key,))
            self.db.execute("DELETE FROM documents WHERE doc=?", (key,))
            return ids
        ids = [r[0] for r in self.db.execute("SELECT chunk_id FROM chunks WHERE source=?", (source,))]
        self.db.execute("DELETE FROM chunks WHERE source=?", (source,))
        self.db.execute("DELETE FROM documents WHERE source=?", (source,))
        return ids

    def delete_chunks(self, where: str, args: Sequence[Any]) -> list[int]:
        """Delete the chunks ``where`` selects (compact layout; the trigger tombstones them and
        updates the keyword index) and the blocks left without a chunk; returns their ids."""
        ids = [r[0] for r in self.db.execute(f"SELECT chunk_id FROM chunks WHERE {where} ORDER BY chunk_id", args)]
        if not ids:
            return ids
        firsts = {r[0] for r in self.db.execute(
            f"SELECT DISTINCT ({schema.BLOCK_OF.format(id='c.chunk_id')}) FROM chunks c WHERE {where}", args)}
        self.db.execute(f"DELETE FROM chunks WHERE {where}", args)
        self.postings.forget()
        self.db.executemany(
            "DELETE FROM blocks WHERE first=? AND NOT EXISTS "
            "(SELECT 1 FROM chunks c WHERE c.chunk_id>=blocks.first AND c.chunk_id<blocks.first+blocks.n)",
            ((f,) for f in firsts))
        return ids

    # -- chunks ---------------------------------------------------------------------------------
    def put_chunks(self, chunks: Iterable[Chunk]) -> None:
        """Store chunks (their documents must be stored first). The first batch of a compact
        catalog with enough text trains its compression dictionary."""
        if not self.compact:
            self.db.executemany(
                "INSERT INTO chunks(chunk_id, source, ordinal, text, metadata) VALUES (?,?,?,?,?)",
                ((c.chunk_id, c.source, c.ordinal, c.text, json.dumps(c.metadata)) for c in chunks))
            return
        chunks = sorted(chunks, key=lambda c: c.chunk_id)
        self._pick_dictionary(chunks)
        docs: dict[str, int] = {}
        for c in chunks:
            if c.source not in docs:
                key = self._doc(c.source)
                if key is None:
                    raise sqlite3.IntegrityError(f"chunk {c.chunk_id}: document {c.source!r} is not stored")
                docs[c.source] = key
        at = {(c.source, c.ordinal): c for c in chunks}

        def own(c: Chunk) -> int:
            p = at.get((c.source, c.ordinal - 1))
            return schema.own_bytes(c.text, c.metadata, (p.text, p.metadata) if p else None)

        self.db.executemany("INSERT INTO chunks(chunk_id, doc, ordinal, nbytes) VALUES (?,?,?,?)",
                            ((c.chunk_id, docs[c.source], c.ordinal, own(c)) for c in chunks))
        upgrade.write_blocks(self.db, self.codec, [(c.chunk_id, codec.payload(c.text, c.metadata)) for c in chunks])
        if schema.keyword_detail(self.db) == "postings":
            self.postings.add([(c.chunk_id, c.text) for c in chunks])
        else:
            self.db.executemany("INSERT INTO chunks_fts(rowid, text) VALUES (?,?)",
                                ((c.chunk_id, c.text) for c in chunks))

    def _pick_dictionary(self, chunks: list[Chunk]) -> None:
        """Encode with the newest stored dictionary; train one on ``chunks`` when there is none."""
        row = self.db.execute("SELECT id, data FROM dictionaries ORDER BY id DESC LIMIT 1").fetchone()
        if row is not None:
            self.codec.use(*row)
        else:
            upgrade.install_dictionary(self.db, self.codec, [codec.payload(c.text, c.metadata) for c in chunks])

    def _dictionary(self, number: int) -> bytes | None:
        row = self.db.execute("SELECT data FROM dictionaries WHERE id=?", (number,)).fetchone()
        return row[0] if row else None

    def _select_chunks(self, where: str, args: Sequence[Any]) -> list[Chunk]:
        if not self.compact:
            rows = self.db.execute(
                "SELECT c.chunk_id, d.doc_id, c.source, c.ordinal, c.text, c.metadata FROM chunks c "
                f"JOIN documents d ON d.source=c.source WHERE {where} ORDER BY c.source, c.ordinal", args)
            return [Chunk(cid, doc, src, o, text, json.loads(m)) for cid, doc, src, o, text, m in rows]
        rows = self.db.execute(
            f"SELECT c.chunk_id, {_SHA.replace('sha', 'd.sha')}, d.source, c.ordinal, b.first, b.body FROM chunks c "
            f"JOIN documents d ON d.doc=c.doc JOIN blocks b ON b.first=({schema.BLOCK_OF.format(id='c.chunk_id')}) "
            f"WHERE {where} ORDER BY c.doc, c.ordinal", args)
        return [Chunk(cid, doc, src, o, *self.codec.chunk(cid, first, body)) for cid, doc, src, o, first, body in rows]

    def chunks(self, ids: Sequence[int]) -> dict[int, Chunk]:
        """Chunks by id (missing ids are absent from the result)."""
        ids = [int(i) for i in ids]
        out: dict[int, Chunk] = {}
        for start in range(0, len(ids), _PARAMS):
            part = ids[start: start + _PARAMS]
            out.update((c.chunk_id, c) for c in self._select_chunks(f"c.chunk_id IN ({','.join('?' * len(part))})",
                                                                    part))
        return out

    def chunks_of(self, source: str, lo: int, hi: int) -> list[Chunk]:
        """The chunks of ``source`` whose ordinal is in ``[lo, hi]``, in reading order (a range
        scan of the index on the chunks' document: a citation's neighbours cost one query)."""
        if not self.compact:
            return self._select_chunks("d.source=? AND c.ordinal BETWEEN ? AND ?", (source, int(lo), int(hi)))
        key = self._doc(source)
        return [] if key is None else self._select_chunks("c.doc=? AND c.ordinal BETWEEN ? AND ?",
                                                          (key, int(lo), int(hi)))

    def texts(self, ids: Sequence[int]) -> list[str]:
        """Texts of chunks in the order of ``ids`` (used to recompute embeddings)."""
        got = self.chunks(ids)
        return [got[int(i)].text for i in ids]

    def live_ids(self, source_glob: str | None = None) -> list[int]:
        """Ids of all stored chunks, optionally only those whose source matches a glob
        (``docs/*.md``; ``*`` also crosses ``/``)."""
        if source_glob is None:
            return [r[0] for r in self.db.execute("SELECT chunk_id FROM chunks ORDER BY chunk_id")]
        where = ("doc IN (SELECT doc FROM documents WHERE source GLOB ?)" if self.compact else "source GLOB ?")
        return [r[0] for r in self.db.execute(f"SELECT chunk_id FROM chunks WHERE {where} ORDER BY chunk_id",
                                              (source_glob,))]

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

    def text_bytes(self) -> int:
        """Bytes of the text the stored documents yielded: their chunks' text with overlaps
        counted once (`schema.own_bytes`); what `part_bytes` is measured against."""
        if self.compact:
            return int(self.db.execute("SELECT COALESCE(SUM(nbytes), 0) FROM chunks").fetchone()[0])
        total, prev = 0, None
        for source, ordinal, text, meta in self.db.execute(
                "SELECT source, ordinal, text, metadata FROM chunks ORDER BY source, ordinal"):
            m = json.loads(meta)
            total += schema.own_bytes(text, m, prev[2:] if prev and prev[:2] == (source, ordinal - 1) else None)
            prev = (source, ordinal, text, m)
        return total

    # -- size and upgrade -----------------------------------------------------------------------
    def _wanted_detail(self, current: str) -> str:
        return upgrade.wanted_detail(self.db, self.compact, current, KEYWORD_DETAIL, FULL_FROM_CHUNKS)

    def part_bytes(self) -> dict[str, int]:
        """Bytes of the catalog file by part, from SQLite's page map: ``text`` (chunk bodies and
        their index), ``keyword`` (FTS5), ``documents``, ``free`` and ``other`` (schema,
        dictionaries, tombstones); they sum to the file's size without its WAL. Where SQLite
        lacks its ``dbstat`` table, all but ``free`` is counted as ``other``."""
        parts = {"text": 0, "keyword": 0, "documents": 0, "free": 0, "other": 0}
        page = int(self.db.execute("PRAGMA page_size").fetchone()[0])
        try:
            for name, size in self.db.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name"):
                key = ("keyword" if name.startswith(("chunks_fts", "keyword_")) else "text" if name.startswith(("chunks", "blocks"))
                       else "documents" if "documents" in name else "other")
                parts[key] += int(size)
        except sqlite3.OperationalError:  # an SQLite built without the dbstat table: no breakdown
            parts["other"] = page * int(self.db.execute("PRAGMA page_count").fetchone()[0])
        parts["free"] = page * int(self.db.execute("PRAGMA freelist_count").fetchone()[0])
        return parts

    def upgrade(self) -> bool:
        """Bring the catalog to its smallest form: convert a legacy catalog to the compact layout
        (one transaction: a crash leaves it as it was), train a dictionary it lacks, rewrite the
        text blocks when more than `upgrade.DEAD_SHARE` of their slots belong to deleted chunks,
        give the keyword index the detail its policy asks for (positions once an ``auto`` catalog
        reaches `FULL_FROM_CHUNKS`; a legacy catalog becomes `KEYWORD_DETAIL`),
        merge the keyword index, and VACUUM when many pages are free. Safe beside readers and under an
        index writer (SQLite's write lock orders it). Returns True when the layout changed."""
        with self.transaction():
            converted = not self.compact
            if converted:
                upgrade.convert(self.db, self.codec, self._wanted_detail("none"), self.postings)
                rewritten = True
            else:
                rewritten = upgrade.add_dictionary(self.db, self.codec)
                slots, live = self.db.execute(
                    "SELECT (SELECT COALESCE(SUM(n), 0) FROM blocks), (SELECT COUNT(*) FROM chunks)").fetchone()
                if not rewritten and slots - live > upgrade.DEAD_SHARE * slots:
                    self._pick_dictionary([])
                    upgrade.rewrite_blocks(self.db, self.codec)
                    rewritten = True
            want = self._wanted_detail(schema.keyword_detail(self.db))
            if want != schema.keyword_detail(self.db):
                upgrade.set_keyword_detail(self.db, want, self.postings)
        upgrade.finish(self.db, rewritten, self.postings)
        return converted

    # -- integrity ------------------------------------------------------------------------------
    def integrity_errors(self) -> list[str]:
        """What SQLite's ``PRAGMA integrity_check`` and FTS5's ``integrity-check`` (keyword index
        against the chunks' text) find wrong; empty when both pass. The FTS5 check is a write
        statement: call it with no write transaction of another connection pending for long."""
        errors = [r[0] for r in self.db.execute("PRAGMA integrity_check") if r[0] != "ok"]
        if self.compact and schema.keyword_detail(self.db) == "postings":
            return errors + self.postings.integrity_errors()
        try:
            self.db.execute("INSERT INTO chunks_fts(chunks_fts, rank) VALUES('integrity-check', 1)")
        except sqlite3.DatabaseError as e:  # SQLITE_CORRUPT_VTAB: the keyword index disagrees
            errors.append(f"fts5: {e}")
        return errors

    def rebuild_keyword_index(self) -> None:
        """Rebuild the FTS5 keyword index from the chunks' text (repairs what `integrity_errors`
        reports as ``fts5: ...`` or ``keyword: ...``)."""
        if self.compact and schema.keyword_detail(self.db) == "postings":
            with self.transaction():
                self.postings.rebuild_from_text()
            return
        self.db.execute("INSERT INTO chunks_fts(chunks_fts) VALUES('rebuild')")

    # -- keyword search -------------------------------------------------------------------------
    def keyword_search(self, query: str, k: int, source_glob: str | None = None) -> list[tuple[int, float]]:
        """BM25 keyword search. Returns (chunk_id, score) best first, score = -bm25 (higher is better).

        The query is reduced to its words, OR-ed, so user text with FTS5 syntax characters
        (quotes, ``-``, ``:``) never raises a syntax error. A word of several tokens
        (``max_chunk_id``) is a phrase, except under ``detail=none`` (`keyword`).
        """
        detail = schema.keyword_detail(self.db)
        if detail == "postings":
            allowed = None if not source_glob else np.array(self.live_ids(source_glob), dtype=np.int64)
            return self.postings.search(keyword.words(query), k, self.texts, allowed)
        return keyword.fts5_search(self.db, query, k, detail, source_glob, self.compact)
