"""Hybrid fusion (`slimrag.index.fusion`): the pure functions against hand-computed rankings, and a
unique phrase that keyword search finds decisively staying first in hybrid search over a real index
(real embedder, real SQLite FTS5), where reciprocal-rank fusion alone buries it."""

from __future__ import annotations

import pytest
from conftest import DOCS

from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.index.fusion import ALPHA, FUSIONS, convex, convex_margin, decisive, fuse, rrf, rrf_margin

VECTOR = [(1, 0.9), (2, 0.8), (3, 0.7), (4, 0.6)]


def test_rrf_matches_the_formula() -> None:
    keyword = [(4, 9.0), (1, 3.0)]
    fused = dict(rrf([VECTOR, keyword], k=60))
    assert fused[1] == pytest.approx(1 / 61 + 1 / 62)
    assert fused[4] == pytest.approx(1 / 64 + 1 / 61)
    assert fused[2] == pytest.approx(1 / 62)
    assert [c for c, _ in rrf([VECTOR, keyword])] == [1, 4, 2, 3]


def test_rrf_ties_break_by_chunk_id() -> None:
    assert [c for c, _ in rrf([[(7, 1.0)], [(3, 1.0)]])] == [3, 7]


def test_decisive_needs_the_margin() -> None:
    assert decisive([(5, 45.3), (6, 11.3)]) == 5  # issue 19's figures: a factor of 4
    assert decisive([(5, 12.0), (6, 11.3)]) is None
    assert decisive([(5, 4.0)]) == 5  # the only keyword hit
    assert decisive([]) is None
    assert decisive([(5, 45.3), (6, 11.3)], margin=5.0) is None


def test_margin_rule_moves_only_a_decisive_hit() -> None:
    decided = rrf_margin(VECTOR, [(4, 40.0), (1, 10.0)])
    assert [c for c, _ in decided] == [4, 1, 2, 3]
    scores = [s for _, s in decided]
    assert scores == sorted(scores, reverse=True)
    close = [(4, 12.0), (1, 10.0)]
    assert rrf_margin(VECTOR, close) == rrf([VECTOR, close])


def test_convex_normalises_each_list() -> None:
    fused = dict(convex(VECTOR, [(4, 40.0), (1, 10.0)], alpha=0.5))
    assert fused[4] == pytest.approx(0.5 * 0.0 + 0.5 * 1.0)
    assert fused[1] == pytest.approx(0.5 * 1.0 + 0.5 * 0.0)
    assert fused[2] == pytest.approx(0.5 * (0.8 - 0.6) / 0.3)
    with pytest.raises(ValueError, match="alpha"):
        convex(VECTOR, [], alpha=1.5)


def test_every_strategy_returns_each_chunk_once() -> None:
    keyword = [(9, 5.0), (2, 1.0)]
    for name, fn in FUSIONS.items():
        ids = [c for c, _ in fn(VECTOR, keyword, 60)]
        assert sorted(ids) == [1, 2, 3, 4, 9], name


@pytest.fixture(scope="module")
def phrase_index(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Index:
    """The test corpus plus cat notes, one of which (notes/old.txt) holds a unique code phrase."""
    docs = dict(DOCS)
    for i in range(6):
        docs[f"cats/cat{i}.md"] = (f"# Cat {i}\n\nThe cat number {i} sleeps on the warm radiator in the office "
                                   f"and the cat likes milk.\n")
    docs["notes/old.txt"] = "Inventory memo: crate QX-7741 zorbafine holds spare lamp bulbs for the lighthouse.\n"
    root = tmp_path_factory.mktemp("fusion")
    return Index.build(list(docs.items()), root / "p.slimrag", embedder=embedder, storage="flat")


def test_unique_phrase_stays_first_in_hybrid(phrase_index: Index) -> None:
    query = "where does the office cat sleep zorbafine"
    keyword = phrase_index.catalog.keyword_search(query, 50)
    memo = next(h.chunk_id for h in phrase_index.search("zorbafine", k=1, mode="keyword"))
    assert keyword[0][0] == memo and keyword[0][1] >= 2 * keyword[1][1]  # decisive: BM25 margin >= 2
    vector = [(h.chunk_id, h.score) for h in phrase_index.search(query, k=50, mode="vector")]
    assert [c for c, _ in rrf([vector, keyword])].index(memo) > 0  # plain RRF buries it
    assert fuse(vector, keyword)[0][0] == memo
    assert rrf_margin(vector, keyword)[0][0] == memo and convex_margin(vector, keyword)[0][0] == memo
    assert phrase_index.search(query, k=5, mode="hybrid")[0].chunk_id == memo


def test_no_decisive_match_keeps_the_fused_order(phrase_index: Index) -> None:
    query = "where does the office cat sleep"
    keyword = phrase_index.catalog.keyword_search(query, 50)
    vector = [(h.chunk_id, h.score) for h in phrase_index.search(query, k=50, mode="vector")]
    assert decisive(keyword) is None
    assert fuse(vector, keyword) == convex(vector, keyword, ALPHA)
    assert [h.chunk_id for h in phrase_index.search(query, k=5)] == [c for c, _ in convex(vector, keyword, ALPHA)[:5]]


def test_fusion_of_empty_lists() -> None:
    assert fuse([], []) == []
    assert fuse([(1, 0.5)], []) == [(1, pytest.approx(ALPHA))]
