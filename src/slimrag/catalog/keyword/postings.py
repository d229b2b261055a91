"""The keyword index without positions: BM25 postings in compressed blocks, in SQLite.

Why not FTS5: with ``detail=full`` FTS5 keeps every token's position, which BM25 never reads;
on disfl_qa that index alone is 0.56x of the text, and it is what kept a slim folder above the
size of its text. Without positions (``detail=none``) FTS5 re-tokenizes every matched chunk to
count its terms, 13-25x slower. This index keeps what BM25 reads and nothing else: for each
term the chunks that hold it and how often (postings), each chunk's token count, and the two
totals. It gives FTS5's ``bm25()`` ranking and scores bit for bit:

- tokens come from FTS5's own ``unicode61`` tokenizer (an in-memory FTS5 table and its
  ``fts5vocab`` instance view), so terms are those FTS5 would index;
- a query word of several tokens (``max_chunk_id``) is a phrase, as in FTS5: its chunks are
  those holding every token, checked by re-tokenizing just those chunks;
- scores follow SQLite's ``fts5Bm25Function`` term by term in query order (`bm25`).

Storage (tables ``keyword_*``, created by `create`):

- ``keyword_segments(seg, level, firsts, ends, body)``: every commit writes one segment (level
  0), so a commit's cost does not grow with the index; `FANOUT` segments of one level merge
  into one of the next (an LSM tree: each posting is rewritten about log_FANOUT(N / commit)
  times in all). A segment's terms are cut into sorted runs of `BLOCK_TERMS`, each run one
  zstd block (`encode`: the terms, then per term its chunk ids as gaps and its term counts,
  split into byte planes so that zstd sees runs of zeros). ``body`` is the blocks end to end,
  ``firsts`` each block's first term and ``ends`` where each block ends in ``body``: a lookup
  reads the small directory, then only the block's bytes (SQLite's incremental blob I/O). One
  blob a segment fills its pages: a row per block left a third of each page empty.
- ``keyword_lengths(chunk_id, n)``: tokens per chunk; a deleted chunk loses its row (trigger
  ``chunks_ad``), and its postings, still in their segment, are skipped by every query and
  dropped by the next merge that reads them.
- ``keyword_stats``: the number of chunks and of tokens, kept by the writes and the trigger,
  and of chunks deleted since the last full `Postings.merge`.
"""

from __future__ import annotations

import bisect
import sqlite3
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import zstandard

from slimrag.catalog.keyword import bm25
from slimrag.catalog.keyword.base import ChunkSource, KeywordDamage
from slimrag.catalog.keyword.postings_block import Block, alive, by_term, decode, encode
from slimrag.catalog.keyword.tokenizer import Fts5Tokenizer
from slimrag.catalog.keyword.words import words as query_words

#: terms per compressed block (256: disfl_qa's postings 0.22x of its text, 1024 gains 0.01)
BLOCK_TERMS = 256
#: segments of one level that merge into one of the next
FANOUT = 8
#: compressed bytes of segments a merge may take at once (a merge holds ~18 bytes a posting in
#: memory, ~15x the compressed size on synthetic passages: ~1 GB); larger levels stay unmerged,
#: and a query reads one more block per segment (at 10M synthetic passages ~30 segments)
MERGE_MAX_BYTES = 64 << 20
#: decoded blocks kept per open catalog (a query reads one block per word and segment)
CACHE_BLOCKS = 256
#: zstd level of the blocks a commit or a level's merge writes (3: 3% larger than 9, 4.6x faster),
#: and of those a compaction's full merge writes (they stay)
LEVEL, LEVEL_COMPACT = 3, 9

TABLES = [
    "CREATE TABLE keyword_segments (seg INTEGER PRIMARY KEY AUTOINCREMENT, level INTEGER NOT NULL, "
    "firsts BLOB NOT NULL, ends BLOB NOT NULL, body BLOB NOT NULL)",
    "CREATE TABLE keyword_lengths (chunk_id INTEGER PRIMARY KEY, n INTEGER NOT NULL)",
    "CREATE TABLE keyword_stats (id INTEGER PRIMARY KEY CHECK (id=0), rows INTEGER NOT NULL, "
    "tokens INTEGER NOT NULL, dead INTEGER NOT NULL)",
    "INSERT INTO keyword_stats(id, rows, tokens, dead) VALUES (0, 0, 0, 0)",
    """CREATE TRIGGER chunks_ad AFTER DELETE ON chunks BEGIN
    UPDATE keyword_stats SET rows=rows-1, dead=dead+1,
        tokens=tokens-(SELECT n FROM keyword_lengths WHERE chunk_id=old.chunk_id) WHERE id=0;
    DELETE FROM keyword_lengths WHERE chunk_id=old.chunk_id;
    INSERT OR IGNORE INTO tombstones(chunk_id) VALUES (old.chunk_id);
END""",
]
NAMES = ("keyword_segments", "keyword_lengths", "keyword_stats")


def create(db: sqlite3.Connection) -> None:
    """Create the empty index and its delete trigger (inside the caller's transaction)."""
    for stmt in TABLES:
        db.execute(stmt)


def drop(db: sqlite3.Connection) -> None:
    """Drop the index and its trigger (inside the caller's transaction)."""
    db.execute("DROP TRIGGER IF EXISTS chunks_ad")
    for name in NAMES:
        db.execute(f"DROP TABLE IF EXISTS {name}")


def present(db: sqlite3.Connection) -> bool:
    """True when ``db`` holds this index."""
    return db.execute("SELECT 1 FROM sqlite_schema WHERE name='keyword_segments'").fetchone() is not None


# -- the index ------------------------------------------------------------------------------------
class Postings:
    """`KeywordIndex` in one catalog connection: writes (`add`, `merge`, `rebuild`) run inside
    the caller's transaction; `search` reads. It keeps no reference to its `Catalog` (which owns
    it), so an unclosed catalog is freed, and its file closed, as soon as it is dropped."""

    kind = "postings"

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self._tok: Fts5Tokenizer | None = None
        self._zc = zstandard.ZstdCompressor(level=LEVEL)
        self._zc_compact = zstandard.ZstdCompressor(level=LEVEL_COMPACT)
        self._zd = zstandard.ZstdDecompressor()
        self._blocks: OrderedDict[tuple[int, int], Block] = OrderedDict()
        self._dirs: dict[int, tuple[list[str], np.ndarray]] = {}
        self._lengths: np.ndarray | None = None
        self._version = -1

    @property
    def tokenizer(self) -> Fts5Tokenizer:
        if self._tok is None:
            self._tok = Fts5Tokenizer()
        return self._tok

    def _remember_lengths(self, ids: np.ndarray, lengths: np.ndarray) -> None:
        """Keep the cached lengths current through this connection's own adds (reloading them
        per commit would cost each commit in proportion to the index)."""
        live = self._lengths
        if live is None or not len(ids):
            return
        top = int(ids.max()) + 1
        if top > len(live):
            live = np.concatenate([live, np.full(max(top - len(live), len(live) // 2), -1, dtype=live.dtype)])
        live[ids] = lengths
        self._lengths = live

    def forget(self) -> None:
        """Drop what is cached from the file (after a rollback, or another process's commit)."""
        self._blocks.clear()
        self._dirs.clear()
        self._lengths = None

    # -- writing --------------------------------------------------------------------------------
    def add(self, rows: Sequence[tuple[int, str]]) -> None:
        """Index chunks ``(chunk_id, text)`` as one new segment, then merge full levels."""
        if not rows:
            return
        ids = np.array([r[0] for r in rows], dtype=np.int64)
        names, row, cnt, lengths = self.tokenizer.counts([r[1] for r in rows])
        self._remember_lengths(ids, lengths.astype(np.int32))
        self.db.executemany("INSERT INTO keyword_lengths(chunk_id, n) VALUES (?,?)",
                            zip(ids.tolist(), lengths.tolist(), strict=True))
        self.db.execute("UPDATE keyword_stats SET rows=rows+?, tokens=tokens+? WHERE id=0",
                        (len(rows), int(lengths.sum())))
        key = np.array(names, dtype=object)
        new = np.ones(len(names), dtype=bool)  # where each term's run begins (sorted by term)
        new[1:] = key[1:] != key[:-1]
        rank = np.cumsum(new) - 1
        chunk = ids[row]
        order = by_term(rank, chunk)
        terms = [names[i] for i in np.flatnonzero(new).tolist()]
        self._write_segment(0, terms, np.bincount(rank, minlength=len(terms)), chunk[order], cnt[order])
        self._cascade()

    def _write_segment(self, level: int, terms: list[str], counts: np.ndarray, ids: np.ndarray,
                       tfs: np.ndarray, final: bool = False) -> None:
        """A new segment of sorted ``terms`` with ``counts[i]`` postings each (``ids``, ``tfs``
        end to end, by term then chunk id); ``final``: a compaction's, compressed harder."""
        zc = self._zc_compact if final else self._zc
        ends_at = np.cumsum(counts)
        blocks, firsts = [], []
        for s in range(0, len(terms), BLOCK_TERMS):
            e = min(s + BLOCK_TERMS, len(terms))
            a, b = (int(ends_at[s - 1]) if s else 0), int(ends_at[e - 1])
            blocks.append(zc.compress(encode(terms[s:e], counts[s:e], ids[a:b], tfs[a:b])))
            firsts.append(terms[s])
        ends = np.cumsum([len(b) for b in blocks]).astype("<u8").tobytes()
        self.db.execute("INSERT INTO keyword_segments(level, firsts, ends, body) VALUES (?,?,?,?)",
                        (level, self._zc.compress("\0".join(firsts).encode("utf-8")), ends, b"".join(blocks)))

    def _directory(self, seg: int) -> tuple[list[str], np.ndarray]:
        """A segment's block directory: first terms, and the end of each block in its body."""
        got = self._dirs.get(seg)
        if got is None:
            firsts, ends = self.db.execute("SELECT firsts, ends FROM keyword_segments WHERE seg=?", (seg,)).fetchone()
            names = self._zd.decompress(firsts).decode("utf-8")
            got = (names.split("\0") if names else [], np.frombuffer(ends, dtype="<u8").astype(np.int64))
            self._dirs[seg] = got
        return got

    def _segment_blocks(self, seg: int) -> Iterable[Block]:
        """Every block of a segment, in term order."""
        (body,) = self.db.execute("SELECT body FROM keyword_segments WHERE seg=?", (seg,)).fetchone()
        _, ends = self._directory(seg)
        start = 0
        for end in ends.tolist():
            yield decode(self._zd.decompress(body[start:end]))
            start = end

    def _cascade(self) -> None:
        """Merge the first `FANOUT` segments of every level that holds that many into one segment
        of the next level (a level only fills from the one below, so the first level short of
        `FANOUT` ends it), unless they hold more than `MERGE_MAX_BYTES`: those stay where they
        are, so no merge holds more than ~`MERGE_MAX_BYTES` x 15 of postings in memory."""
        level = 0
        while True:
            got = self.db.execute("SELECT seg, length(body) FROM keyword_segments WHERE level=? ORDER BY seg LIMIT ?",
                                  (level, FANOUT)).fetchall()
            if len(got) < FANOUT or sum(n for _, n in got) > MERGE_MAX_BYTES:
                return
            self._merge([seg for seg, _ in got], level + 1)
            level += 1

    def merge(self, full: bool = True) -> None:
        """``full``: merge every segment into one, dropping deleted chunks' postings (a
        compaction); a no-op when there is one segment and nothing was deleted since the last
        merge. Past `MERGE_MAX_BYTES` of segments, only the levels merge (`_cascade`). Not
        ``full``: nothing (the levels merge as commits fill them)."""
        if not full:
            return
        size = int(self.db.execute("SELECT COALESCE(SUM(length(body)), 0) FROM keyword_segments").fetchone()[0])
        if size > MERGE_MAX_BYTES:
            self._cascade()
            return
        segs = [r[0] for r in self.db.execute("SELECT seg FROM keyword_segments ORDER BY seg")]
        dead = int(self.db.execute("SELECT dead FROM keyword_stats WHERE id=0").fetchone()[0])
        if len(segs) > 1 or dead:
            top = int(self.db.execute("SELECT COALESCE(MAX(level), 0) FROM keyword_segments").fetchone()[0])
            self._merge(segs, top, final=True)
            self.db.execute("UPDATE keyword_stats SET dead=0 WHERE id=0")

    def _merge(self, segs: list[int], level: int, final: bool = False) -> None:
        """Replace ``segs`` by one segment at ``level`` holding their live postings. Holds the
        segments' postings in memory, ~18 bytes each (chunk ids are below 2**32)."""
        names: list[list[str]] = []
        counts, ids, tfs = [], [], []
        for seg in segs:
            for block in self._segment_blocks(seg):
                names.append(block.terms)
                counts.append(np.diff(block.starts))
                ids.append(block.ids.astype(np.uint32))
                tfs.append(block.tfs.astype(np.uint16))
            self._dirs.pop(seg, None)
        terms = sorted(set().union(*names)) if names else []
        rank_of = {t: i for i, t in enumerate(terms)}
        rank = np.repeat(np.array([rank_of[t] for ts in names for t in ts], dtype=np.int32),
                         np.concatenate(counts) if counts else np.zeros(0, np.int64))
        all_ids = np.concatenate(ids) if ids else np.zeros(0, np.uint32)
        all_tfs = np.concatenate(tfs) if tfs else np.zeros(0, np.uint16)
        if int(self.db.execute("SELECT dead FROM keyword_stats WHERE id=0").fetchone()[0]):  # else all live
            keep = alive(all_ids.astype(np.int64), self._live_lengths())  # chunks deleted since a full merge
            rank, all_ids, all_tfs = rank[keep], all_ids[keep], all_tfs[keep]
        order = by_term(rank, all_ids)
        per_term = np.bincount(rank, minlength=len(terms))
        held = per_term > 0  # a term whose every chunk was deleted goes
        marks = ",".join("?" * len(segs))
        self.db.execute(f"DELETE FROM keyword_segments WHERE seg IN ({marks})", segs)
        if held.any():
            self._write_segment(level, [t for t, h in zip(terms, held.tolist(), strict=True) if h], per_term[held],
                                all_ids[order], all_tfs[order], final)

    def rebuild(self, batch: int = 2048) -> None:
        """`reindex` from the catalog's ``chunk_text`` view, ``batch`` chunks a segment, then merge."""
        def batches() -> Iterable[list[tuple[int, str]]]:
            last = -1
            while True:
                rows = self.db.execute("SELECT chunk_id, text FROM chunk_text WHERE chunk_id>? ORDER BY chunk_id "
                                       "LIMIT ?", (last, batch)).fetchall()
                if not rows:
                    return
                yield rows
                last = rows[-1][0]
        self.reindex(batches())
        self.merge()

    def reindex(self, rows: Iterable[Sequence[tuple[int, str]]]) -> None:
        """Empty the index and index ``rows`` (batches of ``(chunk_id, text)``) anew."""
        for name in ("keyword_segments", "keyword_lengths"):
            self.db.execute(f"DELETE FROM {name}")
        self.db.execute("UPDATE keyword_stats SET rows=0, tokens=0, dead=0 WHERE id=0")
        self.forget()
        for batch in rows:
            self.add(batch)

    # -- reading --------------------------------------------------------------------------------
    def _live_lengths(self) -> np.ndarray:
        """Tokens per chunk indexed by chunk id; -1 where no chunk is stored (ids past the end
        are not stored either, see `postings_block.alive`)."""
        if self._lengths is None:
            got = np.array(self.db.execute("SELECT chunk_id, n FROM keyword_lengths").fetchall(),
                           dtype=np.int64).reshape(-1, 2)
            out = np.full(int(got[:, 0].max()) + 1 if len(got) else 0, -1, dtype=np.int32)
            out[got[:, 0]] = got[:, 1]
            self._lengths = out
        return self._lengths

    def _block(self, seg: int, term: str) -> Block | None:
        """The block of ``seg`` that would hold ``term``, or None when ``term`` sorts first."""
        firsts, ends = self._directory(seg)
        i = bisect.bisect_right(firsts, term) - 1
        if i < 0:
            return None
        key = (seg, i)
        block = self._blocks.get(key)
        if block is None:
            start = int(ends[i - 1]) if i else 0
            with self.db.blobopen("keyword_segments", "body", seg, readonly=True) as blob:
                blob.seek(start)
                block = decode(self._zd.decompress(blob.read(int(ends[i]) - start)))
            self._blocks[key] = block
            if len(self._blocks) > CACHE_BLOCKS:
                self._blocks.popitem(last=False)
        else:
            self._blocks.move_to_end(key)
        return block

    def postings(self, term: str, segs: Sequence[int], live: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The live chunks holding ``term`` (ascending ids) and its count in each."""
        ids, tfs = [], []
        for seg in segs:
            block = self._block(seg, term)
            got = block.get(term) if block is not None else None
            if got is not None:
                ids.append(got[0])
                tfs.append(got[1])
        if not ids:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        a, f = np.concatenate(ids), np.concatenate(tfs)
        if len(ids) > 1:
            order = np.argsort(a, kind="stable")
            a, f = a[order], f[order]
        keep = alive(a, live)
        return a[keep], f[keep]

    def search(self, query: str, k: int, source_glob: str | None,
               chunks: ChunkSource) -> list[tuple[int, float]]:
        """The ``k`` best chunks for ``query`` (its words, `slimrag.catalog.keyword.words`), those
        of sources matching ``source_glob`` only (the statistics still count every chunk)."""
        allowed = None if not source_glob else np.array(chunks.live_ids(source_glob), dtype=np.int64)
        return self.search_words(query_words(query), k, chunks.texts, allowed)

    def search_words(self, words: Sequence[str], k: int, texts: Callable[[Sequence[int]], list[str]],
                     allowed: np.ndarray | None = None) -> list[tuple[int, float]]:
        """The ``k`` best chunks for the query ``words`` (each a phrase of its tokens, all
        OR-ed) by FTS5's BM25: (chunk_id, score) best first, ties by ascending id. ``texts``:
        chunk texts by id (`Catalog.texts`), which a phrase needs. ``allowed``: sorted chunk ids
        the result may hold (the statistics still count every chunk). Its reads run in one read
        transaction (a snapshot), so another process merging segments meanwhile cannot remove a
        segment between the listing and the read of it."""
        if self.db.in_transaction:  # a writer's own search, inside its transaction: already one snapshot
            return self._search_words(words, k, texts, allowed)
        self.db.execute("BEGIN")
        try:
            return self._search_words(words, k, texts, allowed)
        finally:
            self.db.execute("COMMIT")

    def _search_words(self, words: Sequence[str], k: int, texts: Callable[[Sequence[int]], list[str]],
                      allowed: np.ndarray | None) -> list[tuple[int, float]]:
        version = int(self.db.execute("PRAGMA data_version").fetchone()[0])
        if version != self._version:  # another connection committed: what is cached may be stale
            self.forget()
            self._version = version
        nrow, ntok = self.db.execute("SELECT rows, tokens FROM keyword_stats WHERE id=0").fetchone()
        if not words or nrow <= 0:
            return []
        live = self._live_lengths()
        segs = [r[0] for r in self.db.execute("SELECT seg FROM keyword_segments ORDER BY seg")]
        phrases = self.tokenizer.tokens(list(words))
        cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}

        def post(t: str) -> tuple[np.ndarray, np.ndarray]:
            if t not in cache:
                cache[t] = self.postings(t, segs, live)
            return cache[t]

        hits: list[tuple[np.ndarray, np.ndarray]] = []
        for tokens in phrases:
            if not tokens:
                hits.append((np.zeros(0, np.int64), np.zeros(0, np.int64)))
            elif len(tokens) == 1:
                hits.append(post(tokens[0]))
            else:
                hits.append(self._phrase(tokens, [post(t)[0] for t in tokens], texts))
        return bm25.top_k(hits, live, int(nrow), int(ntok), k, allowed)

    def _phrase(self, tokens: list[str], lists: list[np.ndarray],
                texts: Callable[[Sequence[int]], list[str]]) -> tuple[np.ndarray, np.ndarray]:
        """Chunks holding ``tokens`` as consecutive tokens, and how many times (FTS5 counts
        every start, overlaps included): candidates hold every token, then are re-tokenized."""
        cand = lists[0]
        for other in lists[1:]:
            cand = np.intersect1d(cand, other, assume_unique=True)
        if len(cand) == 0:
            return cand, np.zeros(0, np.int64)
        ids, counts = [], []
        for start in range(0, len(cand), 512):
            part = cand[start: start + 512].tolist()
            got = self.tokenizer.phrase_counts(texts(part), tokens)
            ids += [cid for cid, c in zip(part, got, strict=True) if c]
            counts += [c for c in got if c]
        return np.array(ids, dtype=np.int64), np.array(counts, dtype=np.int64)

    def check(self) -> list[KeywordDamage]:
        """What disagrees between the index and the chunks table: chunks without a length row
        or the reverse, and totals that differ from the lengths."""
        errors: list[KeywordDamage] = []
        missing = self.db.execute("SELECT COUNT(*) FROM chunks c WHERE NOT EXISTS "
                                  "(SELECT 1 FROM keyword_lengths k WHERE k.chunk_id=c.chunk_id)").fetchone()[0]
        extra = self.db.execute("SELECT COUNT(*) FROM keyword_lengths k WHERE NOT EXISTS "
                                "(SELECT 1 FROM chunks c WHERE c.chunk_id=k.chunk_id)").fetchone()[0]
        if missing or extra:
            errors.append(KeywordDamage(f"keyword: {missing} chunks not indexed, {extra} lengths of chunks not stored"))
        rows, tokens = self.db.execute("SELECT rows, tokens FROM keyword_stats WHERE id=0").fetchone()
        want = self.db.execute("SELECT COUNT(*), COALESCE(SUM(n), 0) FROM keyword_lengths").fetchone()
        if (rows, tokens) != tuple(want):
            errors.append(KeywordDamage(f"keyword: totals {rows} chunks / {tokens} tokens, "
                                        f"lengths say {want[0]} / {want[1]}"))
        return errors
