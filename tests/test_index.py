"""Index build/open/add/remove/compact on real files, a real SQLite catalog and the real embedder."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import BAD_FILES, write_mixed_tree

from slimrag.embed.base import Embedder
from slimrag.embed.local import LocalEmbedder
from slimrag.errors import IndexFormatError
from slimrag.index.core import Index
from slimrag.index.writer import embed_input


def _ids(hits: list) -> list[int]:
    return [h.chunk_id for h in hits]


def test_build_then_open_in_new_process_gives_identical_results(docs_dir: Path, tmp_path: Path,
                                                                 embedder: LocalEmbedder) -> None:
    out = tmp_path / "i.slimrag"
    idx = Index.build(docs_dir, out, embedder=embedder)
    queries = ["what is the cat called", "how to bake bread", "which planet is red", "galaxy telescope"]
    here = {q: [(h.chunk_id, round(h.score, 5), h.source) for h in idx.search(q, k=5)] for q in queries}
    idx.close()
    code = (
        "import json,sys\nfrom slimrag.index.core import Index\n"
        f"idx = Index.open({str(out)!r})\n"
        f"print(json.dumps({{q: [(h.chunk_id, round(h.score, 5), h.source) for h in idx.search(q, k=5)] "
        f"for q in {queries!r}}}))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert res.returncode == 0, res.stderr
    there = json.loads(res.stdout.strip().splitlines()[-1])
    assert there == {q: [list(t) for t in v] for q, v in here.items()}
    assert here["what is the cat called"][0][2] == "guide/cats.md"
    assert here["galaxy telescope"][0][2] == "papers/telescope.pdf"


def test_exact_search_matches_numpy_brute_force(tmp_path: Path, embedder: LocalEmbedder) -> None:
    rng = np.random.default_rng(0)
    words = "river stone cloud engine violin garden copper lantern harbor orbit meadow signal".split()
    texts = [(f"doc{i}.txt", " ".join(rng.choice(words, size=30))) for i in range(120)]
    idx = Index.build(texts, tmp_path / "bf.slimrag", embedder=embedder)
    chunks = idx.catalog.chunks(idx.catalog.live_ids())
    ids = np.array(sorted(chunks))
    matrix = embedder.embed([embed_input(chunks[i]) for i in ids])  # independent of stored vectors
    for q in ["copper engine in the harbor", "violin meadow", "orbit signal lantern"]:
        qv = embedder.embed([q])[0]
        scores = matrix @ qv
        ref = ids[np.lexsort((ids, -scores))][:10]
        got = _ids(idx.search(q, k=10, mode="vector"))
        assert got == ref.tolist()


def test_add_same_folder_twice_changes_nothing(docs_dir: Path, tmp_path: Path, embedder: LocalEmbedder) -> None:
    idx = Index.build(docs_dir, tmp_path / "a.slimrag", embedder=embedder)
    before = idx.catalog.counts()
    rep = idx.add(docs_dir)
    assert rep.chunks == 0 and rep.added == 0 and rep.unchanged == before["documents"]
    assert idx.catalog.counts() == before
    # a changed file is replaced, not duplicated
    (docs_dir / "guide/cats.md").write_text("# Cats\n\nThe office cat is now named Pepper.\n")
    rep = idx.add(docs_dir)
    assert (rep.updated, rep.added) == (1, 0)
    assert idx.catalog.counts()["chunks"] == before["chunks"]
    assert "Pepper" in idx.search("office cat name", k=1)[0].text


def test_remove_deletes_from_search_and_catalog(docs_dir: Path, tmp_path: Path, embedder: LocalEmbedder) -> None:
    idx = Index.build(docs_dir, tmp_path / "r.slimrag", embedder=embedder)
    n = idx.remove("guide/cats.md")
    assert n >= 1
    assert all(h.source != "guide/cats.md" for h in idx.search("cat named Whiskers", k=20))
    assert all(h.source != "guide/cats.md" for h in idx.search("Whiskers", k=20, mode="keyword"))
    assert idx.catalog.document("guide/cats.md") is None
    assert idx.catalog.counts()["tombstones"] == n
    idx.compact()
    assert idx.catalog.counts()["tombstones"] == 0
    assert len(idx.vectors) == idx.catalog.counts()["chunks"]
    idx.close()
    reopened = Index.open(tmp_path / "r.slimrag", embedder=embedder)
    assert reopened.catalog.document("guide/cats.md") is None
    assert all(h.source != "guide/cats.md" for h in reopened.search("cat named Whiskers", k=20))


def test_bad_files_are_skipped_with_one_warning_each(tmp_path: Path, embedder: LocalEmbedder,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    root = write_mixed_tree(tmp_path / "mixed")
    with caplog.at_level(logging.WARNING, logger="slimrag"):
        idx = Index.build(root, tmp_path / "m.slimrag", embedder=embedder)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for bad in BAD_FILES:
        assert sum(bad in w for w in warned) == 1, (bad, warned)
    assert len(warned) == 4
    assert sorted(d.source for d in idx.documents()) == ["good.md", "good2.txt", "ok.pdf"]
    assert idx.search("volcano eruption", k=1)[0].source == "good.md"
    assert idx.search("submarine depth", k=1)[0].source == "good2.txt"
    assert idx.search("dwarf planet", k=1)[0].source == "ok.pdf"


def test_keyword_hybrid_and_source_filter(docs_dir: Path, tmp_path: Path, embedder: LocalEmbedder) -> None:
    idx = Index.build(docs_dir, tmp_path / "h.slimrag", embedder=embedder)
    assert idx.search("lentils cumin", k=1, mode="keyword")[0].source == "notes/recipes.rst"
    # FTS5 syntax in user text (quotes, column filters, NOT/AND, prefix *, NEAR, ^, braces) neither
    # errors nor acts as an operator: the words are still matched, so the cat page is found even
    # where FTS5's own reading ("AND NOT radiator") would have excluded it.
    for q in ('Whiskers: "radiator" -(winter', "whiskers AND NOT radiator*", 'NEAR(cat^ {sleeps}) OR "',
              "Whiskers' radiator?!"):
        hits = idx.search(q, k=3, mode="keyword")
        assert hits and hits[0].source == "guide/cats.md", (q, hits)
    weird = idx.search('weird "query: -with (syntax', k=3, mode="keyword")
    assert [h.source for h in weird] == ["notes/recipes.rst"] and " with " in weird[0].text  # its one matching word
    assert idx.search('"(*):-^', k=3, mode="keyword") == []  # nothing but syntax: no words, no hits
    assert idx.search('Whiskers: "radiator" -(winter', k=3, mode="hybrid")[0].source == "guide/cats.md"
    hybrid = idx.search("Fibonacci number function", k=3, mode="hybrid")
    assert hybrid[0].source == "code/fib.py"
    only_notes = idx.search("cat", k=10, source="notes/*")
    assert only_notes and all(h.source.startswith("notes/") for h in only_notes)


def test_texts_input_and_errors(tmp_path: Path, embedder: LocalEmbedder) -> None:
    idx = Index.build([("a.md", "# A\n\nalpha"), ("b", "beta")], tmp_path / "t.slimrag", embedder=embedder)
    assert idx.stats()["counts"]["documents"] == 2
    with pytest.raises(IndexFormatError, match="already exists"):
        Index.build([("c", "gamma")], tmp_path / "t.slimrag", embedder=embedder)
    with pytest.raises(IndexFormatError, match="not a slimrag index"):
        Index.open(tmp_path)


def test_interrupted_add_leaves_previous_state(tmp_path: Path, embedder: LocalEmbedder,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    idx = Index.build([("a.txt", "the first document about apples")], tmp_path / "c.slimrag", embedder=embedder)
    before = idx.catalog.counts()

    def boom(*a: object, **k: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("slimrag.files.write_json_atomic", boom)
    with pytest.raises(OSError):
        idx.add([("b.txt", "a second document about pears")])
    monkeypatch.undo()
    idx.close()
    again = Index.open(tmp_path / "c.slimrag", embedder=embedder)
    assert again.catalog.counts() == before
    rep = again.add([("b.txt", "a second document about pears")])
    assert rep.added == 1
    assert again.search("pears", k=1)[0].source == "b.txt"


def test_write_stores_given_vectors_through_the_add_path(tmp_path: Path, embedder: LocalEmbedder) -> None:
    from slimrag.ingest.chunker import ChunkText
    from slimrag.ingest.source import PreparedDoc

    idx = Index.create(tmp_path / "w.slimrag", embedder=embedder)
    pieces = [ChunkText("Comets have icy nuclei.", {"heading": "Comets"}), ChunkText("Tails point away.", {})]
    vecs = embedder.embed([embed_input(p) for p in pieces])
    doc = PreparedDoc("sky/comets.md", "a" * 64, 0.0, 40, pieces, vecs)
    with pytest.raises(ValueError, match="expected"):
        idx.write([PreparedDoc("bad.md", "b" * 64, 0.0, 1, pieces, vecs[:1])])
    rep = idx.write([doc, PreparedDoc("empty.md", "c" * 64, 0.0, 0, [])])
    assert (rep.added, rep.chunks, [s.source for s in rep.skipped]) == (1, 2, ["empty.md"])
    np.testing.assert_array_equal(np.asarray(idx.vectors.vectors), vecs)  # stored as given, not re-embedded
    assert idx.search("icy comet nucleus", k=1)[0].text == "Comets have icy nuclei."
    assert idx.write([doc]).unchanged == 1  # same hash at the same source: nothing written
    assert len(idx.manifest["delta_parts"]) == 1


def test_catalog_transaction_commits_or_rolls_back(tmp_path: Path) -> None:
    from slimrag.catalog import Catalog
    from slimrag.types import Chunk, Document

    cat = Catalog(tmp_path / "c.sqlite")
    with cat.transaction():
        cat.put_document(Document("h1", "a.txt", 0.0, 5))
        cat.put_chunks([Chunk(0, "h1", "a.txt", 0, "alpha", {})])
    with pytest.raises(KeyError), cat.transaction():  # any exception: undone, then re-raised
        cat.delete_document("a.txt")
        cat.put_document(Document("h2", "b.txt", 0.0, 5))
        raise KeyError("boom")
    assert [d.source for d in cat.documents()] == ["a.txt"]
    assert cat.counts() == {"documents": 1, "chunks": 1, "tombstones": 0}
    cat.close()
    again = Catalog(tmp_path / "c.sqlite")  # committed means on disk, seen by a new connection
    assert again.live_ids() == [0]
    assert [i for i, _ in again.keyword_search("alpha", 1)] == [0]
    again.close()


def test_version_moves_when_another_handle_writes(tmp_path: Path, embedder: LocalEmbedder) -> None:
    path = tmp_path / "v.slimrag"
    Index.build([("a.txt", "apples are red"), ("b.txt", "pears are green")], path, embedder=embedder).close()
    reader, writer = Index.open(path, embedder), Index.open(path, embedder)
    v0 = reader.version()
    assert reader.version() == v0 and {v0: 1}  # stable while nothing changes; hashable
    writer.remove(["a.txt"])  # a catalog commit only: the manifest is not rewritten
    v1 = reader.version()
    assert v1 != v0
    writer.add([("c.txt", "plums are purple")])  # a new delta part: the manifest is replaced
    assert reader.version() not in (v0, v1)
    reader.close()
    writer.close()


class _Letters(Embedder):
    """A custom embedder (letter counts): no factory in the registry until a test registers one."""

    model_id, dim, kind = "test:letters", 26, "letters"

    def embed_batch(self, texts):  # noqa: ANN001, ANN201
        out = np.zeros((len(texts), 26), np.float32)
        for i, t in enumerate(texts):
            for ch in t.lower():
                if "a" <= ch <= "z":
                    out[i, ord(ch) - 97] += 1
        return out + 1e-3


def test_embedders_are_recorded_and_rebuilt_by_kind(tmp_path: Path, embedder: LocalEmbedder,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from slimrag.embed import registry
    from slimrag.embed.local import MODEL_ID

    # the runtime (torch or onnx) is recorded so an index is re-embedded the way it was built
    assert embedder.record() == {"id": MODEL_ID, "dim": 384, "normalized": True, "kind": "local",
                                 "runtime": embedder.runtime}
    for rec in (embedder.record(), {"id": MODEL_ID, "dim": 384}):  # manifests before "kind": local
        again = registry.from_record(rec)
        assert isinstance(again, LocalEmbedder) and again.model_id == MODEL_ID
    own = LocalEmbedder(embedder.model_dir)  # a model folder given explicitly is recorded and reloaded
    assert registry.from_record(own.record()).model_id == own.model_id == f"local:{embedder.model_dir.name}"

    path = tmp_path / "l.slimrag"
    Index.build([("a.txt", "zebra zoo"), ("b.txt", "apple bake")], path, embedder=_Letters()).close()
    assert json.loads((path / "manifest.json").read_text())["embedder"]["kind"] == "letters"
    with pytest.raises(IndexFormatError, match="'letters'.*embedder="):
        Index.open(path)
    monkeypatch.setitem(registry.FACTORIES, "letters", lambda rec: _Letters())
    with Index.open(path) as idx:
        assert idx.search("zzz", k=1)[0].source == "a.txt"


def test_a_build_killed_before_its_manifest_can_be_redone_with_overwrite(tmp_path: Path, embedder) -> None:
    """What a create killed before its first manifest leaves (catalog, temp generation, temp
    manifest) is replaced by overwrite=True; a folder holding anything else is still refused."""
    out = tmp_path / "half.slimrag"
    out.mkdir()
    (out / "catalog.sqlite").write_bytes(b"")
    (out / "catalog.sqlite-wal").write_bytes(b"")
    (out / ".tmp-gen-000000-abc").mkdir()
    (out / ".manifest.json.xyz").write_text("{")
    with pytest.raises(IndexFormatError, match="already exists"):
        Index.build([("a.txt", "zebra stripes")], out, embedder=embedder)
    idx = Index.build([("a.txt", "zebra stripes")], out, embedder=embedder, overwrite=True)
    assert [h.source for h in idx.search("zebra", k=1, mode="keyword")] == ["a.txt"]
    idx.close()
    other = tmp_path / "notes"
    other.mkdir()
    (other / "catalog.sqlite").write_bytes(b"")
    (other / "todo.txt").write_text("mine")
    with pytest.raises(IndexFormatError, match="not an index"):
        Index.build([("a.txt", "zebra")], other, embedder=embedder, overwrite=True)
    assert (other / "todo.txt").read_text() == "mine"


# -- the source filter applies inside the search, before the top-k cut ------------------------------
FILLER = "river stone cloud engine violin garden copper meadow signal falcon pepper quartz".split()


def _two_folders(n_guide: int) -> list[tuple[str, str]]:
    """``notes/`` (300 documents) match the query far better than ``guide/`` (``n_guide``): a filter
    applied after the top-k cut would find no guide passage among the best notes ones."""
    rng = np.random.default_rng(n_guide)
    notes = [(f"notes/n{i}.txt", "harbor lantern harbor lantern " + " ".join(rng.choice(FILLER, 4)))
             for i in range(300)]
    guide = [(f"guide/g{i}.txt", "harbor " + " ".join(rng.choice(FILLER, 12))) for i in range(n_guide)]
    return notes + guide


@pytest.fixture(scope="module")
def trigram_server():
    from openai_server import OpenAIServer

    with OpenAIServer(dim=64) as srv:
        yield srv


@pytest.mark.parametrize("storage", ["flat", "slim"])
@pytest.mark.parametrize("n_guide", [6, 90])  # slim: few rows are scored exactly, many are walked
def test_source_filter_returns_k_hits_from_the_folder(trigram_server, tmp_path: Path, storage: str,
                                                       n_guide: int) -> None:
    from slimrag.embed.remote import RemoteEmbedder
    from slimrag.index.store.slim import SlimConfig
    from slimrag.index.store.slim.pq import PQConfig

    emb = RemoteEmbedder(trigram_server.base_url, "test-model", dim=64, timeout=10)
    idx = Index.build(_two_folders(n_guide), tmp_path / "f.slimrag", embedder=emb, storage=storage,
                      slim=SlimConfig(pq=PQConfig(m=16)))
    assert idx.stats()["gen_kind"] == storage
    query = "harbor lantern"
    for mode in ("vector", "keyword", "hybrid"):
        assert {h.source[:6] for h in idx.search(query, k=5, mode=mode)} == {"notes/"}, mode  # the filter matters
        hits = idx.search(query, k=5, mode=mode, source="guide/*")
        assert len(hits) == 5 and all(h.source.startswith("guide/") for h in hits), (mode, hits)
        if storage == "flat" and mode != "hybrid":  # exact modes: the folder's own top 5
            everything = idx.search(query, k=300 + n_guide, mode=mode)
            assert [h.chunk_id for h in hits] == [h.chunk_id for h in everything
                                                  if h.source.startswith("guide/")][:5], mode
    idx.close()
