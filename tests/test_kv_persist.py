"""The knowledge tree's persistent disk tier (issue 28, item 6): segment K/V that outlive the process.

Ground truth: the tensors that were stored (bitwise), and, across two real processes on the
embedded model, the tokens of the first process: the second gives the same tokens and prefills
only the question (its usage's ``cached_tokens``). Damaged and foreign files must be misses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from slimrag.errors import ModelNotFoundError
from slimrag.llm import weights
from slimrag.llm.kv.config import CacheConfig
from slimrag.llm.kv.payload import SegmentKV
from slimrag.llm.kv.persist import DamagedSegment, PersistentStorage, file_fingerprint
from slimrag.llm.kv.tree import KVTree

torch = pytest.importorskip("torch")


def _seg(gen: torch.Generator, n: int) -> SegmentKV:
    return SegmentKV.from_layers([(torch.randn(1, 2, n, 4, generator=gen), torch.randn(1, 2, n, 4, generator=gen))
                                  for _ in range(3)])


def _tree(folder: Path, namespace: str = "model-a", disk_bytes: int = 1 << 20) -> KVTree:
    cfg = CacheConfig(device="cpu", disk_bytes=disk_bytes, disk_dir=str(folder), persist=True)
    return KVTree(cfg, PersistentStorage(cfg, namespace))


def _same(a: SegmentKV, b: SegmentKV) -> bool:
    return all(torch.equal(x, y) for pa, pb in zip(a.layers, b.layers, strict=True)
               for x, y in zip(pa, pb, strict=True))


def test_a_second_tree_on_the_folder_serves_what_the_first_stored(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    sysk, a, b = _seg(gen, 3), _seg(gen, 5), _seg(gen, 2)
    first = _tree(tmp_path)
    assert first.insert("sys", ["a", "b"], [sysk, a, b]) == 3
    assert len(list(tmp_path.glob("*.kv"))) == 3  # written through on insert, not only on demotion
    first.check()
    first.close()
    assert len(list(tmp_path.glob("*.kv"))) == 3  # closing keeps them

    second = _tree(tmp_path)
    assert second.stats().nodes == 3 and second.stats().tiers[-1].used == sysk.nbytes + a.nbytes + b.nbytes
    with second.matching("sys", ["a", "b", "c"]) as m:
        assert m.passages == 2 and m.tokens == 10
        assert all(_same(got, want) for got, want in zip(m.payloads, [sysk, a, b], strict=True))
    second.check()
    other = _tree(tmp_path, namespace="model-b")  # another model or compute mode: a miss
    with other.matching("sys", ["a"]) as m:
        assert m.tokens == 0
    assert len(list(tmp_path.glob("*.kv"))) == 3  # foreign files within the budget stay


@pytest.mark.parametrize("damage", ["truncate", "garbage", "header", "delete"])
def test_a_damaged_or_vanished_file_is_a_miss_not_a_crash(tmp_path: Path, damage: str) -> None:
    gen = torch.Generator().manual_seed(1)
    sysk, a = _seg(gen, 3), _seg(gen, 4)
    first = _tree(tmp_path)
    first.insert("sys", ["a"], [sysk, a])
    first.close()
    second = _tree(tmp_path)  # restored from intact files
    storage = second.tiers.storage
    assert isinstance(storage, PersistentStorage)
    victim = storage.name(("sys", "a"))
    raw = victim.read_bytes()
    if damage == "truncate":
        victim.write_bytes(raw[:-7])
    elif damage == "garbage":
        victim.write_bytes(raw[:-16] + bytes(16))  # same size, checksum fails
    elif damage == "header":
        victim.write_bytes(b"not a segment file")
    else:
        victim.unlink()  # another process evicted it
    with second.matching("sys", ["a"]) as m:
        assert m.passages == 0 and m.tokens == sysk.tokens  # the system segment still serves
    assert not victim.exists() and second.stats().nodes == 1
    second.check()
    if damage != "delete":
        victim.write_bytes(raw[: len(raw) // 2])
        with pytest.raises(DamagedSegment):
            storage.read(str(victim))
        third = _tree(tmp_path)  # a damaged file found on open is deleted, never adopted
        assert third.stats().nodes == 1 and not victim.exists()


def test_the_budget_holds_on_open_and_foreign_files_go_first(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(2)
    segs = [_seg(gen, 4) for _ in range(4)]
    size = segs[0].nbytes
    alien = _tree(tmp_path, namespace="model-b")
    alien.insert("sys", ["x"], segs[:2])
    alien.close()
    ours = _tree(tmp_path)
    ours.insert("sys", ["a", "b"], segs[1:])
    ours.close()
    assert len(list(tmp_path.glob("*.kv"))) == 5
    small = _tree(tmp_path, disk_bytes=3 * size)
    assert small.stats().tiers[-1].used <= 3 * size and small.stats().nodes == 3
    assert len(list(tmp_path.glob("*.kv"))) == 3  # the foreign files were deleted first
    tighter = _tree(tmp_path, disk_bytes=2 * size)  # now the policy evicts our own leaf
    assert tighter.stats().nodes == 2 and len(list(tmp_path.glob("*.kv"))) == 2
    tighter.check()


def test_file_fingerprint_follows_the_bytes(tmp_path: Path) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"a" * 3000)
    one = file_fingerprint(f)
    f.write_bytes(b"a" * 2999 + b"b")
    assert file_fingerprint(f) != one
    assert file_fingerprint(f) == file_fingerprint(f)


def test_persist_needs_a_disk_budget() -> None:
    with pytest.raises(ValueError, match="disk_bytes"):
        CacheConfig(persist=True)


CHILD = textwrap.dedent("""
    import json, sys
    import torch
    torch.set_num_threads(1)
    from slimrag.llm.backends import make_generator
    from slimrag.llm.reference import greedy_ids
    from slimrag.prompt import Passage, Prompt
    gen = make_generator(None)  # the default embedded generator: persistent disk tier
    passages = (Passage("c0", "notes/cats.md#0", "The cat's name is Whiskers and she sleeps on the piano."),
                Passage("d0", "notes/dogs.md#0", "The dog is called Rex and likes long walks by the river."))
    prompt = Prompt("What is the cat's name?", passages=passages)
    ids, cached = greedy_ids(gen, prompt, 8)
    seg = gen.encode_segments(prompt)
    print(json.dumps({"ids": ids, "cached": cached, "prompt": sum(map(len, seg)), "question": len(seg[-1])}))
""")


def test_a_second_process_prefills_only_the_question_and_gives_the_same_tokens(tmp_path: Path) -> None:
    try:
        weights.default_gguf_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    env = {**os.environ, "SLIMRAG_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

    def run() -> dict:
        out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    first, second = run(), run()
    assert first["cached"] == 0
    assert second["ids"] == first["ids"]
    assert second["cached"] == second["prompt"] - second["question"] > 0
    assert len(list((tmp_path / "kv").glob("*.kv"))) == 3  # system segment and two passages
