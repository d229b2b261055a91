"""The catalog: one SQLite file holding documents, chunk text and metadata, and keyword search.

Why SQLite: it is in the standard library, a single file, transactional, and FTS5 gives BM25
keyword search. WAL mode lets readers (a server answering queries) run while a writer adds
documents. The tables are in `slimrag.catalog.schema`; text is stored once, compressed
(`slimrag.catalog.codec`), and the keyword index is external content over it.

Layouts: a catalog built before the compact store (``legacy``, `slimrag.catalog.legacy`) is
read and written in its own layout (the compact one: `slimrag.catalog.compact`); `Catalog.upgrade`
converts it (``slimrag compact`` calls it, see `slimrag.index`). The layout and the kind of keyword
index (`slimrag.catalog.keyword`) are chosen once per schema version: each call reads SQLite's
schema cookie (``PRAGMA schema_version``, a header field), so a catalog that another process
converts under an open `Catalog` keeps working.

Knobs
    `KEYWORD_DETAIL` = ``"postings"``: the keyword index of a new catalog.
    ``postings`` (`slimrag.catalog.keyword.postings`) keeps term counts and chunk lengths, no positions,
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

import functools
import json
import logging
import sqlite3
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from slimrag.catalog import codec, compact, schema, upgrade
from slimrag.catalog.compact import CompactRows
from slimrag.catalog.keyword import KeywordIndex, kind_of, open_index
from slimrag.catalog.keyword import create as create_keyword_index
from slimrag.catalog.legacy import LegacyRows
from slimrag.types import Chunk, Document

log = logging.getLogger(__name__)

KEYWORD_DETAIL = "postings"
FULL_FROM_CHUNKS = 5000
_DETAILS = ("postings", "full", "none", "auto")
_PARAMS = 900  # SQLite's bound-parameter limit, with room


def _weak_text(codec_ref: weakref.ref[codec.Codec]) -> Callable[[int, int, bytes], str]:
    """The SQL function ``slimrag_text`` over the codec that ``codec_ref`` names (`Codec.text`)."""
    def text(chunk_id: int, first: int, body: bytes) -> str:
        coder = codec_ref()
        if coder is None:
            raise sqlite3.ProgrammingError("slimrag_text called after its catalog was dropped")
        return coder.text(chunk_id, first, body)
    return text


class Catalog:
    """Documents, chunks and BM25 keyword search in one SQLite file.

    ``keyword_detail``: ``postings``, ``full``, ``none`` or ``auto`` when this call creates the
    catalog (see `KEYWORD_DETAIL`); an existing catalog keeps its own."""

    def __init__(self, path: Path, *, keyword_detail: str = KEYWORD_DETAIL) -> None:
        if keyword_detail not in _DETAILS:
            raise ValueError(f"keyword_detail must be one of {', '.join(_DETAILS)}, not {keyword_detail!r}")
        self.path = Path(path)
        self.db = schema.connect(self.path)
        # the codec loads dictionaries through the connection, and the connection's SQL function
        # reaches the codec by a weak reference: no reference cycle, so an unclosed catalog's
        # file closes as soon as it is dropped, without waiting for a garbage collection
        self.codec = codec.Codec(functools.partial(compact.read_dictionary, self.db))
        self.db.create_function("slimrag_text", 3, _weak_text(weakref.ref(self.codec)), deterministic=True)
        self.db.create_function("slimrag_key", 1, schema.source_key, deterministic=True)
        self._seen: int | None = None  # the schema version `_rows` and `_keyword` were chosen at
        self._rows: CompactRows | LegacyRows | None = None
        self._keyword: KeywordIndex | None = None
        if schema.layout_of(self.db) is None:  # a new file: create (checked again under the lock)
            with self.transaction():
                if schema.layout_of(self.db) is None:
                    for stmt in [*schema.compact_tables(), *schema.compact_views()]:
                        self.db.execute(stmt)
                    create_keyword_index(self.db, "none" if keyword_detail == "auto" else keyword_detail)
                    self.db.execute(f"PRAGMA application_id={schema.POLICIES.index(keyword_detail)}")
                    self.db.execute(f"PRAGMA user_version={schema.COMPACT}")

    def close(self) -> None:
        """Close the connection (checkpointing the WAL)."""
        self.db.close()

    def __del__(self) -> None:
        # CPython's sqlite3 connection sits in a reference cycle of its own (its statement cache),
        # so without this a dropped, unclosed catalog would hold its file until a collection
        db = getattr(self, "db", None)
        if db is None:
            return
        try:
            db.close()
        except sqlite3.ProgrammingError as e:  # dropped in a thread other than its own: the collector closes it
            log.debug("catalog %s: not closed when dropped: %s", self.path, e)

    def _layout(self) -> CompactRows | LegacyRows:
        """The layout's rows, chosen again (with the keyword index) when the schema changed."""
        version = int(self.db.execute("PRAGMA schema_version").fetchone()[0])
        if version != self._seen or self._rows is None:
            is_compact = schema.layout_of(self.db) == schema.COMPACT
            self._keyword = open_index(self.db, is_compact)
            self._rows = CompactRows(self.db, self.codec, self._keyword) if is_compact else LegacyRows(self.db)
            self._seen = version
        return self._rows

    @property
    def compact(self) -> bool:
        """True when the catalog has the compact layout (False: built before it; `upgrade`)."""
        return self._layout().compact

    @property
    def keyword(self) -> KeywordIndex:
        """The catalog's keyword index, of whichever kind it holds (`slimrag.catalog.keyword`)."""
        self._layout()
        assert self._keyword is not None
        return self._keyword

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
        if self._keyword is not None:
            self._keyword.forget()

    def data_version(self) -> int:
        """SQLite's ``PRAGMA data_version`` of this connection: it changes when *another*
        connection (another `Catalog`, another process) commits, never for this one's commits."""
        return int(self.db.execute("PRAGMA data_version").fetchone()[0])

    # -- documents ------------------------------------------------------------------------------
    def document(self, source: str) -> Document | None:
        """The stored document at ``source``, or None."""
        return self._layout().document(source)

    def documents(self) -> list[Document]:
        """All documents, sorted by source."""
        return self._layout().documents()

    def put_document(self, doc: Document) -> None:
        """Store a document; one stored at the same source is replaced and its chunks deleted
        (tombstoned)."""
        self._layout().put_document(doc)

    def touch_documents(self, rows: Iterable[tuple[float, int, str]]) -> None:
        """Set ``(mtime, size)`` of stored documents by source, leaving their chunks alone."""
        self._layout().touch_documents(rows)

    def delete_document(self, source: str) -> list[int]:
        """Delete a document and its chunks (tombstoning them); returns the removed chunk ids."""
        return self._layout().delete_document(source)

    # -- chunks ---------------------------------------------------------------------------------
    def put_chunks(self, chunks: Iterable[Chunk]) -> None:
        """Store chunks (their documents must be stored first). The first batch of a compact
        catalog with enough text trains its compression dictionary."""
        self._layout().put_chunks(chunks)

    def chunks(self, ids: Sequence[int]) -> dict[int, Chunk]:
        """Chunks by id (missing ids are absent from the result)."""
        rows = self._layout()
        ids = [int(i) for i in ids]
        out: dict[int, Chunk] = {}
        for start in range(0, len(ids), _PARAMS):
            part = ids[start: start + _PARAMS]
            out.update((c.chunk_id, c) for c in rows.select_chunks(f"c.chunk_id IN ({','.join('?' * len(part))})",
                                                                   part))
        return out

    def document_count(self, ids: Sequence[int]) -> int:
        """How many documents the chunks ``ids`` belong to (ids not in the catalog count for none),
        counted by one query without reading the chunks' text."""
        key = "doc" if self._layout().compact else "source"  # a chunk's document in each layout
        q = f"SELECT COUNT(DISTINCT {key}) FROM chunks WHERE chunk_id IN (SELECT value FROM json_each(?))"
        return int(self.db.execute(q, (json.dumps([int(i) for i in ids]),)).fetchone()[0])

    def chunks_of(self, source: str, lo: int, hi: int) -> list[Chunk]:
        """The chunks of ``source`` whose ordinal is in ``[lo, hi]``, in reading order (a range
        scan of the index on the chunks' document: a citation's neighbours cost one query)."""
        return self._layout().chunks_of(source, int(lo), int(hi))

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
            f"SELECT chunk_id FROM chunks WHERE {self._layout().SOURCE_GLOB} ORDER BY chunk_id", (source_glob,))]

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
        return self._layout().text_bytes()

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
                upgrade.convert(self.db, self.codec, self._wanted_detail("none"))
                rewritten = True
            else:
                rewritten = upgrade.add_dictionary(self.db, self.codec)
                slots, live = self.db.execute(
                    "SELECT (SELECT COALESCE(SUM(n), 0) FROM blocks), (SELECT COUNT(*) FROM chunks)").fetchone()
                if not rewritten and slots - live > upgrade.DEAD_SHARE * slots:
                    compact.use_dictionary(self.db, self.codec, [])
                    upgrade.rewrite_blocks(self.db, self.codec)
                    rewritten = True
            kind = kind_of(self.db)
            want = self._wanted_detail(kind)
            if want != kind:
                upgrade.set_keyword_detail(self.db, want)
        upgrade.finish(self.db, rewritten, self.keyword)
        return converted

    # -- integrity ------------------------------------------------------------------------------
    def integrity_errors(self) -> list[str]:
        """What SQLite's ``PRAGMA integrity_check`` and the keyword index's own check (the index
        against the chunks' text, `KeywordIndex.check`) find wrong; empty when both pass. The
        keyword index's damage comes as `slimrag.catalog.keyword.KeywordDamage`, which
        `rebuild_keyword_index` repairs. FTS5's check is a write statement: call it with no write
        transaction of another connection pending for long."""
        errors = [r[0] for r in self.db.execute("PRAGMA integrity_check") if r[0] != "ok"]
        return errors + list(self.keyword.check())

    def rebuild_keyword_index(self) -> None:
        """Rebuild the keyword index from the chunks' text, in one write transaction (repairs
        the `KeywordDamage` that `integrity_errors` reports)."""
        with self.transaction():
            self.keyword.rebuild()

    # -- keyword search -------------------------------------------------------------------------
    def keyword_search(self, query: str, k: int, source_glob: str | None = None) -> list[tuple[int, float]]:
        """BM25 keyword search. Returns (chunk_id, score) best first, score = -bm25 (higher is better).

        The query is reduced to its words, OR-ed, so user text with FTS5 syntax characters
        (quotes, ``-``, ``:``) never raises a syntax error. A word of several tokens
        (``max_chunk_id``) is a phrase, except under FTS5's ``detail=none``
        (`slimrag.catalog.keyword.words`).
        """
        return self.keyword.search(query, k, source_glob, self)
