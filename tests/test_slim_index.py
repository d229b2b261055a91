"""`storage="slim"` through the `Index` API: recall against flat search over the same chunks,
add/remove/compact against a flat index of the same live chunks, and compactions killed midway.

The embedder is the real remote one talking to the test server on 127.0.0.1 (trigram-hash
embeddings, 64 dims): fast enough to recompute hundreds of rows per test, and it exercises the
path where the index reopens its embedder from the manifest in a child process. One test uses the
real MiniLM (session ``embedder`` fixture) to check 4-bit PQ recall on real sentence embeddings.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from openai_server import OpenAIServer

from slimrag.config import IndexConfig, SearchConfig
from slimrag.embed.remote import RemoteEmbedder
from slimrag.index.core import Index
from slimrag.index.store.slim import SlimConfig
from slimrag.index.store.slim.config import MOVED_TO_SEARCH
from slimrag.index.store.slim.pq import PQConfig
from slimrag.index.writer import embed_input

WORDS = ("river stone cloud engine violin garden copper lantern harbor orbit meadow signal falcon "
         "pepper quartz timber canyon glacier marble velvet ember mosaic nectar saddle tundra").split()


def texts(n: int, seed: int) -> list[tuple[str, str]]:
    rng = np.random.default_rng(seed)
    return [(f"d{seed}-{i}.txt", " ".join(rng.choice(WORDS, size=12))) for i in range(n)]


QUERIES = [" ".join(np.random.default_rng(100 + i).choice(WORDS, size=4)) for i in range(40)]
SLIM = SlimConfig(pq=PQConfig(m=16))


@pytest.fixture(scope="module")
def server():
    with OpenAIServer(dim=64) as srv:
        yield srv


def _emb(server: OpenAIServer) -> RemoteEmbedder:
    return RemoteEmbedder(server.base_url, "test-model", dim=64, timeout=10)


def _by_text(idx: Index, q: str, k: int, cfg: SearchConfig | None = None) -> list[str]:
    return [h.text for h in idx.search(q, k=k, mode="vector",
                                       config=None if cfg is None else dataclasses.replace(cfg, k=k))]


def test_slim_recall_against_flat(server: OpenAIServer, tmp_path: Path) -> None:
    data = texts(1500, 0)
    flat = Index.build(data, tmp_path / "f", embedder=_emb(server))
    slim = Index.build(data, tmp_path / "s", embedder=_emb(server), storage="slim", slim=SLIM)
    assert slim.stats()["gen_kind"] == "slim"
    assert "vectors.npy" not in slim.stats()["bytes"]["generation_files"]
    hits3 = hits10 = 0
    for q in QUERIES:
        ref = [h.chunk_id for h in flat.search(q, k=10, mode="vector")]
        got = [h.chunk_id for h in slim.search(q, k=10, mode="vector")]
        hits10 += len(set(ref) & set(got))
        hits3 += len(set(ref[:3]) & set(h.chunk_id for h in slim.search(q, k=3, mode="vector")))
    assert hits10 / (10 * len(QUERIES)) >= 0.95
    assert hits3 / (3 * len(QUERIES)) >= 0.95
    # scores of returned hits are exact (recomputed), equal to flat's for the same chunk
    f = {h.chunk_id: h.score for h in flat.search(QUERIES[0], k=50, mode="vector")}
    for h in slim.search(QUERIES[0], k=5, mode="vector"):
        assert h.score == pytest.approx(f[h.chunk_id], abs=1e-5)
    # batched search gives the same answers as one query at a time
    batch = slim.search_batch(QUERIES[:5], k=5)
    assert [[h.chunk_id for h in hs] for hs in batch] == [[h.chunk_id for h in slim.search(q, k=5, mode="vector")]
                                                           for q in QUERIES[:5]]
    per_vec = slim.stats()["slim_bytes"]["per_vector"]
    assert per_vec < 100


def test_updates_match_a_flat_index_of_the_same_live_chunks(server: OpenAIServer, tmp_path: Path) -> None:
    wide = SearchConfig(rerank=96, ef=160, early_stop=False)  # small n: rerank covers all
    base, extra = texts(300, 1), texts(60, 2)
    slim = Index.build(base, tmp_path / "s", embedder=_emb(server), storage="slim", slim=SLIM)
    slim.add(extra)                                     # delta buffer, searched alongside the graph
    gone = [s for s, _ in base[:40]] + [s for s, _ in extra[:10]]
    slim.remove(gone)                                   # tombstones in graph and delta
    live = [d for d in base + extra if d[0] not in set(gone)]
    ref = Index.build(live, tmp_path / "ref", embedder=_emb(server))
    for q in QUERIES[:20]:
        assert _by_text(slim, q, 5, wide) == _by_text(ref, q, 5)
    slim.compact()                                      # new generation: graph over live chunks only
    assert slim.stats()["counts"]["vectors"] == len(live) and slim.stats()["gen_kind"] == "slim"
    for q in QUERIES[:20]:
        assert _by_text(slim, q, 5, wide) == _by_text(ref, q, 5)
    slim.close()
    again = Index.open(tmp_path / "s")                  # embedder reopened from the manifest
    for q in QUERIES[:5]:
        assert _by_text(again, q, 5, wide) == _by_text(ref, q, 5)


def test_auto_storage_picks_by_size(server: OpenAIServer, tmp_path: Path) -> None:
    small = Index.build(texts(50, 3), tmp_path / "a", embedder=_emb(server),
                        config=IndexConfig(storage="auto", auto_slim_chunks=100))
    assert small.stats()["gen_kind"] == "flat"
    small.add(texts(80, 4))
    small.compact()
    assert small.stats()["gen_kind"] == "slim"


def test_manifests_with_the_old_query_knobs_still_open(server: OpenAIServer, tmp_path: Path) -> None:
    path = tmp_path / "o"
    idx = Index.build(texts(120, 7), path, embedder=_emb(server), storage="slim", slim=SLIM)
    assert not set(MOVED_TO_SEARCH) & set(idx.manifest["slim"])  # query knobs: per query, not in the manifest
    before = {q: _by_text(idx, q, 5) for q in QUERIES[:3]}
    idx.close()
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["slim"].update(ef=128, rerank=24, wave=4, early_stop=True)  # as written before the move
    (path / "manifest.json").write_text(json.dumps(manifest))
    again = Index.open(path)
    assert {q: _by_text(again, q, 5) for q in QUERIES[:3]} == before
    with pytest.raises(ValueError, match="vector search only"):
        again.search_batch(QUERIES[:2], config=SearchConfig(mode="keyword"))
    again.close()
    manifest["slim"]["rerank_depth"] = 24  # a key nobody wrote: refused, not silently dropped
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(TypeError, match="rerank_depth"):
        Index.open(path)


CHILD = """
import sys, time
from slimrag import files
from slimrag.index.store.slim import artifacts
from slimrag.index.core import Index
stage = sys.argv[2]
if stage == "writing":
    orig = artifacts.SlimArtifacts.save
    def slow_save(self, folder):
        orig(self, folder)
        print("writing", flush=True)
        time.sleep(120)
    artifacts.SlimArtifacts.save = slow_save
else:
    orig_switch = files.write_json_atomic
    def slow_switch(path, data):
        print("switching", flush=True)
        time.sleep(120)
    files.write_json_atomic = slow_switch
idx = Index.open(sys.argv[1])
idx.compact()
"""


@pytest.mark.parametrize("stage", ["writing", "switching"])
def test_compaction_killed_midway_keeps_old_generation(server: OpenAIServer, tmp_path: Path, stage: str) -> None:
    path = tmp_path / "k"
    idx = Index.build(texts(200, 5), path, embedder=_emb(server), storage="slim", slim=SLIM)
    idx.add(texts(30, 6))
    idx.remove([s for s, _ in texts(200, 5)[:10]])
    before = {q: _by_text(idx, q, 5) for q in QUERIES[:5]}
    counts = idx.catalog.counts()
    gen = idx.manifest["generation"]
    idx.close()
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), stage], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        line = child.stdout.readline()  # type: ignore[union-attr]
        assert line.strip() == stage, child.stderr.read()  # type: ignore[union-attr]
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert json.loads((path / "manifest.json").read_text())["generation"] == gen
    again = Index.open(path)
    assert again.catalog.counts() == counts
    assert {q: _by_text(again, q, 5) for q in QUERIES[:5]} == before
    again.compact()  # and the next compaction succeeds, clearing the debris
    assert not [p for p in path.iterdir() if p.name.startswith(".tmp-")]
    assert {q: _by_text(again, q, 5) for q in QUERIES[:5]} == before
    assert again.manifest["generation"] > gen
    assert sorted(p.name for p in path.glob("gen-*")) == [f"gen-{again.manifest['generation']:06d}"]


PEOPLE = "Ada Ben Chloe Dmitri Elena Farid Grace Hiro Ines Jonas Keiko Luis Maya Nils Omar Priya".split()
JOBS = ("baker", "pilot", "nurse", "violinist", "geologist", "carpenter", "chemist", "librarian", "sailor",
        "gardener", "architect", "beekeeper")
PLACES = ("Lisbon", "a mountain village", "the harbour district", "Osaka", "a farm near the river", "Nairobi",
          "the old university town", "a fishing island", "Montreal", "the desert outpost")
HOBBIES = ("restores clocks", "collects fossils", "grows orchids", "builds kites", "paints lighthouses",
           "writes crossword puzzles", "studies comets", "brews cider", "carves chess sets", "trains falcons",
           "sings in a choir", "maps caves")


def test_slim_4bit_pq_recall_against_brute_force(embedder, tmp_path: Path) -> None:
    """storage="slim" with explicit 4-bit PQ, real MiniLM embeddings: Index.search recall@10
    against exact search over the same embeddings; ids.npy narrowed, old int64 ids still read."""
    rng = np.random.default_rng(11)
    data = [(f"p/{i:04d}.txt", f"{rng.choice(PEOPLE)} is a {rng.choice(JOBS)} from {rng.choice(PLACES)} "
                               f"who {rng.choice(HOBBIES)} and {rng.choice(HOBBIES)}.") for i in range(320)]
    queries = [f"a {rng.choice(JOBS)} who {rng.choice(HOBBIES)}" for _ in range(24)]
    cfg = SlimConfig(pq=PQConfig(m=96, bits=4))
    idx = Index.build(data, tmp_path / "s", embedder=embedder, storage="slim", slim=cfg)
    art = idx.vectors.searcher.art
    assert (art.pq.bits, art.pq.m, art.codes.shape) == (4, 96, (320, 48))

    ids = np.asarray(idx.catalog.live_ids(), dtype=np.int64)
    chunks = idx.catalog.chunks(ids)
    exact = embedder.embed([embed_input(chunks[int(i)]) for i in ids])
    q = embedder.embed(queries)
    truth = ids[np.argsort(-(q @ exact.T), axis=1, kind="stable")[:, :10]]
    found = [[h.chunk_id for h in hits] for hits in idx.search_batch(queries, k=10)]
    recall = np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth.tolist(), strict=True)])
    assert recall >= 0.95, recall

    gen = tmp_path / "s" / f"gen-{idx.manifest['generation']:06d}"
    assert np.load(gen / "ids.npy").dtype == np.uint16  # 2 bytes per row, not int64's 8
    idx.close()
    np.save(gen / "ids.npy", np.load(gen / "ids.npy").astype(np.int64))  # as written before narrowing
    again = Index.open(tmp_path / "s", embedder=embedder)
    assert [[h.chunk_id for h in hits] for hits in again.search_batch(queries[:4], k=10)] == found[:4]


class CountingEmbedder(RemoteEmbedder):
    """The test server's embedder, counting the texts it embeds (re-embedding is compaction's cost)."""

    count = 0

    def embed_batch(self, texts: list[str]) -> np.ndarray:
        self.count += len(texts)
        return super().embed_batch(texts)


def test_compact_updates_the_graph_and_reembeds_few_rows(server: OpenAIServer, tmp_path: Path) -> None:
    wide = SearchConfig(rerank=96, ef=160, early_stop=False)  # small n: rerank covers all
    emb = CountingEmbedder(server.base_url, "test-model", dim=64, timeout=10)
    base, extra = texts(400, 7), texts(12, 8)
    idx = Index.build(base, tmp_path / "s", embedder=emb, storage="slim", slim=SLIM)
    gen = idx.manifest["generation"]
    idx.add(extra)  # 3% of the graph's rows: under the automatic policy's share, stays in the delta
    assert idx.manifest["generation"] == gen and idx.manifest["delta_parts"]
    gone = [s for s, _ in base[:8]]
    idx.remove(gone)
    live = [d for d in base + extra if d[0] not in set(gone)]
    ref = Index.build(live, tmp_path / "ref", embedder=_emb(server))
    emb.count = 0
    idx.compact()  # incremental: a rebuild would re-embed all 392 kept rows
    assert emb.count <= 16
    assert idx.manifest["generation"] > gen and not idx.manifest["delta_parts"]
    assert idx.stats()["counts"]["vectors"] == len(live) and idx.stats()["gen_kind"] == "slim"
    for q in QUERIES[:20]:
        assert _by_text(idx, q, 5, wide) == _by_text(ref, q, 5)
    emb.count = 0
    idx.compact(rebuild=True)  # fresh graph and codebooks: every live row re-embedded once
    assert emb.count == len(live)
    idx.close()
    again = Index.open(tmp_path / "s")
    for q in QUERIES[:10]:
        assert _by_text(again, q, 5, wide) == _by_text(ref, q, 5)


def test_add_compacts_a_slim_index_once_its_delta_reaches_the_share(server: OpenAIServer, tmp_path: Path) -> None:
    from slimrag.index.writer import AUTO_COMPACT_SHARE

    idx = Index.build(texts(200, 9), tmp_path / "s", embedder=_emb(server), storage="slim", slim=SLIM)
    gen = idx.manifest["generation"]
    below = int(AUTO_COMPACT_SHARE * 200) - 2
    idx.add(texts(below, 10))
    assert idx.manifest["generation"] == gen and len(idx.manifest["delta_parts"]) == 1
    idx.add(texts(3, 11))  # the delta now holds more than the share: folded into the graph
    assert idx.manifest["generation"] > gen and not idx.manifest["delta_parts"]
    assert idx.stats()["counts"]["vectors"] == 200 + below + 3 and idx.stats()["gen_kind"] == "slim"
