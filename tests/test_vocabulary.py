"""The corpus's vocabulary is computed once per index generation (`slimrag.rag.vocabulary`, "Cache"):
a second answer reads no counts, and an add or a remove, through this handle or another, is seen by the
next answer. A real index built by the real embedder."""

from __future__ import annotations

from pathlib import Path

import pytest

from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.rag.vocabulary import Vocabulary

#: 6 documents, 3 of them naming Python: exactly half, so Python is the corpus's vocabulary.
DOCS = [(f"py/mod{i}.txt", f"Python module mod{i} runs task {i}.\n") for i in range(3)] + [
    (f"notes/n{i}.txt", f"A note about {grain}.\n") for i, grain in enumerate(("lentils", "barley", "rice"))]


def build(root: Path, embedder: LocalEmbedder) -> Index:
    return Index.build(DOCS, root / "v.slimrag", embedder=embedder, storage="flat")


def test_counts_are_read_once_per_generation(tmp_path: Path, embedder: LocalEmbedder,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    idx = build(tmp_path, embedder)
    reads: list[int] = []
    real = idx.catalog.counts
    monkeypatch.setattr(idx.catalog, "counts", lambda: reads.append(1) or real())
    vocab = Vocabulary(idx)
    assert vocab.common(["Python", "lentils", "1"]) == {"python"}
    assert vocab.common(["python", "note"]) == {"python", "note"}
    assert vocab.common(["Python"]) == {"python"}
    assert len(reads) == 1  # three answers, one generation
    idx.close()


def test_a_remove_through_this_handle_is_seen(tmp_path: Path, embedder: LocalEmbedder) -> None:
    idx = build(tmp_path, embedder)
    vocab = Vocabulary(idx)
    assert vocab.common(["Python"]) == {"python"}
    assert idx.remove_sources(["py/mod0.txt"]) > 0  # 2 of 5 documents name Python now
    assert vocab.common(["Python"]) == set()
    idx.close()


def test_an_add_through_another_handle_is_seen(tmp_path: Path, embedder: LocalEmbedder) -> None:
    idx = build(tmp_path, embedder)
    vocab = Vocabulary(idx)
    assert vocab.common(["Python"]) == {"python"}
    other = Index.open(idx.root, embedder=embedder)
    other.add([(f"notes/more{i}.txt", f"More lentils, batch {i}.\n") for i in range(2)])
    other.close()
    assert vocab.common(["Python"]) == set()  # 3 of 8 documents
    idx.close()


@pytest.mark.parametrize("layout", ["compact", "legacy"])
def test_document_count_counts_distinct_documents_in_both_layouts(tmp_path: Path, layout: str) -> None:
    """`Catalog.document_count`, the vocabulary's count, against the documents of the chunks read
    whole; ids of removed or never-stored chunks count for nothing."""
    import sqlite3

    from slimrag.catalog import Catalog
    from slimrag.catalog.schema import LEGACY_SCHEMA
    from slimrag.types import Chunk, Document

    path = tmp_path / "c.sqlite"
    if layout == "legacy":
        db = sqlite3.connect(path)
        db.executescript(LEGACY_SCHEMA)
        db.close()
    cat = Catalog(path)
    assert cat.compact == (layout == "compact")
    docs = [Document(f"{d:064x}", f"d{d}.txt", 1.0, 10) for d in range(7)]
    chunks = [Chunk(10 * d + o, doc.doc_id, doc.source, o, f"text {d} {o} lentils") for d, doc in enumerate(docs)
              for o in range(d % 3 + 1)]
    with cat.transaction():
        for doc in docs:
            cat.put_document(doc)
        cat.put_chunks(chunks)
    ids = [c.chunk_id for c in chunks]
    for part in (ids, ids[:1], ids[::2], [c.chunk_id for c in chunks if c.ordinal > 0], [], [999, 10_000]):
        assert cat.document_count(part) == len({c.doc_id for c in cat.chunks(part).values()})
    assert cat.document_count(ids) == 7
    assert cat.document_count(ids + [999]) == 7
    with cat.transaction():
        cat.delete_document("d2.txt")
    assert cat.document_count(ids) == 6
    cat.close()
