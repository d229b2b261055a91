"""`Index.passage` and `Index.status` against a real index: neighbours by ordinal within one
source, the page of a PDF chunk, a clear error for unknown or removed ids, status figures checked
against the catalog and the folder."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import make_pdf, write_tree

from slimrag.config import IndexConfig
from slimrag.errors import NotFoundError, RequestError
from slimrag.index.core import Index
from slimrag.index.store.layout import folder_bytes

#: Ten numbered paragraphs: with 32-token chunks and no overlap, several chunks in reading order.
LONG = "\n\n".join(f"Paragraph {i}: the {w} lighthouse keeper counted {i} ships passing the harbour at dusk."
                   for i, w in enumerate("red blue green amber violet grey white black pink gold".split()))


@pytest.fixture()
def index(tmp_path: Path, embedder) -> Index:
    root = write_tree(tmp_path / "docs", {"long.md": LONG, "short.txt": "The cat sleeps on the radiator."})
    (root / "paper.pdf").write_bytes(make_pdf("The telescope was pointed at the Andromeda galaxy."))
    idx = Index.build(root, tmp_path / "i.slimrag", embedder=embedder,
                      config=IndexConfig(chunk_tokens=32, chunk_overlap=0))
    yield idx
    idx.close()


def _chunks_of(idx: Index, source: str) -> list:
    """Ground truth: every chunk of ``source``, by ordinal, from the catalog's full listing."""
    got = idx.catalog.chunks(idx.catalog.live_ids())
    return sorted((c for c in got.values() if c.source == source), key=lambda c: c.ordinal)


def test_passage_returns_neighbours_in_reading_order(index: Index) -> None:
    long = _chunks_of(index, "long.md")
    assert len(long) >= 5, "the fixture must give several chunks"
    mid = long[2]
    ex = index.passage(mid.chunk_id, around=2)
    assert ex.chunk == mid
    assert [c.chunk_id for c in ex.before] == [long[0].chunk_id, long[1].chunk_id]
    assert [c.chunk_id for c in ex.after] == [long[3].chunk_id, long[4].chunk_id]
    assert all(c.source == "long.md" for c in (*ex.before, *ex.after))


def test_passage_at_the_edges_and_without_neighbours(index: Index) -> None:
    long = _chunks_of(index, "long.md")
    first = index.passage(long[0].chunk_id)  # default around=1
    assert first.before == () and [c.chunk_id for c in first.after] == [long[1].chunk_id]
    last = index.passage(long[-1].chunk_id, around=3)
    assert last.after == () and [c.chunk_id for c in last.before] == [c.chunk_id for c in long[-4:-1]]
    alone = index.passage(long[3].chunk_id, around=0)
    assert alone.before == () and alone.after == () and alone.chunk.text == long[3].text
    short = _chunks_of(index, "short.txt")
    assert len(short) == 1
    only = index.passage(short[0].chunk_id, around=5)  # neighbours never cross into another source
    assert only.before == () and only.after == ()


def test_passage_of_a_pdf_chunk_has_its_page(index: Index) -> None:
    (pdf,) = _chunks_of(index, "paper.pdf")
    ex = index.passage(pdf.chunk_id)
    assert ex.page == 1 and "Andromeda" in ex.chunk.text
    assert index.passage(_chunks_of(index, "short.txt")[0].chunk_id).page is None


def test_unknown_and_removed_ids_raise_not_found(index: Index) -> None:
    with pytest.raises(NotFoundError, match="chunk 999999 is not in this index") as err:
        index.passage(999_999)
    assert isinstance(err.value, KeyError)  # what lookup callers expect
    (short,) = _chunks_of(index, "short.txt")
    index.remove(["short.txt"])
    with pytest.raises(NotFoundError):
        index.passage(short.chunk_id)
    with pytest.raises(RequestError, match="around must be between"):
        index.passage(_chunks_of(index, "long.md")[0].chunk_id, around=-1)


def test_status_matches_catalog_and_folder(index: Index) -> None:
    st = index.status()
    counts = index.catalog.counts()
    assert (st["documents"], st["chunks"]) == (3, counts["chunks"])
    assert st["bytes"] == folder_bytes(index.root)
    assert st["storage"] == "flat" and st["gen_kind"] == "flat"
    assert st["embedder"] == index.manifest["embedder"]["id"]
    assert time.time() - 600 < st["updated"] <= time.time() + 1
    before = st["updated"]
    time.sleep(0.05)
    index.remove(["short.txt"])  # a remove writes the catalog only; status still sees it
    after = index.status()
    assert after["documents"] == 2 and after["updated"] > before
