"""FTS5's tokens from Python, for the postings keyword index (`slimrag.catalog.keyword.postings`)."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence

import numpy as np


class Fts5Tokenizer:
    """FTS5's ``unicode61`` tokenizer, run by an in-memory FTS5 table: the only way to get its
    exact tokens (case folding, diacritics, which characters separate) from Python."""

    def __init__(self) -> None:
        self.db = sqlite3.connect(":memory:", check_same_thread=False)
        self.db.execute("CREATE VIRTUAL TABLE t USING fts5(x)")
        self.db.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, instance)")

    def _load(self, texts: Sequence[str]) -> None:
        self.db.execute("DELETE FROM t")
        self.db.executemany("INSERT INTO t(rowid, x) VALUES (?,?)", enumerate(texts))

    def counts(self, texts: Sequence[str]) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        """For ``texts``: (term, row, count) for every term of every row, sorted by term then
        row, as a list of terms and two arrays, and the tokens of each row. SQLite joins them
        into three strings: a tuple per (term, row), ~100k a commit, made the garbage
        collector's full passes come every few commits."""
        self._load(texts)
        terms, rows, counts = self.db.execute(
            "SELECT group_concat(term, char(0)), group_concat(doc), group_concat(n) FROM "
            "(SELECT term, doc, COUNT(*) AS n FROM v GROUP BY term, doc ORDER BY term, doc)").fetchone()
        names = terms.split("\0") if terms is not None else []
        row, cnt = (np.array(x.split(","), dtype=np.int64) if x else np.zeros(0, np.int64) for x in (rows, counts))
        key = np.array(names, dtype=object)
        if len(key) > 1 and not (key[1:] >= key[:-1]).all():  # the aggregate's input order is not promised
            order = np.lexsort((row, np.unique(key, return_inverse=True)[1]))
            names, row, cnt = [names[i] for i in order.tolist()], row[order], cnt[order]
        lengths = np.zeros(len(texts), dtype=np.int64)
        docs, ns = self.db.execute("SELECT group_concat(doc), group_concat(n) FROM "
                                   "(SELECT doc, COUNT(*) AS n FROM v GROUP BY doc)").fetchone()
        if docs:
            lengths[np.array(docs.split(","), dtype=np.int64)] = np.array(ns.split(","), dtype=np.int64)
        return names, row, cnt, lengths

    def tokens(self, texts: Sequence[str]) -> list[list[str]]:
        """Each text's tokens in order."""
        self._load(texts)
        out: list[list[str]] = [[] for _ in texts]
        for term, doc in self.db.execute("SELECT term, doc FROM v ORDER BY doc, offset"):
            out[doc].append(term)
        return out

    def phrase_counts(self, texts: Sequence[str], phrase: list[str]) -> list[int]:
        """How many times each text holds ``phrase`` (tokens) as consecutive tokens: every
        start, overlaps included, as FTS5 counts a phrase. An ASCII text is matched by a regular
        expression (``unicode61`` makes ASCII tokens of letters and digits only, lower-cased),
        30x faster than tokenizing; any other text goes through FTS5."""
        n = len(phrase)
        rx = _ascii_phrase(phrase)
        out = [len(rx.findall(t.lower())) if rx is not None and t.isascii() else -1 for t in texts]
        rest = [i for i, c in enumerate(out) if c < 0]
        for i, toks in zip(rest, self.tokens([texts[i] for i in rest]), strict=True):
            out[i] = sum(1 for j in range(len(toks) - n + 1) if toks[j: j + n] == phrase)
        return out


def _ascii_phrase(phrase: list[str]) -> re.Pattern[str] | None:
    """A pattern with one (empty) match at each start of ``phrase`` in lower-cased ASCII text;
    None when a token is not ASCII letters and digits (no ASCII text holds it)."""
    if not all(t.isascii() and t.isalnum() for t in phrase):
        return None
    return re.compile(r"(?<![a-z0-9])(?=" + r"[^a-z0-9]+".join(phrase) + r"(?![a-z0-9]))")
