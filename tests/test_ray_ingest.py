"""Distributed ingest on a real local Ray (2 CPUs): it must store exactly what Index.add stores.

One Ray for the module (start-up is ~5 s); each ray_ingest call starts its embedding actor, which
loads the model (~5 s). Skipped when Ray is not installed (pip install 'slimrag[ray]').
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import BAD_FILES, write_mixed_tree

from slimrag.cli import cli
from slimrag.config import RayIngestConfig
from slimrag.embed.base import BUCKET_TOLERANCE
from slimrag.embed.local import CPU_BF16, LocalEmbedder
from slimrag.index.core import Index
from slimrag.index.report import AddReport

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

from slimrag.index.distributed import ray_ingest  # noqa: E402

QUERIES = ["how do I install it on Windows", "what is the cat called", "bread baking temperature",
           "fibonacci function", "planet with two moons", "galaxy seen through a telescope"]


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("slimrag") and r.levelno == logging.WARNING]


def _same_counts(a: AddReport, b: AddReport) -> None:
    """Same counts and skips; skips in any order (the driver lists, so crawl skips come first)."""
    assert (a.added, a.updated, a.unchanged, a.chunks) == (b.added, b.updated, b.unchanged, b.chunks)
    assert sorted((s.source, s.reason) for s in a.skipped) == sorted((s.source, s.reason) for s in b.skipped)


def test_ray_ingest_stores_what_index_add_stores(docs_dir: Path, tmp_path: Path, embedder: LocalEmbedder) -> None:
    local = Index.create(tmp_path / "local.slimrag", embedder=embedder, source_root=docs_dir)
    dist = Index.create(tmp_path / "ray.slimrag", embedder=embedder, source_root=docs_dir)
    _same_counts(local.add(docs_dir), ray_ingest(dist, docs_dir))

    assert [(d.source, d.doc_id, d.size) for d in dist.documents()] == \
        [(d.source, d.doc_id, d.size) for d in local.documents()]
    ids = local.catalog.live_ids()
    assert dist.catalog.live_ids() == ids and len(ids) >= 9
    assert dist.catalog.chunks(ids) == local.catalog.chunks(ids)  # same ids, texts, ordinals, metadata
    assert np.array_equal(dist.vectors.ids, local.vectors.ids)
    got, want = np.asarray(dist.vectors.vectors), np.asarray(local.vectors.vectors)
    if embedder.runtime == CPU_BF16:  # bfloat16: a vector moves slightly with its batch mates, and
        assert (got * want).sum(1).min() >= 0.9998  # Ray's batches need not be add's (test_embed_bf16)
    else:
        np.testing.assert_allclose(got, want, atol=BUCKET_TOLERANCE)
    for q in QUERIES:
        assert [h.chunk_id for h in dist.search(q, k=5)] == [h.chunk_id for h in local.search(q, k=5)], q


def test_bad_files_skipped_with_the_local_warnings(tmp_path: Path, embedder: LocalEmbedder,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    root = write_mixed_tree(tmp_path / "mixed")
    with caplog.at_level(logging.WARNING, logger="slimrag"):
        local_report = Index.create(tmp_path / "l.slimrag", embedder=embedder, source_root=root).add(root)
    local_warned = _warnings(caplog)
    caplog.clear()
    idx = Index.create(tmp_path / "r.slimrag", embedder=embedder, source_root=root)
    with caplog.at_level(logging.WARNING, logger="slimrag"):
        report = ray_ingest(idx, root)
    warned = _warnings(caplog)

    assert sorted(warned) == sorted(local_warned) and len(warned) == 4
    for bad in BAD_FILES:
        assert sum(bad in w for w in warned) == 1, (bad, warned)
    _same_counts(report, local_report)
    assert sorted(d.source for d in idx.documents()) == ["good.md", "good2.txt", "ok.pdf"]
    assert idx.search("dwarf planet", k=1)[0].source == "ok.pdf"
    assert idx.search("volcano eruption", k=1)[0].source == "good.md"


def test_reingest_adds_nothing_then_updates_a_changed_file(docs_dir: Path, tmp_path: Path,
                                                           embedder: LocalEmbedder) -> None:
    path = tmp_path / "re.slimrag"
    idx = Index.create(path, embedder=embedder, source_root=docs_dir)
    first = idx.add(docs_dir)  # written by the local path; Ray must see it as unchanged
    counts, parts = idx.catalog.counts(), idx.manifest["delta_parts"]
    idx.close()

    again = ray_ingest(path, docs_dir)  # by folder, as the CLI does
    assert (again.added, again.updated, again.chunks, again.skipped) == (0, 0, 0, [])
    assert again.unchanged == first.added
    with Index.open(path, embedder=embedder) as reopened:
        assert reopened.catalog.counts() == counts and reopened.manifest["delta_parts"] == parts

    (docs_dir / "guide/cats.md").write_text("# Cats\n\nThe office cat is now named Pumpkin.\n")
    out = CliRunner().invoke(cli, ["add", str(path), str(docs_dir), "--ray", "--json"])
    assert out.exit_code == 0, out.output
    rep = json.loads(out.output.strip().splitlines()[-1])
    assert (rep["added"], rep["updated"], rep["unchanged"], rep["chunks"]) == (0, 1, first.added - 1, 1)
    with Index.open(path, embedder=embedder) as reopened:
        top = reopened.search("what is the office cat called", k=1)[0]
        assert top.source == "guide/cats.md" and "Pumpkin" in top.text
        assert reopened.catalog.counts()["chunks"] == counts["chunks"]


def test_actor_pool_size_leaves_a_cpu_for_parsing() -> None:
    assert RayIngestConfig().actors(2) == 1
    assert RayIngestConfig().actors(16) == 8
    assert RayIngestConfig(embed_gpus=1).actors(16, 4) == 4
    with pytest.raises(ValueError, match="no CPU .* for parsing"):
        RayIngestConfig(num_embed_actors=2).actors(2)
    with pytest.raises(ValueError, match="num_embed_actors"):
        RayIngestConfig(num_embed_actors=0)
    with pytest.raises(ValueError, match="wait forever"):  # GPUs asked of a CPU-only cluster
        RayIngestConfig(embed_gpus=1).actors(16, 0)
    with pytest.raises(ValueError, match="needs at least 2"):
        RayIngestConfig().actors(1)

