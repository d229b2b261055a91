"""FTS5's tokens from Python, for the postings keyword index (`slimrag.catalog.postings`)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence


class Tokenizer:
    """FTS5's ``unicode61`` tokenizer, run by an in-memory FTS5 table: the only way to get its
    exact tokens (case folding, diacritics, which characters separate) from Python."""

    def __init__(self) -> None:
        self.db = sqlite3.connect(":memory:", check_same_thread=False)
        self.db.execute("CREATE VIRTUAL TABLE t USING fts5(x)")
        self.db.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, instance)")

    def _load(self, texts: Sequence[str]) -> None:
        self.db.execute("DELETE FROM t")
        self.db.executemany("INSERT INTO t(rowid, x) VALUES (?,?)", enumerate(texts))

    def counts(self, texts: Sequence[str]) -> tuple[list[tuple[str, int, int]], list[int]]:
        """((term, row, count) sorted by term then row, tokens per row) for ``texts``."""
        self._load(texts)
        rows = self.db.execute("SELECT term, doc, COUNT(*) FROM v GROUP BY term, doc ORDER BY term, doc").fetchall()
        lengths = [0] * len(texts)
        for doc, n in self.db.execute("SELECT doc, COUNT(*) FROM v GROUP BY doc"):
            lengths[doc] = n
        return rows, lengths

    def tokens(self, texts: Sequence[str]) -> list[list[str]]:
        """Each text's tokens in order."""
        self._load(texts)
        out: list[list[str]] = [[] for _ in texts]
        for term, doc in self.db.execute("SELECT term, doc FROM v ORDER BY doc, offset"):
            out[doc].append(term)
        return out

    def phrase_counts(self, texts: Sequence[str], phrase: list[str]) -> list[int]:
        """How many times each text holds ``phrase`` (tokens) as consecutive tokens: every
        start, overlaps included, as FTS5 counts a phrase."""
        n = len(phrase)
        return [sum(1 for i in range(len(toks) - n + 1) if toks[i: i + n] == phrase) for toks in self.tokens(texts)]
