"""The legacy layout's reads and writes (catalogs built before the compact store; tables in
`slimrag.catalog.schema`): text and JSON metadata in plain columns, FTS5 kept by triggers.

Such a catalog is read and written as it is until `slimrag.catalog.upgrade.convert` makes it
compact (``slimrag compact``); nothing here writes the compact layout.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from slimrag.catalog import schema
from slimrag.types import Chunk, Document


class LegacyRows:
    """Documents and chunks of a legacy catalog on ``db`` (its FTS5 index is kept by triggers)."""

    compact = False
    #: `Catalog.live_ids`' filter on a source glob (``?``)
    SOURCE_GLOB = "source GLOB ?"
    _DOC_SQL = "SELECT doc_id, source, mtime, size FROM documents"

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def document(self, source: str) -> Document | None:
        row = self.db.execute(self._DOC_SQL + " WHERE source=?", (source,)).fetchone()
        return Document(*row) if row else None

    def documents(self) -> list[Document]:
        return [Document(*r) for r in self.db.execute(self._DOC_SQL + " ORDER BY source")]

    def put_document(self, doc: Document) -> None:
        self.db.execute("INSERT OR REPLACE INTO documents(source, doc_id, mtime, size) VALUES (?,?,?,?)",
                        (doc.source, doc.doc_id, doc.mtime, doc.size))

    def touch_documents(self, rows: Iterable[tuple[float, int, str]]) -> None:
        self.db.executemany("UPDATE documents SET mtime=?1, size=?2 WHERE source=?3", rows)

    def delete_document(self, source: str) -> list[int]:
        ids = [r[0] for r in self.db.execute("SELECT chunk_id FROM chunks WHERE source=?", (source,))]
        self.db.execute("DELETE FROM chunks WHERE source=?", (source,))
        self.db.execute("DELETE FROM documents WHERE source=?", (source,))
        return ids

    def put_chunks(self, chunks: Iterable[Chunk]) -> None:
        self.db.executemany(
            "INSERT INTO chunks(chunk_id, source, ordinal, text, metadata) VALUES (?,?,?,?,?)",
            ((c.chunk_id, c.source, c.ordinal, c.text, json.dumps(c.metadata)) for c in chunks))

    def select_chunks(self, where: str, args: Sequence[Any]) -> list[Chunk]:
        """The chunks ``where`` selects (``c`` the chunks, ``d`` the documents), in reading order."""
        rows = self.db.execute(
            "SELECT c.chunk_id, d.doc_id, c.source, c.ordinal, c.text, c.metadata FROM chunks c "
            f"JOIN documents d ON d.source=c.source WHERE {where} ORDER BY c.source, c.ordinal", args)
        return [Chunk(cid, doc, src, o, text, json.loads(m)) for cid, doc, src, o, text, m in rows]

    def chunks_of(self, source: str, lo: int, hi: int) -> list[Chunk]:
        return self.select_chunks("d.source=? AND c.ordinal BETWEEN ? AND ?", (source, lo, hi))

    def text_bytes(self) -> int:
        """The chunks' text with overlaps counted once (`schema.own_bytes`), read chunk by chunk."""
        total, prev = 0, None
        for source, ordinal, text, meta in self.db.execute(
                "SELECT source, ordinal, text, metadata FROM chunks ORDER BY source, ordinal"):
            m = json.loads(meta)
            total += schema.own_bytes(text, m, prev[2:] if prev and prev[:2] == (source, ordinal - 1) else None)
            prev = (source, ordinal, text, m)
        return total
