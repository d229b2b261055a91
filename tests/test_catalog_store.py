"""The compact text store: chunks round-trip through compression, keyword search ranks exactly as
the legacy layout (FTS5 detail=full over plain text) does (the postings index of
`slimrag.catalog.keyword.postings` included: same ids, same scores, bit for bit), and legacy catalogs open, keep working
and upgrade in place. Real SQLite files throughout; the legacy reference is the schema indexes
were built with before the compact store."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slimrag.catalog import Catalog
from slimrag.catalog.keyword import kind_of as keyword_detail
from slimrag.catalog.schema import LEGACY_SCHEMA
from slimrag.types import Chunk, Document

WORDS = ("index vector graph chunk text search query keyword score rank embed model token window "
         "overlap compress dictionary sqlite table column page cache writer reader commit crash "
         "lighthouse keeper harbour storm ship lantern night rock wave sailor map compass "
         "bread flour water salt yeast oven knead loaf crust dough").split()

SYLLABLES = "ka lo mi nu pe ra si to vu we xa yo zi ba de fo gu hi ja ko lu ma ne pi".split()


def corpus(n_docs: int, seed: int = 0) -> list[tuple[Document, list[Chunk]]]:
    """Seeded documents of 1-4 chunks with Zipf-like word use (so terms repeat across chunks and
    BM25 has term frequencies to weigh), chunk ids in input order."""
    rng = random.Random(seed)
    vocab = WORDS + [a + b + c for a in SYLLABLES for b in SYLLABLES for c in ("", "s", "ing", "ed")][:1500]
    weights = [1 / (i + 1) for i in range(len(vocab))]
    out, next_id = [], 0
    for d in range(n_docs):
        source = f"docs/{'ab'[d % 2]}/{d:04d}.md"
        texts = [" ".join(rng.choices(vocab, weights, k=rng.randint(20, 120))) for _ in range(rng.randint(1, 4))]
        doc = Document(hashlib.sha256("".join(texts).encode()).hexdigest(), source, 1.5e9 + d, 100 + d)
        chunks = [Chunk(next_id + i, doc.doc_id, source, i, t, {"heading": f"h{d}", "tokens": len(t.split()),
                                                                "ordinal": i}) for i, t in enumerate(texts)]
        next_id += len(chunks)
        out.append((doc, chunks))
    return out


def legacy(path: Path) -> Catalog:
    """A catalog in the layout indexes had before the compact store (opened by today's code)."""
    db = sqlite3.connect(path)
    db.executescript(LEGACY_SCHEMA)
    db.close()
    return Catalog(path)


def fill(cat: Catalog, docs: list[tuple[Document, list[Chunk]]]) -> None:
    """One commit, as the index writer makes them: the documents, then all their chunks."""
    with cat.transaction():
        for doc, _ in docs:
            cat.put_document(doc)
        cat.put_chunks([c for _, cs in docs for c in cs])


def queries(docs: list[tuple[Document, list[Chunk]]], n: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    texts = [c.text for _, cs in docs for c in cs]
    out = []
    for _ in range(n):
        w = rng.choice(texts).split()
        a = rng.randrange(len(w))
        out.append(" ".join(w[a: a + rng.randint(1, 8)]))
    return out + ["lighthouse", "zzz-no-such-word", "bread: \"oven\" -salt", "Lighthouse KEEPER's lantern?"]


@pytest.fixture(scope="module")
def docs() -> list[tuple[Document, list[Chunk]]]:
    return corpus(600)  # ~250 KiB of text: enough to train a dictionary


def test_round_trip_and_dictionary(tmp_path: Path, docs: list) -> None:
    cat = Catalog(tmp_path / "c.sqlite")
    fill(cat, docs)
    assert cat.compact and keyword_detail(cat.db) == "postings"  # the default: exact BM25, no positions
    assert cat.db.execute("SELECT COUNT(*) FROM dictionaries").fetchone()[0] == 1
    want = {c.chunk_id: c for _, cs in docs for c in cs}
    assert cat.chunks(list(want)) == want
    assert cat.documents() == sorted((d for d, _ in docs), key=lambda d: d.source)
    doc, chunks = docs[7]
    assert cat.document(doc.source) == doc
    assert cat.chunks_of(doc.source, 0, 10) == chunks
    assert cat.texts([chunks[-1].chunk_id, chunks[0].chunk_id]) == [chunks[-1].text, chunks[0].text]
    assert cat.live_ids("docs/a/*") == sorted(c.chunk_id for d, cs in docs for c in cs if "/a/" in d.source)
    text = sum(len(c.text.encode()) for c in want.values())
    assert cat.part_bytes()["text"] < 0.8 * text  # compressed (a random word list compresses less than prose)
    assert cat.integrity_errors() == []
    # a second connection (another process would be the same) reads what the first wrote
    other = Catalog(tmp_path / "c.sqlite")
    assert other.chunks([0, 5])[5] == want[5]
    other.close()
    cat.close()


@pytest.mark.parametrize("detail", ["full", "none", "postings"])
def test_keyword_search_ranks_as_the_legacy_layout(tmp_path: Path, docs: list, detail: str) -> None:
    """Every keyword index scores as the legacy layout: ``full`` from its own counts, ``none`` by
    re-reading the matched chunks' text through the decoding view, ``postings`` from its term
    counts and chunk lengths."""
    new, old = Catalog(tmp_path / "new.sqlite", keyword_detail=detail), legacy(tmp_path / "old.sqlite")
    assert keyword_detail(new.db) == detail
    assert not old.compact and keyword_detail(old.db) == "full"
    for cat in (new, old):
        fill(cat, docs)
    for q in queries(docs, 60):
        for k in (1, 10):
            assert new.keyword_search(q, k) == old.keyword_search(q, k), q
        assert new.keyword_search(q, 10, "docs/b/*") == old.keyword_search(q, 10, "docs/b/*"), q
    assert new.keyword_search("lighthouse", 5)  # the comparison is not of two empty lists


def test_words_of_several_tokens_match_all_of_them(tmp_path: Path, docs: list) -> None:
    """``detail=none`` keeps no positions, so ``storm_ship`` cannot be a phrase: it is the AND of
    its tokens (a superset of the phrase's matches); ``detail=full`` keeps the phrase, and the
    postings (the default) find it by re-tokenizing the chunks that hold both tokens."""
    new, old, full = Catalog(tmp_path / "new.sqlite", keyword_detail="none"), legacy(tmp_path / "old.sqlite"), \
        Catalog(tmp_path / "full.sqlite", keyword_detail="full")
    post = Catalog(tmp_path / "postings.sqlite")
    for cat in (new, old, full, post):
        fill(cat, docs)
    texts = {c.chunk_id: c.text.split() for _, cs in docs for c in cs}
    both = {i for i, w in texts.items() if "storm" in w and "ship" in w}
    phrase = {i for i, w in texts.items() if any(a == "storm" and b == "ship" for a, b in zip(w, w[1:], strict=False))}
    assert phrase and phrase < both
    assert {i for i, _ in new.keyword_search("storm_ship", 10_000)} == both
    assert {i for i, _ in old.keyword_search("storm_ship", 10_000)} == phrase
    assert full.keyword_search("storm_ship", 10_000) == old.keyword_search("storm_ship", 10_000)
    for q in ("storm_ship", "storm_ship lantern storm_ship", "ship_storm_ship", "___ keeper", "_"):
        assert post.keyword_search(q, 10_000) == old.keyword_search(q, 10_000), q


def test_deletes_and_replacements_keep_the_keyword_index_sound(tmp_path: Path, docs: list) -> None:
    new, old = Catalog(tmp_path / "new.sqlite"), legacy(tmp_path / "old.sqlite")
    replacement = corpus(30, seed=9)
    for cat in (new, old):
        fill(cat, docs)
        with cat.transaction():
            removed = cat.delete_document(docs[3][0].source)
            assert removed == [c.chunk_id for c in docs[3][1]]
            base = cat.max_chunk_id() + 1
            doc, chunks = replacement[0]
            doc = Document(doc.doc_id, docs[4][0].source, doc.mtime, doc.size)  # same source, new content
            cat.put_document(doc)
            cat.put_chunks([Chunk(base + i, doc.doc_id, doc.source, c.ordinal, c.text, c.metadata)
                            for i, c in enumerate(chunks)])
        assert cat.integrity_errors() == []
        assert cat.tombstone_ids() == sorted(removed + [c.chunk_id for c in docs[4][1]])
        assert cat.counts()["documents"] == len(docs) - 1
    for q in queries(docs, 100, seed=5):
        assert new.keyword_search(q, 10) == old.keyword_search(q, 10), q
    gone = {c.chunk_id for c in docs[3][1]}
    assert not gone & {i for i, _ in new.keyword_search(docs[3][1][0].text, 1000)}


def test_rollback_forgets_a_dictionary_made_in_it(tmp_path: Path, docs: list) -> None:
    cat = Catalog(tmp_path / "c.sqlite")
    with pytest.raises(RuntimeError), cat.transaction():
        for doc, _ in docs:
            cat.put_document(doc)
        cat.put_chunks([c for _, cs in docs for c in cs])
        assert cat.db.execute("SELECT COUNT(*) FROM dictionaries").fetchone()[0] == 1
        raise RuntimeError("interrupted")
    assert cat.counts() == {"documents": 0, "chunks": 0, "tombstones": 0}
    small = corpus(3, seed=4)  # too little text to train on: stored with plain zstd
    fill(cat, small)
    assert cat.db.execute("SELECT COUNT(*) FROM dictionaries").fetchone()[0] == 0
    assert cat.chunks([c.chunk_id for c in small[0][1]])[0] == small[0][1][0]
    assert cat.integrity_errors() == []


def test_upgrade_converts_a_legacy_catalog(tmp_path: Path, docs: list) -> None:
    path = tmp_path / "old.sqlite"
    old = legacy(path)
    fill(old, docs)
    with old.transaction():
        old.delete_document(docs[0][0].source)
    qs = queries(docs, 150)
    before = {q: old.keyword_search(q, 10) for q in qs}
    ids = old.live_ids()
    chunks, documents, dead = old.chunks(ids), old.documents(), old.tombstone_ids()
    old.close()  # checkpoints the WAL into the file
    size = path.stat().st_size
    old = Catalog(path)
    assert old.upgrade() is True
    assert old.compact and keyword_detail(old.db) == "postings"  # the default
    assert old.chunks(ids) == chunks and old.documents() == documents and old.tombstone_ids() == dead
    assert {q: old.keyword_search(q, 10) for q in qs} == before
    assert old.integrity_errors() == []
    old.close()
    assert path.stat().st_size < 0.7 * size
    again = Catalog(path)
    assert again.upgrade() is False  # already compact: only merged and vacuumed
    assert again.chunks(ids) == chunks
    again.close()


def test_upgrade_adds_a_dictionary_to_a_catalog_grown_in_small_commits(tmp_path: Path, docs: list) -> None:
    cat = Catalog(tmp_path / "c.sqlite")
    for doc, chunks in docs:  # one document a commit: no single batch is enough to train on
        fill(cat, [(doc, chunks)])
    assert cat.db.execute("SELECT COUNT(*) FROM dictionaries").fetchone()[0] == 0
    plain = cat.part_bytes()["text"]
    want = cat.chunks(cat.live_ids())
    assert cat.upgrade() is False
    assert cat.db.execute("SELECT COUNT(*) FROM dictionaries").fetchone()[0] == 1
    assert cat.chunks(cat.live_ids()) == want
    assert cat.part_bytes()["text"] < plain
    assert cat.integrity_errors() == []


_UPGRADE = """
import sys
from slimrag.catalog import Catalog
c = Catalog(sys.argv[1])
print("go", flush=True)
c.upgrade()
print("done", flush=True)
"""


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.2])
def test_killed_upgrade_leaves_a_sound_catalog(tmp_path: Path, docs: list, delay: float) -> None:
    """SIGKILL during the conversion: the catalog opens afterwards, legacy or compact, with every
    chunk and the same keyword results."""
    path = tmp_path / "old.sqlite"
    old = legacy(path)
    fill(old, docs)
    ids = old.live_ids()
    want = old.chunks(ids)
    qs = queries(docs, 30)
    ranks = [old.keyword_search(q, 10) for q in qs]
    old.close()
    proc = subprocess.Popen([sys.executable, "-c", _UPGRADE, str(path)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "go"
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    cat = Catalog(path)
    assert cat.chunks(ids) == want
    assert [cat.keyword_search(q, 10) for q in qs] == ranks
    assert cat.integrity_errors() == []
    cat.upgrade()
    assert cat.compact and cat.chunks(ids) == want
    cat.close()


def test_blocks_of_deleted_chunks_are_dropped_and_rewritten(tmp_path: Path, docs: list) -> None:
    """Blocks hold runs of consecutive chunk ids: deleting documents empties slots, a block with
    no live chunk goes at once, and `upgrade` rewrites blocks once many slots are dead."""
    cat, ref = Catalog(tmp_path / "c.sqlite"), legacy(tmp_path / "old.sqlite")
    for c in (cat, ref):
        fill(c, docs)
        with c.transaction():
            for doc, _ in docs[: len(docs) // 2]:  # the first half: whole blocks empty
                c.delete_document(doc.source)
            for doc, _ in docs[len(docs) // 2:: 3]:  # every third of the rest: dead slots
                c.delete_document(doc.source)
    orphans = cat.db.execute("SELECT COUNT(*) FROM blocks b WHERE NOT EXISTS (SELECT 1 FROM chunks c "
                             "WHERE c.chunk_id >= b.first AND c.chunk_id < b.first + b.n)").fetchone()[0]
    assert orphans == 0
    ids = ref.live_ids()
    assert cat.live_ids() == ids and cat.chunks(ids) == ref.chunks(ids)
    before = cat.part_bytes()["text"]
    assert cat.upgrade() is False
    assert cat.part_bytes()["text"] < before
    assert cat.chunks(ids) == ref.chunks(ids)
    assert cat.integrity_errors() == []
    for q in queries(docs, 40, seed=3):
        assert cat.keyword_search(q, 10) == ref.keyword_search(q, 10), q
    # ids that do not follow each other start new blocks
    base = cat.max_chunk_id() + 10
    doc = Document("e" * 64, "docs/gaps.md", 0.0, 1)
    gaps = [Chunk(base + 3 * i, doc.doc_id, doc.source, i, f"gap number {i} lantern", {"ordinal": i}) for i in range(5)]
    with cat.transaction():
        cat.put_document(doc)
        cat.put_chunks(gaps)
    assert cat.chunks_of(doc.source, 0, 9) == gaps
    assert {i for i, _ in cat.keyword_search("gap", 10)} == {c.chunk_id for c in gaps}


def test_an_index_built_before_opens_searches_and_compact_converts_it(tmp_path: Path, docs_dir: Path,
                                                                      embedder: object) -> None:
    """End to end on the test corpus: an index whose catalog has the legacy layout (rebuilt here
    from a compact one, the way older slimrag wrote it) searches as before; `slimrag info` says
    so and gives the text ratio; `compact` converts it, and keyword hits stay the same."""
    from click.testing import CliRunner

    from slimrag import Index
    from slimrag.cli import cli

    idx = Index.build(docs_dir, tmp_path / "i.slimrag", embedder=embedder)  # type: ignore[arg-type]
    chunks = idx.catalog.chunks(idx.catalog.live_ids())
    documents = idx.catalog.documents()
    idx.close()
    path = tmp_path / "i.slimrag" / "catalog.sqlite"
    for p in tmp_path.glob("i.slimrag/catalog.sqlite*"):
        p.unlink()
    old = legacy(path)
    with old.transaction():
        for d in documents:
            old.put_document(d)
        old.put_chunks(chunks.values())
    old.close()
    questions = ["office cat", "bread flour", "install slimrag", "largest planet", "Fibonacci"]
    with Index.open(tmp_path / "i.slimrag", embedder) as idx:  # type: ignore[arg-type]
        assert not idx.catalog.compact
        before = [[(h.chunk_id, h.score) for h in idx.search(q, k=3, mode="keyword")] for q in questions]
        assert all(before)
    out = CliRunner().invoke(cli, ["info", str(tmp_path / "i.slimrag")])
    assert out.exit_code == 0, out.output
    assert "keyword index" in out.output and "`slimrag compact` converts it" in out.output
    with Index.open(tmp_path / "i.slimrag", embedder) as idx:  # type: ignore[arg-type]
        idx.compact()
        assert idx.catalog.compact and idx.catalog.chunks(list(chunks)) == chunks
        assert [[(h.chunk_id, h.score) for h in idx.search(q, k=3, mode="keyword")] for q in questions] == before
        assert idx.check().ok
    out = CliRunner().invoke(cli, ["info", "--json", str(tmp_path / "i.slimrag")])
    text = json.loads(out.output)["index"]["text"]
    assert text["compact"] and text["bytes"] == sum(len(c.text.encode()) for c in chunks.values())
    assert text["ratio"] == pytest.approx(text["folder_bytes"] / text["bytes"])


def test_auto_detail_switches_to_full_at_the_bound(tmp_path: Path, docs: list, monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` keeps ``detail=none`` while the catalog is small; the upgrade after it reaches
    `FULL_FROM_CHUNKS` rebuilds the keyword index with positions: phrases are phrases again, and
    every ranking equals the legacy layout's."""
    from slimrag.catalog import store

    n = sum(len(cs) for _, cs in docs)
    monkeypatch.setattr(store, "FULL_FROM_CHUNKS", n)  # the bound, placed at this corpus's size
    cat, ref, fixed = Catalog(tmp_path / "c.sqlite", keyword_detail="auto"), legacy(tmp_path / "old.sqlite"), \
        Catalog(tmp_path / "none.sqlite", keyword_detail="none")
    fill(cat, docs[:10])
    cat.upgrade()
    assert keyword_detail(cat.db) == "none"
    fill(cat, docs[10:])
    for c in (ref, fixed):
        fill(c, docs)
    assert keyword_detail(cat.db) == "none"
    cat.upgrade()
    fixed.upgrade()
    assert keyword_detail(cat.db) == "full" and keyword_detail(fixed.db) == "none"
    assert cat.integrity_errors() == []
    for q in [*queries(docs, 30, seed=8), "storm_ship"]:
        assert cat.keyword_search(q, 10) == ref.keyword_search(q, 10), q
    with cat.transaction():
        cat.delete_document(docs[0][0].source)
    cat.upgrade()
    assert keyword_detail(cat.db) == "full"  # never back: no flipping at the bound


def test_postings_through_merges_deletes_and_other_connections(tmp_path: Path, docs: list) -> None:
    """The postings index against the legacy layout while its segments merge: one small commit per
    document (levels 0 and 1 fill and merge, `postings.FANOUT` = 8), documents deleted from merged and
    unmerged segments alike, a write through another connection, a compaction's full merge, and a
    switch to FTS5 and back; every step ranks as the legacy catalog, ids and scores."""
    from slimrag.catalog.keyword import postings

    post, old = Catalog(tmp_path / "p.sqlite"), legacy(tmp_path / "old.sqlite")
    qs = queries(docs, 40, seed=11)

    def same() -> None:
        for q in qs:
            assert post.keyword_search(q, 10) == old.keyword_search(q, 10), q
        assert post.keyword_search(qs[0], 10, "docs/a/*") == old.keyword_search(qs[0], 10, "docs/a/*")
        assert post.integrity_errors() == []

    for cat in (post, old):
        for doc, chunks in docs[:80]:
            with cat.transaction():
                cat.put_document(doc)
                cat.put_chunks(chunks)
    levels = [r[0] for r in post.db.execute("SELECT level FROM keyword_segments")]
    assert max(levels) >= 1 and len(levels) < 80 and len(levels) <= 2 * postings.FANOUT  # merged, not 80
    same()
    for cat in (post, old):
        with cat.transaction():
            for doc, _ in docs[0:80:7]:  # spread over every segment
                cat.delete_document(doc.source)
    same()
    other = Catalog(tmp_path / "p.sqlite")  # another writer: `post` must not answer from stale caches
    fill(other, docs[80:200])
    other.close()
    fill(old, docs[80:200])
    same()
    assert post.upgrade() is False  # the compaction: one segment, deleted chunks' postings gone
    assert post.db.execute("SELECT COUNT(*), MAX(level) FROM keyword_segments").fetchone()[0] == 1
    assert post.db.execute("SELECT dead FROM keyword_stats").fetchone()[0] == 0
    same()
    with post.transaction():
        from slimrag.catalog import upgrade

        upgrade.set_keyword_detail(post.db, "full")
    assert keyword_detail(post.db) == "full"
    same()
    with post.transaction():
        upgrade.set_keyword_detail(post.db, "postings")
    assert keyword_detail(post.db) == "postings"
    same()
    post.db.execute("UPDATE keyword_stats SET tokens=tokens+1")
    assert any(e.startswith("keyword:") for e in post.integrity_errors())
    post.rebuild_keyword_index()
    same()


def test_postings_blocks_round_trip() -> None:
    """A block decodes to the postings it was made of: gaps across terms, ids far apart, counts
    past one byte."""
    import numpy as np

    from slimrag.catalog.keyword import postings_block

    rng = np.random.default_rng(0)
    terms = sorted({f"t{i}" for i in range(300)} | {"ä", "z" * 40})
    ids = [np.unique(rng.integers(0, 5_000_000, rng.integers(1, 40))) for _ in terms]
    tfs = [rng.integers(1, 70_000, len(x)) for x in ids]
    block = postings_block.decode(postings_block.encode(terms, np.array([len(x) for x in ids]), np.concatenate(ids),
                                                        np.concatenate(tfs)))
    assert block.terms == terms
    for t, i, f in zip(terms, ids, tfs, strict=True):
        got = block.get(t)
        assert got is not None and np.array_equal(got[0], i) and np.array_equal(got[1], np.minimum(f, 65535))
    assert block.get("t") is None and block.get("zz") is None


def test_compaction_brings_a_catalog_of_the_old_default_to_the_postings(tmp_path: Path, docs: list) -> None:
    """A compact catalog made when FTS5 ``full`` was the default (``application_id`` 0) is
    converted by its next upgrade, ranking as before and smaller; ``full`` asked for by name stays."""
    old, named = Catalog(tmp_path / "old.sqlite", keyword_detail="full"), Catalog(tmp_path / "named.sqlite",
                                                                                keyword_detail="full")
    old.db.execute("PRAGMA application_id=0")  # what the previous default wrote
    for cat in (old, named):
        fill(cat, docs)
        cat.upgrade()
    qs = queries(docs, 40, seed=7)
    before = [named.keyword_search(q, 10) for q in qs]
    assert keyword_detail(old.db) == "postings" and keyword_detail(named.db) == "full"
    assert [old.keyword_search(q, 10) for q in qs] == before
    assert old.part_bytes()["keyword"] < 0.7 * named.part_bytes()["keyword"]
    assert old.integrity_errors() == []


def test_postings_merge_segments_whose_chunk_ids_do_not_ascend(tmp_path: Path, docs: list) -> None:
    """Commits may arrive with lower chunk ids than earlier ones (a caller's own ids): merged
    segments still hold each term's chunks in id order, and rank as one commit of it all does."""
    from slimrag.catalog.keyword import postings

    rows = [(c.chunk_id, c.text) for _, cs in docs for c in cs]
    one, many = (sqlite3.connect(tmp_path / f"{n}.sqlite") for n in ("one", "many"))
    for db in (one, many):
        db.execute("CREATE TABLE tombstones (chunk_id INTEGER PRIMARY KEY)")
        db.execute("CREATE TABLE chunks (chunk_id INTEGER PRIMARY KEY)")
        postings.create(db)
    ref, got = postings.Postings(one), postings.Postings(many)
    texts = dict(rows)

    def text(ids):
        return [texts[i] for i in ids]
    ref.add(rows)
    step = len(rows) // (postings.FANOUT * 2) + 1
    for start in reversed(range(0, len(rows), step)):  # highest ids first
        got.add(rows[start: start + step])
    assert many.execute("SELECT MAX(level) FROM keyword_segments").fetchone()[0] >= 1
    for q in queries(docs, 40, seed=13):
        words = q.split()
        assert got.search_words(words, 10, text) == ref.search_words(words, 10, text), q
    got.merge()
    assert got.search_words(["lighthouse", "keeper"], 50, text) == ref.search_words(["lighthouse", "keeper"], 50, text)


def test_phrase_counts_of_ascii_text_equal_fts5_tokens() -> None:
    """The regular-expression count of a phrase in ASCII text equals the count over FTS5's own
    tokens (overlapping starts, punctuation and case between tokens); other text goes through FTS5."""
    from slimrag.catalog.keyword.tokenizer import Fts5Tokenizer

    rng = random.Random(3)
    alphabet = ["a", "b", "ab", "A", "B", "1", "é", "a1"]
    seps = [" ", "_", "-", ". ", "__", "'", "\n", "é"]
    texts = ["".join(rng.choice(alphabet) + rng.choice(seps) for _ in range(rng.randint(0, 30))) for _ in range(300)]
    texts += ["a a a", "A_a-A", "ba a", "a ab a", "", "aé a", "1a a1"]
    tok = Fts5Tokenizer()
    for phrase in (["a", "a"], ["a", "b"], ["ab", "a"], ["a1"], ["b", "a", "b"], ["e", "a"]):  # é is the token e
        want = [sum(1 for j in range(len(t) - len(phrase) + 1) if t[j: j + len(phrase)] == phrase)
                for t in tok.tokens(texts)]
        assert tok.phrase_counts(texts, phrase) == want, phrase
        assert any(want), phrase


def test_postings_levels_past_the_merge_cap_stay_unmerged(tmp_path: Path, docs: list,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Segments holding more than `postings.MERGE_MAX_BYTES` are not merged, by a level or by a
    compaction (so a merge's memory stays bounded); search still ranks as the legacy catalog."""
    from slimrag.catalog.keyword import postings

    monkeypatch.setattr(postings, "MERGE_MAX_BYTES", 6_000)  # a few level-0 segments
    post, old = Catalog(tmp_path / "p.sqlite"), legacy(tmp_path / "old.sqlite")
    for cat in (post, old):
        for doc, chunks in docs[:120]:
            with cat.transaction():
                cat.put_document(doc)
                cat.put_chunks(chunks)
    segs = post.db.execute("SELECT COUNT(*), MAX(level) FROM keyword_segments").fetchone()
    assert segs[0] > postings.FANOUT  # the cap held segments back
    post.upgrade()
    assert post.db.execute("SELECT COUNT(*) FROM keyword_segments").fetchone()[0] > 1  # no full merge either
    for q in queries(docs, 30, seed=17):
        assert post.keyword_search(q, 10) == old.keyword_search(q, 10), q
