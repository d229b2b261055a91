"""The compact layout's reads and writes of documents and chunks (tables in
`slimrag.catalog.schema`): text in compressed blocks (`slimrag.catalog.codec`), a document found
by the hash of its name, its id stored as raw bytes.

The write helpers (`write_blocks`, `install_dictionary`, `sha_bytes`) live here, beside the
writes that call them on every commit; `slimrag.catalog.upgrade` calls them too when it converts
a legacy catalog.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from slimrag.catalog import codec, schema
from slimrag.catalog.keyword import KeywordIndex
from slimrag.types import Chunk, Document

#: a document's id as stored: 32 raw bytes for a SHA-256 hex digest (the ids `Index` makes),
#: the string itself for any other id a caller gives
_SHA = "CASE typeof(sha) WHEN 'blob' THEN lower(hex(sha)) ELSE sha END"
#: the lookup of a document by source (``?1``): its hashed key, then the name
_BY_SOURCE = "key=slimrag_key(?1) AND source=?1"


class CompactRows:
    """Documents and chunks of a compact catalog on ``db``; ``coder`` encodes and decodes its
    blocks, ``keyword`` is its keyword index (new chunks are added to it)."""

    compact = True

    def __init__(self, db: sqlite3.Connection, coder: codec.Codec, keyword: KeywordIndex) -> None:
        self.db, self.codec, self.keyword = db, coder, keyword

    # -- documents ------------------------------------------------------------------------------
    def _doc_sql(self) -> str:
        return f"SELECT {_SHA}, source, mtime, size FROM documents"

    def document(self, source: str) -> Document | None:
        row = self.db.execute(self._doc_sql() + f" WHERE {_BY_SOURCE}", (source,)).fetchone()
        return Document(*row) if row else None

    def documents(self) -> list[Document]:
        return [Document(*r) for r in self.db.execute(self._doc_sql() + " ORDER BY source")]

    def _doc(self, source: str) -> int | None:
        """The integer key of the document at ``source``, or None."""
        row = self.db.execute(f"SELECT doc FROM documents WHERE {_BY_SOURCE}", (source,)).fetchone()
        return int(row[0]) if row else None

    def put_document(self, doc: Document) -> None:
        key = self._doc(doc.source)
        if key is None:
            self.db.execute("INSERT INTO documents(key, source, sha, mtime, size) VALUES (slimrag_key(?1),?1,?,?,?)",
                            (doc.source, sha_bytes(doc.doc_id), doc.mtime, doc.size))
            return
        self._delete_chunks("doc=?", (key,))
        self.db.execute("UPDATE documents SET sha=?, mtime=?, size=? WHERE doc=?",
                        (sha_bytes(doc.doc_id), doc.mtime, doc.size, key))

    def touch_documents(self, rows: Iterable[tuple[float, int, str]]) -> None:
        self.db.executemany("UPDATE documents SET mtime=?1, size=?2 WHERE key=slimrag_key(?3) AND source=?3", rows)

    def delete_document(self, source: str) -> list[int]:
        key = self._doc(source)
        if key is None:
            return []
        ids = self._delete_chunks("doc=?", (key,))
        self.db.execute("DELETE FROM documents WHERE doc=?", (key,))
        return ids

    def _delete_chunks(self, where: str, args: Sequence[Any]) -> list[int]:
        """Delete the chunks ``where`` selects (the keyword index's trigger tombstones them and
        updates it) and the blocks left without a chunk; returns their ids."""
        ids = [r[0] for r in self.db.execute(f"SELECT chunk_id FROM chunks WHERE {where} ORDER BY chunk_id", args)]
        if not ids:
            return ids
        firsts = {r[0] for r in self.db.execute(
            f"SELECT DISTINCT ({schema.BLOCK_OF.format(id='c.chunk_id')}) FROM chunks c WHERE {where}", args)}
        self.db.execute(f"DELETE FROM chunks WHERE {where}", args)
        self.keyword.forget()
        self.db.executemany(
            "DELETE FROM blocks WHERE first=? AND NOT EXISTS "
            "(SELECT 1 FROM chunks c WHERE c.chunk_id>=blocks.first AND c.chunk_id<blocks.first+blocks.n)",
            ((f,) for f in firsts))
        return ids

    # -- chunks ---------------------------------------------------------------------------------
    def put_chunks(self, chunks: Iterable[Chunk]) -> None:
        """Store chunks; the first batch with enough text trains the compression dictionary."""
        chunks = sorted(chunks, key=lambda c: c.chunk_id)
        use_dictionary(self.db, self.codec, chunks)
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
        write_blocks(self.db, self.codec, [(c.chunk_id, codec.payload(c.text, c.metadata)) for c in chunks])
        self.keyword.add([(c.chunk_id, c.text) for c in chunks])

    def select_chunks(self, where: str, args: Sequence[Any]) -> list[Chunk]:
        """The chunks ``where`` selects (``c`` the chunks, ``d`` the documents), in reading order."""
        rows = self.db.execute(
            f"SELECT c.chunk_id, {_SHA.replace('sha', 'd.sha')}, d.source, c.ordinal, b.first, b.body FROM chunks c "
            f"JOIN documents d ON d.doc=c.doc JOIN blocks b ON b.first=({schema.BLOCK_OF.format(id='c.chunk_id')}) "
            f"WHERE {where} ORDER BY c.doc, c.ordinal", args)
        return [Chunk(cid, doc, src, o, *self.codec.chunk(cid, first, body)) for cid, doc, src, o, first, body in rows]

    def chunks_of(self, source: str, lo: int, hi: int) -> list[Chunk]:
        key = self._doc(source)
        return [] if key is None else self.select_chunks("c.doc=? AND c.ordinal BETWEEN ? AND ?", (key, lo, hi))

    #: `Catalog.live_ids`' filter on a source glob (``?``)
    SOURCE_GLOB = "doc IN (SELECT doc FROM documents WHERE source GLOB ?)"

    def text_bytes(self) -> int:
        return int(self.db.execute("SELECT COALESCE(SUM(nbytes), 0) FROM chunks").fetchone()[0])


def read_dictionary(db: sqlite3.Connection, number: int) -> bytes | None:
    """Dictionary ``number``'s bytes, or None (what a `codec.Codec` loads dictionaries with)."""
    row = db.execute("SELECT data FROM dictionaries WHERE id=?", (number,)).fetchone()
    return row[0] if row else None


def use_dictionary(db: sqlite3.Connection, coder: codec.Codec, chunks: list[Chunk]) -> None:
    """Encode with the newest stored dictionary; train one on ``chunks`` when there is none."""
    row = db.execute("SELECT id, data FROM dictionaries ORDER BY id DESC LIMIT 1").fetchone()
    if row is not None:
        coder.use(*row)
    else:
        install_dictionary(db, coder, [codec.payload(c.text, c.metadata) for c in chunks])


def write_blocks(db: sqlite3.Connection, coder: codec.Codec, payloads: list[tuple[int, str]],
                 table: str = "blocks") -> None:
    """Store ``(chunk_id, payload)`` pairs, ascending by id, as blocks: runs of consecutive ids
    cut every `codec.BLOCK_CHUNKS`."""
    runs: list[list[tuple[int, str]]] = []
    for cid, p in payloads:
        run = runs[-1] if runs else None
        if run is None or cid != run[-1][0] + 1 or len(run) >= codec.BLOCK_CHUNKS:
            runs.append([(cid, p)])
        else:
            run.append((cid, p))
    db.executemany(f"INSERT INTO {table}(first, n, body) VALUES (?,?,?)",
                   ((r[0][0], len(r), coder.encode([p for _, p in r])) for r in runs))


def install_dictionary(db: sqlite3.Connection, coder: codec.Codec, samples: list[str]) -> bool:
    """Train a dictionary on ``samples``, store it and encode with it; False when too little
    text to train on (the coder keeps what it used)."""
    data = codec.train(samples)
    if data is None:
        return False
    number = int(db.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM dictionaries").fetchone()[0])
    db.execute("INSERT INTO dictionaries(id, data) VALUES (?,?)", (number, data))
    coder.use(number, data)
    return True


def sha_bytes(doc_id: str) -> bytes | str:
    """A document id as the compact layout stores it: the 32 bytes of a SHA-256 hex digest (the
    ids `Index` makes), any other id a caller gave as the string itself."""
    return bytes.fromhex(doc_id) if len(doc_id) == 64 and all(c in "0123456789abcdef" for c in doc_id) else doc_id
