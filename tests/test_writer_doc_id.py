"""The stored doc_id an add decides by (`IndexWriter`): read once per document, under the writer
lock, and still right when it is used. A changed document replaces its old chunks (catalog,
keyword index, vectors, on disk after a reopen); an unchanged one is left alone; that holds across
the add's own commits, for a source given twice, and after another handle's write.

Real index folders and SQLite catalogs in ``tmp_path``, the trigram-hash embedder of
`bench.crash` (fast, deterministic, reopened from the manifest alone). Ground truth: the SHA-256
of each text, the chunk ids stored before, and `Index.check`."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.crash import HashEmbedder
from slimrag.config import IndexConfig
from slimrag.index import writer
from slimrag.index.core import Index
from slimrag.index.state import embed_input
from slimrag.ingest.chunker import ChunkText
from slimrag.ingest.source import PreparedDoc

#: small chunks, so each document below is several chunks and a replacement moves several rows
CONFIG = IndexConfig(chunk_tokens=24, chunk_overlap=0)


def text(word: str, n: int = 6) -> str:
    """A document of ``n`` sentences, each naming ``word`` (a word no other document has)."""
    return " ".join(f"Sentence {i} of this note is about the {word} that sailed past the harbor wall."
                    for i in range(n))


V1, V2, V3 = text("walrus"), text("narwhal"), text("pelican", 4)
OTHER = text("sequoia")


def sha(s: str) -> str:
    return hashlib.sha256(s.encode("utf-8")).hexdigest()


def new_index(root: Path) -> Index:
    return Index.create(root, embedder=HashEmbedder(), config=CONFIG)


def texts_of(idx: Index, source: str) -> str:
    ids = idx.catalog.live_ids(source)
    return " ".join(idx.catalog.texts(ids))


def test_re_adding_a_changed_document_replaces_its_chunks_on_disk(tmp_path: Path) -> None:
    root = tmp_path / "r.slimrag"
    with new_index(root) as idx:
        rep = idx.add([("notes/boat.txt", V1), ("notes/tree.txt", OTHER)])
        assert (rep.added, rep.updated, rep.unchanged) == (2, 0, 0)
        old_ids, tree_ids = idx.catalog.live_ids("notes/boat.txt"), idx.catalog.live_ids("notes/tree.txt")
        assert len(old_ids) > 1
        rep = idx.add([("notes/boat.txt", V2), ("notes/tree.txt", OTHER)])
        assert (rep.added, rep.updated, rep.unchanged) == (0, 1, 1)
    with Index.open(root) as idx:  # what the SQLite file and the manifest hold
        assert idx.catalog.document("notes/boat.txt").doc_id == sha(V2)
        new_ids = idx.catalog.live_ids("notes/boat.txt")
        assert new_ids and not set(new_ids) & set(old_ids)
        assert idx.catalog.tombstone_ids() == sorted(old_ids)
        assert "narwhal" in texts_of(idx, "notes/boat.txt") and "walrus" not in texts_of(idx, "notes/boat.txt")
        assert idx.catalog.live_ids("notes/tree.txt") == tree_ids
        assert idx.search("walrus", k=10, mode="keyword") == []
        assert {h.chunk_id for h in idx.search("narwhal", k=10, mode="keyword")} == set(new_ids)
        hits = idx.search("the walrus that sailed past the harbor wall", k=50, mode="vector")
        assert {h.chunk_id for h in hits} == set(new_ids) | set(tree_ids)  # no removed row is searched
        assert idx.check().ok
        idx.compact()
        assert idx.catalog.tombstone_ids() == [] and len(idx.vectors) == len(new_ids) + len(tree_ids)
        assert idx.add([("notes/boat.txt", V2)]).unchanged == 1
        rep = idx.add([("notes/boat.txt", V1)])  # and back: decided against the stored V2
        assert (rep.updated, rep.unchanged) == (1, 0) and "walrus" in texts_of(idx, "notes/boat.txt")
        assert idx.check().ok


def test_changed_documents_are_replaced_across_the_adds_own_commits(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """One transaction per document: the stored ids of later documents are read after earlier
    commits of the same add."""
    monkeypatch.setattr(writer, "COMMIT_CHUNKS", 1)
    first = {f"d{i}.txt": text(f"word{i}") for i in range(5)}
    second = {**first, "d1.txt": text("changed1", 3), "d3.txt": text("changed3", 8), "d4.txt": V3}
    with new_index(tmp_path / "c.slimrag") as idx:
        idx.add(list(first.items()))
        before = {s: idx.catalog.live_ids(s) for s in first}
        rep = idx.add(list(second.items()))
        assert (rep.added, rep.updated, rep.unchanged) == (0, 3, 2)
        for source, body in second.items():
            assert idx.catalog.document(source).doc_id == sha(body)
            ids = idx.catalog.live_ids(source)
            assert (ids == before[source]) == (body == first[source])
            assert " ".join(idx.catalog.texts(ids)).split() == body.split()  # its own text, once
        assert idx.catalog.counts()["chunks"] == sum(len(idx.catalog.live_ids(s)) for s in second)
        assert idx.check().ok


def test_a_source_given_twice_in_one_write_is_taken_once(tmp_path: Path) -> None:
    with new_index(tmp_path / "t.slimrag") as idx:
        rep = idx.add([("a.txt", V1), ("a.txt", V2)])  # inputs: the first of a source is taken
        assert (rep.added, rep.chunks) == (1, len(idx.catalog.live_ids("a.txt")))
        assert idx.catalog.document("a.txt").doc_id == sha(V1)
        # write(): documents prepared elsewhere, with their vectors
        pieces = [ChunkText("Comets have icy nuclei.", {}), ChunkText("Their tails point away from the sun.", {})]
        vecs = HashEmbedder().embed([embed_input(p) for p in pieces])
        one = PreparedDoc("b.txt", "1" * 64, 0.0, 10, pieces, vecs)
        two = PreparedDoc("b.txt", "2" * 64, 0.0, 10, pieces[:1], vecs[:1])
        rep = idx.write([one, two])
        assert (rep.added, rep.chunks, idx.catalog.document("b.txt").doc_id) == (1, 2, "1" * 64)
        rep = idx.write([two, one])  # the first given replaces the stored one; the second is passed over
        assert (rep.updated, rep.chunks, idx.catalog.document("b.txt").doc_id) == (1, 1, "2" * 64)
        assert idx.catalog.texts(idx.catalog.live_ids("b.txt")) == ["Comets have icy nuclei."]
        assert idx.write([two, one]).unchanged == 1
        assert idx.check().ok


def test_another_handles_write_in_between_is_seen(tmp_path: Path) -> None:
    """Handle ``a`` was opened before ``b`` wrote: ``a``'s adds decide against what ``b`` stored
    (the writer lock and the refresh under it), not against what ``a`` saw when it opened."""
    root = tmp_path / "h.slimrag"
    with new_index(root) as idx:
        idx.add([("boat.txt", V1)])
    with Index.open(root) as a, Index.open(root) as b:
        assert a.search("walrus", k=1, mode="keyword")  # a's view is the V1 one
        assert (b.add([("boat.txt", V2)]).updated, b.catalog.document("boat.txt").doc_id) == (1, sha(V2))
        assert a.add([("boat.txt", V2)]).unchanged == 1  # what b stored, not what a saw
        v2_ids = a.catalog.live_ids("boat.txt")
        rep = a.add([("boat.txt", V3)])
        assert (rep.updated, rep.unchanged) == (1, 0)
        assert not set(a.catalog.live_ids("boat.txt")) & set(v2_ids)
        assert {h.source for h in a.search("narwhal walrus", k=10, mode="keyword")} == set()
        assert [h.chunk_id for h in a.search("pelican", k=10, mode="keyword")]
    with Index.open(root) as idx:
        assert idx.catalog.document("boat.txt").doc_id == sha(V3) and idx.check().ok


def counting(monkeypatch: pytest.MonkeyPatch, idx: Index) -> list[str]:
    """Record every stored-document lookup of ``idx``'s catalog (the real one runs)."""
    calls: list[str] = []
    real: Callable[[str], object] = idx.catalog.document

    def document(source: str) -> object:
        calls.append(source)
        return real(source)

    monkeypatch.setattr(idx.catalog, "document", document)
    return calls


def test_one_stored_id_lookup_per_document(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The add reads each source's stored doc_id once (it was read twice: before parsing and
    again before writing), whatever the document turns out to be: new, unchanged or changed."""
    docs = {f"n{i}.txt": text(f"item{i}", 2) for i in range(4)}
    with new_index(tmp_path / "q.slimrag") as idx:
        calls = counting(monkeypatch, idx)
        assert idx.add(list(docs.items())).added == 4
        assert sorted(calls) == sorted(docs)
        calls.clear()
        rep = idx.add([("n0.txt", V1), *list(docs.items())[1:]])
        assert (rep.updated, rep.unchanged) == (1, 3) and sorted(calls) == sorted(docs)
        calls.clear()  # write(), documents prepared elsewhere: read once there
        pieces = [ChunkText("Comets have icy nuclei.", {})]
        vecs = HashEmbedder().embed([embed_input(p) for p in pieces])
        assert idx.write([PreparedDoc("c.txt", "c" * 64, 0.0, 23, pieces, vecs)]).added == 1
        assert calls == ["c.txt"]
