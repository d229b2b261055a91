"""A writer SIGKILLed in the middle of a partitioned slim build leaves the previous generation serving.

The index is slim with the graph build forced into small k-means partitions (``exact_below=0``,
``partition_rows=1000``: ~2,500 rows give 5 partitions, the code path of a million-row build).
A real child process runs ``compact(rebuild=True)``: every live row re-embedded to a scratch file,
then `build_slim` with its HNSW partitions. The child installs a partition runner
(`pool.set_runner`, the hook the Ray build uses) that wraps the real one and announces each
partition on stdout before building it; the parent SIGKILLs the child

- ``held``: when the child says it starts partition 2 and waits for a go-ahead that never comes
  (a deterministic point: partitions 0-1 built and merged into the pool, the scratch file on disk);
- ``running``: at once when the child says it starts partition 1, while it builds it (the child
  must still be running when the signal is sent).

Then, in this process: the manifest still names the old generation; the index opens, `check`
passes (SQLite, FTS5, one vector per live chunk); vector, keyword and hybrid search give exactly
what they gave before the kill; and the next compaction collects the dead build's scratch file and
finishes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.crash import HashEmbedder, docs
from slimrag.index.core import Index
from slimrag.index.store import layout, manifest
from slimrag.index.store.slim import SlimConfig
from slimrag.index.store.slim.graph import GraphConfig
from slimrag.index.store.slim.pq import PQConfig

SLIM = SlimConfig(graph=GraphConfig(pool="hnsw", exact_below=0, partition_rows=1000, overlap=2), pq=PQConfig(m=16))
BASE = docs("base", 2400, 5)
EXTRA = docs("extra", 120, 6)
QUERIES = ("copper lantern harbor", "glacier canyon velvet", "uniq7 meadow", "falcon pepper quartz orbit",
           "uniq1999 ember mosaic")
ROOT = Path(__file__).resolve().parent.parent

#: the child: open the index, install a runner that announces each partition, rebuild-compact
CHILD = """
import sys
sys.path.insert(0, {root!r})
from pathlib import Path
from bench.crash import HashEmbedder
from slimrag.index.core import Index
from slimrag.index.store.slim import pool

hold = {hold!r}

def announcing(x, parts, config, knn):
    for i, p in enumerate(parts):
        print(f"partition {{i}} of {{len(parts)}}", flush=True)
        if i == hold:
            sys.stdin.readline()  # the parent kills here; never answered
        yield pool.hnsw_lists(x, p, config, knn)

pool.set_runner(announcing)
with Index.open(Path({path!r}), embedder=HashEmbedder()) as idx:
    idx.compact(rebuild=True)
print("done", flush=True)
"""


def answers(path: Path) -> dict[str, list[tuple[str, int | None]]]:
    """Every query's top 8 in each search mode, by (source, ordinal)."""
    with Index.open(path, embedder=HashEmbedder()) as idx:
        return {f"{mode}:{q}": [(h.source, h.metadata.get("ordinal")) for h in idx.search(q, k=8, mode=mode)]
                for mode in ("vector", "keyword", "hybrid") for q in QUERIES}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("kill") / "template"
    idx = Index.build(BASE, path, embedder=HashEmbedder(), storage="slim", slim=SLIM)
    idx.add(EXTRA)  # a delta part: the rebuild has rows to merge
    idx.remove([s for s, _ in BASE[:10]])  # and tombstones
    idx.close()
    return path


@pytest.mark.parametrize("point", ["held", "running"])
def test_sigkill_during_partition_build_keeps_previous_generation(template: Path, tmp_path: Path,
                                                                   point: str) -> None:
    import shutil

    path = tmp_path / "idx"
    shutil.copytree(template, path)
    before_gen = manifest.read(path).generation
    before = answers(path)
    with Index.open(path, embedder=HashEmbedder()) as idx:
        live_before = sorted(idx.catalog.live_ids())
    hold, kill_at = (2, "partition 2") if point == "held" else (None, "partition 1")
    code = CHILD.format(root=str(ROOT), path=str(path), hold=hold)
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    assert child.stdout is not None
    seen = []
    while True:
        line = child.stdout.readline()
        if not line:
            pytest.fail(f"child ended before {kill_at!r}; saw {seen}: {child.communicate()[1][-2000:]}")
        seen.append(line.strip())
        if line.startswith(kill_at):
            break
    assert child.poll() is None, "the child finished its build before the kill"
    assert any(p.name.startswith(layout.SCRATCH) for p in path.iterdir()), "no scratch file: not inside the build"
    os.kill(child.pid, signal.SIGKILL)
    child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL
    assert int(seen[-1].split()[3]) >= 3, seen  # the build really was partitioned

    assert manifest.read(path).generation == before_gen  # the dead build switched nothing
    with Index.open(path, embedder=HashEmbedder()) as idx:
        report = idx.check()
        assert report.ok, report.problems()
        assert sorted(idx.catalog.live_ids()) == live_before
    assert answers(path) == before  # the previous generation (+ its delta) serves as before

    with Index.open(path, embedder=HashEmbedder()) as idx:  # the next compaction finishes and cleans up
        idx.compact(rebuild=True)
        assert idx.check().ok
        assert sorted(idx.catalog.live_ids()) == live_before
    assert manifest.read(path).generation > before_gen
    assert not any(p.name.startswith(layout.SCRATCH) for p in path.iterdir())
    assert not (path / f"gen-{before_gen:06d}").exists()
