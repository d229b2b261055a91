"""The crasher: kill writers with SIGKILL at random moments and check what they leave.

After Qdrant's ``crasher``. For each trial: copy a prepared index (flat or slim, with a delta part
and tombstones), start a child process that runs one write operation on it, SIGKILL the child
after a seeded random delay (uniform over 1.1x the operation's clean duration, measured first),
then check the index in this process:

1. it opens;
2. `Index.check`: SQLite ``integrity_check`` and FTS5 ``integrity-check`` pass, every live chunk has
   exactly one vector and no vector lacks its chunk (after the writer lock's recovery of a write
   killed between its manifest switch and its commit, counted as ``rolled back``);
3. vector, keyword and hybrid search answer, with hits of stored documents only;
4. the state is the one before the operation, the one after it, or (add, remove) a prefix of its
   transactions: ``before`` / ``partial`` / ``after`` in the table;
5. re-running the operation converges: documents, chunk texts and the results of the three
   search modes equal those of a clean run (compared by source, ordinal and text; chunk ids may
   differ, since an interrupted add consumes ids).

Operations: ``add`` (200 new documents and 20 changed ones, 16 chunks per transaction so a kill
often lands between two), ``remove`` (60 documents, 5 per call), ``compact`` (a flat compaction,
or a slim one: graph + PQ build after re-embedding every row). The embedder is `HashEmbedder`:
deterministic character-trigram hashing, 64 dims, no model to load, so a child starts in about a
second and the crash, not the embedding, is what is measured.

Usage::

    python -m bench.crash --kills 200            # per storage kind: table + bench/results/crash.json
    python -m bench.crash --kills 6 --storage flat --seed 1
    python -m bench.crash --lock-cost            # the writer lock's cost, uncontended

`run_trials` is also what ``tests/test_crash.py`` runs, with a few kills.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from slimrag.embed.base import Embedder
from slimrag.embed.registry import register
from slimrag.index import writer
from slimrag.index.core import Index
from slimrag.index.store.slim import SlimConfig, vcache
from slimrag.index.store.slim.pq import PQConfig

OPS = ("add", "remove", "compact")
STORAGES = ("flat", "slim")
#: chunks per transaction in the crashed adds (the library default is 2048: one transaction here)
COMMIT_CHUNKS = 16
SLIM = SlimConfig(pq=PQConfig(m=16))
WORDS = ("river stone cloud engine violin garden copper lantern harbor orbit meadow signal falcon "
         "pepper quartz timber canyon glacier marble velvet ember mosaic nectar saddle tundra").split()
QUERIES = ("copper lantern harbor", "glacier canyon velvet", "uniq7 meadow", "falcon pepper quartz orbit")


class HashEmbedder(Embedder):
    """Character trigrams hashed (CRC-32) into 64 signed buckets: texts sharing words get close
    vectors, the same text always the same vector. Registered as kind "hash", so a child process
    reopens an index built with it from the manifest alone."""

    model_id, dim, kind = "bench:trigram-hash-64", 64, "hash"

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), np.float32)
        for row, text in enumerate(texts):
            t = f" {text.lower()} "
            for i in range(len(t) - 2):
                h = zlib.crc32(t[i: i + 3].encode())
                out[row, h % self.dim] += 1.0 if (h >> 16) & 1 else -1.0
        return out + 1e-6


register("hash", lambda rec: HashEmbedder())


def docs(prefix: str, n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` short documents, each with a word of its own (``uniqN``) so keyword search can find it."""
    rng = random.Random(seed)
    return [(f"{prefix}/{i:03d}.txt", " ".join(rng.choices(WORDS, k=14)) + f" uniq{i} {prefix}{i}")
            for i in range(n)]


BASE = docs("base", 150, 1)
EXTRA = docs("extra", 30, 2)
NEW = docs("new", 200, 3)
CHANGED = [(s, t + " revised") for s, t in BASE[20:40]]
REMOVED = [s for s, _ in BASE[60:120]]


def prepare(root: Path, storage: str) -> Path:
    """The index every trial of ``storage`` starts from: a compacted generation of `BASE`, a delta
    part (`EXTRA`) and ten tombstones."""
    path = root / f"template-{storage}"
    idx = Index.build(BASE, path, embedder=HashEmbedder(), storage=storage, slim=SLIM)
    idx.add(EXTRA)
    idx.remove([s for s, _ in BASE[:10]])
    idx.close()
    return path


def run_op(path: Path, op: str, ready: bool = False) -> float:
    """One operation on the index at ``path`` (what a child runs and a re-run repeats); returns
    the seconds from "ready" (index open) to the end of the operation."""
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; one of {OPS}")
    saved, writer.COMMIT_CHUNKS = writer.COMMIT_CHUNKS, COMMIT_CHUNKS
    try:
        with Index.open(path, embedder=HashEmbedder()) as idx:
            if ready:
                print("ready", flush=True)
            t0 = time.perf_counter()
            if op == "add":
                idx.add(NEW + CHANGED)
            elif op == "remove":
                for i in range(0, len(REMOVED), 5):
                    idx.remove(REMOVED[i: i + 5])
            else:
                idx.compact()
            return time.perf_counter() - t0
    finally:
        writer.COMMIT_CHUNKS = saved


def signature(path: Path) -> dict[str, Any]:
    """What must converge: documents, chunk texts, and the three search modes' results, by
    (source, ordinal) so chunk ids do not matter. Searched with a cold cache of recomputed rows
    (`vcache.forget`): a slim search gives rows already cached their exact scores, so a warm
    cache, shared by the process's handles, could rank otherwise than the clean run did."""
    vcache.forget()
    with Index.open(path, embedder=HashEmbedder()) as idx:
        chunks = idx.catalog.chunks(idx.catalog.live_ids())
        sig: dict[str, Any] = {
            "documents": [(d.source, d.doc_id) for d in idx.documents()],
            "chunks": sorted((c.source, c.ordinal, c.text) for c in chunks.values()),
        }
        for mode in ("vector", "keyword", "hybrid"):
            sig[mode] = [[(h.source, h.metadata.get("ordinal")) for h in idx.search(q, k=8, mode=mode)]
                         for q in QUERIES]
    return sig


@dataclass
class Trial:
    """One kill and what the checker found."""

    storage: str
    op: str
    delay_s: float
    killed: bool  # False: the child finished before the kill
    state: str = ""  # before / partial / after
    rolled_back: int = 0
    problems: list[str] = field(default_factory=list)  # empty when every check passed

    @property
    def ok(self) -> bool:
        return not self.problems


def _child(path: Path, op: str) -> subprocess.Popen[str]:
    code = f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})\n" \
           "from bench.crash import run_op; from pathlib import Path\n" \
           f"print('done', run_op(Path({str(path)!r}), {op!r}, ready=True), flush=True)\n"
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def _timed_clean_run(path: Path, op: str) -> float:
    """Run ``op`` in a child, uninterrupted: the seconds from its "ready" to the end of the
    operation (as the child reports them: a fresh process pays lazy imports and cold caches a
    warm one does not) bound the kill delays."""
    child = _child(path, op)
    out, err = child.communicate(timeout=600)
    lines = out.split()
    if child.returncode != 0 or "done" not in lines:
        raise RuntimeError(f"clean {op} child failed: {err}")
    return float(lines[lines.index("done") + 1])


def check_state(path: Path, before: dict[str, Any], after: dict[str, Any]) -> tuple[str, int, list[str]]:
    """Checks 1-4 of the module header on a killed writer's index: (state, parts rolled back, problems)."""
    problems: list[str] = []
    with Index.open(path, embedder=HashEmbedder()) as idx:
        rep = idx.check()
        problems += rep.problems()
        stored = {d.source for d in idx.documents()}
        for mode in ("vector", "keyword", "hybrid"):
            hits = idx.search(QUERIES[0], k=5, mode=mode)
            if not hits or any(h.source not in stored for h in hits):
                problems.append(f"{mode} search: {[h.source for h in hits]}")
    sig = signature(path)
    if sig == before:
        state = "before"
    elif sig == after:
        state = "after"
    else:
        state = "partial"
        old, new = set(before["chunks"]), set(after["chunks"])
        extra = set(sig["chunks"]) - old - new
        if extra:
            problems.append(f"{len(extra)} chunks neither before nor after the operation")
    return state, len(rep.rolled_back), problems


def run_trials(kills: int, storages: Sequence[str] = STORAGES, ops: Sequence[str] = OPS, seed: int = 0,
               workdir: Path | None = None, log: bool = True) -> list[Trial]:
    """``kills`` trials per storage kind, spread round-robin over ``ops``; see the module header."""
    rng = random.Random(seed)
    own = workdir is None
    root = Path(tempfile.mkdtemp(prefix="slimrag-crash-")) if own else Path(workdir)  # type: ignore[arg-type]
    trials: list[Trial] = []
    try:
        for storage in storages:
            template = prepare(root, storage)
            before = signature(template)
            clean: dict[str, tuple[dict[str, Any], float]] = {}
            for op in ops:
                ref = root / f"clean-{storage}-{op}"
                shutil.copytree(template, ref)
                dur = _timed_clean_run(ref, op)
                clean[op] = (signature(ref), dur)
            for n in range(kills):
                op = ops[n % len(ops)]
                after, dur = clean[op]
                trial_dir = root / f"trial-{storage}-{n}"
                shutil.copytree(template, trial_dir)
                delay = rng.uniform(0, 1.1 * dur)
                child = _child(trial_dir, op)
                assert child.stdout is not None
                if child.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"{op} child failed to start: {child.communicate()[1]}")
                time.sleep(delay)
                killed = child.poll() is None
                if killed:
                    os.kill(child.pid, signal.SIGKILL)
                child.communicate(timeout=60)
                t = Trial(storage, op, round(delay, 4), killed)
                try:
                    t.state, t.rolled_back, t.problems = check_state(trial_dir, before, after)
                    run_op(trial_dir, op)  # 5. the re-run converges to the clean run's state
                    if signature(trial_dir) != after:
                        t.problems.append("re-run diverged from the clean run")
                    with Index.open(trial_dir, embedder=HashEmbedder()) as idx:
                        t.problems += [f"after re-run: {p}" for p in idx.check().problems()]
                except Exception as e:  # noqa: BLE001 - any failure to open or search is a finding
                    t.problems.append(f"{type(e).__name__}: {e}")
                trials.append(t)
                if log:
                    print(f"{storage:5s} {op:8s} kill at {delay:6.3f}s/{dur:.3f}s  "
                          f"{'killed' if killed else 'finished':8s} {t.state:8s} "
                          f"{'ok' if t.ok else '; '.join(t.problems)}", file=sys.stderr, flush=True)
                shutil.rmtree(trial_dir)
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)
    return trials


def table(trials: list[Trial]) -> list[dict[str, Any]]:
    """Rows per (storage, op): kills, children that finished first, states, recoveries, failures."""
    rows = []
    for storage in dict.fromkeys(t.storage for t in trials):
        for op in dict.fromkeys(t.op for t in trials):
            ts = [t for t in trials if t.storage == storage and t.op == op]
            if not ts:
                continue
            states = Counter(t.state for t in ts if t.killed)
            rows.append({"storage": storage, "op": op, "kills": sum(t.killed for t in ts),
                         "finished_first": sum(not t.killed for t in ts),
                         "before": states["before"], "partial": states["partial"], "after": states["after"],
                         "rolled_back": sum(t.rolled_back > 0 for t in ts),
                         "failed": sum(not t.ok for t in ts)})
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    cols = ["storage", "op", "kills", "finished_first", "before", "partial", "after", "rolled_back", "failed"]
    print(" | ".join(f"{c:>14s}" for c in cols))
    for r in rows:
        print(" | ".join(f"{r[c]!s:>14s}" for c in cols))


def lock_cost(n: int = 2000) -> dict[str, float]:
    """Microseconds per uncontended `Index.locked()` enter+exit (flock, holder record, manifest
    re-read) next to an add of one small document, in one run (ratios are what to compare)."""
    root = Path(tempfile.mkdtemp(prefix="slimrag-lock-"))
    try:
        idx = Index.build(BASE[:20], root / "i", embedder=HashEmbedder())
        t0 = time.perf_counter()
        for _ in range(n):
            with idx.locked():
                pass
        lock_us = (time.perf_counter() - t0) / n * 1e6
        t0 = time.perf_counter()
        for i in range(20):
            idx.add([(f"one/{i}.txt", f"one more small document number {i}")])
        add_us = (time.perf_counter() - t0) / 20 * 1e6
        idx.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"lock_us": round(lock_us, 1), "add_one_doc_us": round(add_us, 1),
            "lock_share_of_add": round(lock_us / add_us, 4)}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=200, help="trials per storage kind (default 200)")
    ap.add_argument("--storage", choices=(*STORAGES, "both"), default="both")
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, from {OPS}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench/results/crash.json"))
    ap.add_argument("--lock-cost", action="store_true", help="measure the writer lock's cost and exit")
    args = ap.parse_args(argv)
    if args.lock_cost:
        print(json.dumps(lock_cost()))
        return 0
    ops = tuple(o for o in args.ops.split(",") if o)
    if not set(ops) <= set(OPS):
        ap.error(f"--ops must be from {OPS}")
    storages = STORAGES if args.storage == "both" else (args.storage,)
    t0 = time.perf_counter()
    trials = run_trials(args.kills, storages, ops, args.seed)
    rows = table(trials)
    print_table(rows)
    failed = [t for t in trials if not t.ok]
    out = {"kills": args.kills, "seed": args.seed, "seconds": round(time.perf_counter() - t0, 1),
           "table": rows, "failures": [asdict(t) for t in failed], "trials": [asdict(t) for t in trials]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(f"{len(trials)} trials, {sum(t.killed for t in trials)} kills, {len(failed)} failed; "
          f"{out['seconds']} s; wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
