"""The stand-in embedder: deterministic per text, clustered by topic, rebuilt from an index's manifest."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench.passages import Passages, index_of
from slimrag import Index
from slimrag.config import SearchConfig
from slimrag.embed.registry import from_record
from slimrag.embed.synthetic import SyntheticEmbedder


def _texts(n: int, seed: int = 0) -> list[str]:
    return [t for _, t in Passages(seed, topics=16).iter(n)]


def test_vectors_depend_on_the_text_alone() -> None:
    """Same text, same vector bit for bit: in another batch, order, block size or instance."""
    texts = _texts(300)
    e = SyntheticEmbedder(dim=64, topics=32)
    v = e.embed(texts)
    assert v.shape == (300, 64) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-6)
    rev = e.embed(texts[::-1])[::-1]
    assert np.array_equal(v, rev)
    singles = np.concatenate([e.embed_batch([t]) for t in texts[:20]])
    assert np.array_equal(v[:20], singles)
    assert np.array_equal(v, SyntheticEmbedder(dim=64, topics=32).embed(texts))
    assert len({r.tobytes() for r in v}) == len(set(texts))  # distinct texts, distinct vectors


def test_blocks_match_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    import slimrag.embed.synthetic as synthetic

    texts = _texts(100)
    e = SyntheticEmbedder(dim=32)
    whole = e.embed(texts)
    monkeypatch.setattr(synthetic, "BLOCK", 7)
    assert np.array_equal(e.embed(texts), whole)


def test_topics_cluster() -> None:
    """Texts that share a first word are nearer each other than texts of other topics, and a
    query naming a topic finds that topic's passages first (brute force)."""
    p = Passages(0, topics=8)
    pairs = list(p.iter(2000))
    topic = np.array([t for t, _ in pairs])
    e = SyntheticEmbedder(topics=256)
    v = e.embed([t for _, t in pairs])
    sims = v @ v.T
    same = topic[:, None] == topic[None, :]
    np.fill_diagonal(same, False)
    other = topic[:, None] != topic[None, :]
    assert sims[same].mean() > sims[other].mean() + 0.3
    hit = 0
    for i, q in enumerate(p.queries(50)):
        name = q.split()[0]
        t = int(np.flatnonzero(p.names == name)[0])
        top = np.argsort(-(v @ e.embed([q])[0]))[:10]
        hit += int(np.mean(topic[top] == t) >= 0.9)
        assert i < 50
    assert hit >= 45


def test_seed_and_topic_from_are_other_models() -> None:
    texts = _texts(50)
    a, b = SyntheticEmbedder(seed=0), SyntheticEmbedder(seed=1)
    assert a.model_id != b.model_id
    assert not np.allclose(a.embed(texts), b.embed(texts))
    c = SyntheticEmbedder(topic_from="text")
    assert c.model_id != a.model_id
    whole = c.embed(["alpha one", "alpha two"])
    assert float(whole[0] @ whole[1]) < float(np.dot(*a.embed(["alpha one", "alpha two"])))


@pytest.mark.parametrize("kw", [{"dim": 1}, {"topics": 0}, {"rank": 0}, {"dim": 8, "rank": 9},
                                {"topic_from": "last_word"}, {"seed": -1}])
def test_bad_knobs_raise(kw: dict) -> None:
    with pytest.raises(ValueError):
        SyntheticEmbedder(**kw)


def test_record_rebuilds_the_same_embedder() -> None:
    e = SyntheticEmbedder(dim=48, topics=99, rank=12, seed=7, topic_from="text")
    rec = json.loads(json.dumps(e.record()))  # as the manifest stores it
    assert rec["kind"] == "synthetic"
    back = from_record(rec)
    assert isinstance(back, SyntheticEmbedder) and back.model_id == e.model_id
    texts = _texts(40)
    assert np.array_equal(back.embed(texts), e.embed(texts))


@pytest.mark.parametrize("storage", ["flat", "slim"])
def test_index_reopens_with_it(tmp_path, storage: str) -> None:
    """An index built with the stand-in opens without passing it (the manifest's record), and its
    vector search agrees with brute force over the same vectors (slim recomputes rows from text:
    the recomputed vectors are the stored ones exactly)."""
    n = 1500
    p = Passages(3, topics=24)
    texts = [t for _, t in p.iter(n)]
    Index.build(p.pairs(n), tmp_path / "i.slimrag", storage=storage, embedder=SyntheticEmbedder()).close()
    with Index.open(tmp_path / "i.slimrag") as idx:
        assert isinstance(idx.embedder, SyntheticEmbedder)
        e = SyntheticEmbedder()
        x = e.embed(texts)
        recall = []
        for q in p.queries(20):
            hits = idx.search(q, config=SearchConfig(k=10, mode="vector"))
            truth = set(np.argsort(-(x @ e.embed([q])[0]))[:10].tolist())
            got = [index_of(h.source) for h in hits]
            for h, i in zip(hits, got, strict=True):
                assert h.score == pytest.approx(float(x[i] @ e.embed([q])[0]), abs=1e-5)
            recall.append(len(truth & set(got)) / 10)
    assert np.mean(recall) >= (1.0 if storage == "flat" else 0.9)
