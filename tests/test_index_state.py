"""The open index's state (issue 17): the typed manifest and its migration, append-only commits,
memory-mapped delta parts, and compactions that stream their vectors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.crash import HashEmbedder, docs
from slimrag.config import IndexConfig
from slimrag.errors import IndexFormatError
from slimrag.index.core import Index
from slimrag.index.store import layout, manifest, vectors
from slimrag.index.store.flat import Column, FlatVectors


def _exact(idx: Index) -> dict[int, np.ndarray]:
    """Every live chunk's vector, embedded again from its stored text (ground truth)."""
    from slimrag.index.state import embed_input

    chunks = idx.catalog.chunks(idx.catalog.live_ids())
    ids = sorted(chunks)
    vecs = idx.embedder.embed([embed_input(chunks[i]) for i in ids])
    return dict(zip(ids, vecs, strict=True))


def test_manifest_round_trip_and_migration(tmp_path: Path) -> None:
    idx = Index.build(docs("a", 5, 1), tmp_path / "i", embedder=HashEmbedder())
    m = manifest.read(idx.root)
    assert m == idx.manifest and manifest.Manifest.from_dict(m.to_dict()) == m
    assert m["delta_parts"] == [] and m.get("nothing", 7) == 7 and m.gen_kind == "flat"
    with pytest.raises(KeyError):
        m["nothing"]
    raw = json.loads((idx.root / layout.MANIFEST).read_text())
    idx.close()
    old = {k: v for k, v in raw.items() if k not in ("gen_kind", "slim", "next_part", "created", "updated")}
    (tmp_path / "i" / layout.MANIFEST).write_text(json.dumps(old))  # as written before slim existed
    again = Index.open(tmp_path / "i", HashEmbedder())
    assert again.manifest.gen_kind == "flat" and again.manifest.next_part == 0
    assert [h.source for h in again.search("uniq3 a3", k=1, mode="keyword")] == ["a/003.txt"]
    again.add(docs("b", 2, 2))  # the first switch writes the current form
    assert json.loads((tmp_path / "i" / layout.MANIFEST).read_text())["gen_kind"] == "flat"
    again.close()
    (tmp_path / "i" / layout.MANIFEST).write_text(json.dumps({**raw, "format": 99}))
    with pytest.raises(IndexFormatError, match="format 99"):
        Index.open(tmp_path / "i", HashEmbedder())


def test_delta_vectors_are_mapped_in_place(tmp_path: Path) -> None:
    for dtype, rows in ((np.float32, 5), (np.float16, 3), (np.float32, 0)):
        vecs = np.random.default_rng(rows).standard_normal((rows, 8)).astype(dtype)
        name = layout.write_delta_part(tmp_path, rows, np.arange(rows), vecs)
        ids, mapped = layout.read_delta_part(tmp_path / layout.DELTA / name, mmap=True)
        assert ids.tolist() == list(range(rows)) and mapped.dtype == dtype
        np.testing.assert_array_equal(mapped, vecs)
        if rows:  # a view of the file, not a copy
            assert not mapped.flags.owndata and not mapped.flags.writeable
    (tmp_path / layout.DELTA / "part-000005.npz").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(IndexFormatError, match="unreadable"):
        layout.read_delta_part(tmp_path / layout.DELTA / "part-000005.npz", mmap=True)


def test_mapped_parts_hold_no_file_descriptor(tmp_path: Path) -> None:
    """An open index maps one part per commit; a descriptor per mapping would cap the delta at
    the process's descriptor limit (often 1,024)."""
    import gc
    import os

    vecs = np.ones((4, 8), np.float32)
    name = layout.write_delta_part(tmp_path, 0, np.arange(4), vecs)
    gc.collect()  # earlier tests' unclosed catalogs (reference cycles) close their files now, not mid-count
    before = len(os.listdir("/proc/self/fd"))
    maps = [layout.map_delta_vectors(tmp_path / layout.DELTA / name) for _ in range(64)]
    assert len(os.listdir("/proc/self/fd")) == before and all(np.array_equal(m, vecs) for m in maps)


def test_a_commit_reads_no_earlier_part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    idx = Index.build(docs("a", 30, 1), tmp_path / "i", embedder=HashEmbedder())
    mapped: list[str] = []
    real_map = layout.map_delta_vectors
    monkeypatch.setattr(layout, "map_delta_vectors", lambda p: mapped.append(Path(p).name) or real_map(p))
    monkeypatch.setattr(layout, "read_delta_part", lambda *a, **k: pytest.fail("a commit re-read a delta part"))
    monkeypatch.setattr(layout, "read_generation", lambda *a, **k: pytest.fail("a commit re-read the generation"))
    for i in range(4):
        idx.add(docs(f"b{i}", 3, i))
    assert mapped == list(idx.manifest.delta_parts) and len(mapped) == 4  # each part mapped once, when written
    monkeypatch.undo()
    idx.add([("a/001.txt", "replaced text about comets")])  # a replacement masks the old rows
    truth = _exact(idx)
    live_ids, live_vecs = idx.vectors.live_vectors()
    assert live_ids.tolist() == sorted(truth)
    np.testing.assert_allclose(live_vecs, np.stack([truth[i] for i in live_ids]), atol=1e-6)
    assert [h.source for h in idx.search("replaced text about comets", k=1, mode="vector")] == ["a/001.txt"]


def test_another_writers_parts_are_appended_not_reloaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one = Index.build(docs("a", 10, 1), tmp_path / "i", embedder=HashEmbedder())
    two = Index.open(tmp_path / "i", HashEmbedder())
    one.add(docs("b", 4, 2))
    one.add(docs("c", 4, 3))
    one.remove(["a/002.txt"])
    monkeypatch.setattr(layout, "read_generation", lambda *a, **k: pytest.fail("the generation was reopened"))
    with two.locked():  # catches up: the two new parts appended, the removal masked
        pass
    monkeypatch.undo()
    assert two.vectors.ids.tolist() == one.vectors.ids.tolist()
    assert two.vectors.live.tolist() == one.vectors.live.tolist()
    one.compact()
    with two.locked():  # a new generation: reopened
        pass
    assert two.manifest == one.manifest and len(two.vectors) == len(one.vectors) == 17


@pytest.mark.parametrize("storage", ["flat", "slim"])
def test_compaction_streams_one_row_per_live_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   storage: str) -> None:
    monkeypatch.setattr(vectors, "COPY_ROWS", 7)  # many blocks
    idx = Index.build(docs("a", 40, 1), tmp_path / "i", embedder=HashEmbedder(),
                      config=IndexConfig(storage=storage, dtype="float16" if storage == "flat" else "float32"))
    idx.add(docs("b", 9, 2))
    idx.remove(["a/00*"])
    # a chunk present twice (what the race of unlocked writers of old versions left): kept once
    dup = idx.catalog.live_ids("a/011.txt")[0]
    extra = layout.write_delta_part(idx.root, 50, np.array([dup]), idx.embedder.embed(["x"]).astype(np.float32))
    idx.state.switch(idx.manifest.changed(delta_parts=(*idx.manifest.delta_parts, extra)))
    idx.compact(rebuild=True)
    truth = _exact(idx)
    gen = layout.read_generation(idx.root, idx.manifest.generation)
    assert np.asarray(gen["ids"], np.int64).tolist() == sorted(truth)
    assert not list(idx.root.glob(layout.SCRATCH + "*"))  # the slim build's scratch file is gone
    if storage == "flat":
        assert gen["vectors"].dtype == np.float16
        np.testing.assert_allclose(gen["vectors"], np.stack([truth[i] for i in sorted(truth)]), atol=2e-3)
    assert idx.check().ok


def test_column_grows_without_copying_per_append() -> None:
    col = Column(np.arange(3))
    for i in range(100):
        col.append(np.array([i, i]))
    assert len(col) == 203 and col.view[:3].tolist() == [0, 1, 2] and col.view[-2:].tolist() == [99, 99]
    flat = FlatVectors(np.array([5, 6]), np.eye(2, 4, dtype=np.float32))
    flat.append(np.array([9]), np.ones((1, 4), np.float16))
    flat.kill(np.array([6]))
    assert flat.live.tolist() == [True, False, True]
    ids, _ = flat.search(np.array([0, 1, 0, 0], np.float32), 3)
    assert ids.tolist() == [[9, 5]]  # the killed row is never returned


def _held(root: Path) -> list[str]:
    """Files under ``root`` this process holds: open descriptors and memory mappings."""
    import os

    inside = str(root.resolve())
    fds = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
           if os.path.exists(f"/proc/self/fd/{fd}")]
    maps = [line.split(maxsplit=5)[-1] for line in Path("/proc/self/maps").read_text().splitlines()
            if len(line.split(maxsplit=5)) == 6]
    return sorted({p for p in fds + maps if p.startswith(inside)})


@pytest.mark.parametrize("storage", ["flat", "slim"])
def test_indexes_free_their_files_without_the_garbage_collector(tmp_path: Path, storage: str) -> None:
    """With ``gc.disable()``, a closed index and a dropped unclosed one hold no descriptor and no
    mapping of their folder: nothing among catalog, codec, state, store and searcher refers back to
    its owner, so reference counting alone frees them (issue 32)."""
    import gc

    from slimrag.index.store.slim import PQConfig, SlimConfig

    root = tmp_path / "i"
    kw = {"storage": storage, "slim": SlimConfig(pq=PQConfig(m=16))} if storage == "slim" else {}
    built = Index.build(docs("a", 300, 1), root, embedder=HashEmbedder(), **kw)
    built.add(docs("b", 5, 2))  # a delta part, mapped
    built.close()
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        for close in (True, False):
            idx = Index.open(root, HashEmbedder())
            assert idx.search("uniq3 a3", k=3, mode="vector") and idx.search("uniq3", k=1, mode="keyword")
            assert _held(root), "the open index holds its files"
            if close:
                idx.close()
            del idx
            assert _held(root) == [], f"{'closed' if close else 'dropped'} index still holds {_held(root)}"
    finally:
        if was:
            gc.enable()
