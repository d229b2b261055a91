"""Folder sync: what a sync costs when little changed, and whether it converges after SIGKILLs.

Part 1, cost (``--files N``, default 3,000 files of ~300 bytes in folders of 100): the folder is
built into an index, then each case is timed, the sync cases interleaved with the reference over
``--repeat`` rounds so load on a shared machine hits both alike (medians reported):

- ``sync, nothing changed``: the crawl and one ``stat`` per file; ``read`` must be 0;
- ``add, nothing changed`` (the reference): `add` reads and hashes every file to find it unchanged;
- ``sync, all touched``: every mtime moved, bytes the same: every file read and hashed, nothing
  embedded (``read`` = N, 0 chunks);
- ``sync, 1% edited + 1% deleted + 1% new``: the usual day.

Part 2, convergence (``--kills K``, default 20): a sync of a burst (the folder plus 300 new files,
30 edited, 30 renamed, 30 deleted) runs in a child with 16 chunks per transaction and is SIGKILLed
after a seeded random delay, uniform over 1.1x its clean duration (measured first); then a sync
runs here, and the index must pass `Index.check` and hold exactly the folder's files (sources and
SHA-256 of each file, computed here).

The embedder is bench.crash's `HashEmbedder` (no model), so the sync's own work is measured.

Usage::

    python -m bench.sync                         # table + bench/results/sync.json
    python -m bench.sync --files 10000 --kills 50
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.crash import WORDS, HashEmbedder
from slimrag.index.core import Index

REPO = Path(__file__).resolve().parents[1]
#: chunks per transaction in the killed syncs (the library's 2,048 would make one transaction)
COMMIT_CHUNKS = 16


def write_folder(root: Path, n: int, seed: int, prefix: str = "f") -> None:
    rng = random.Random(seed)
    for i in range(n):
        p = root / f"d{i // 100:03d}" / f"{prefix}{i:05d}.txt"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(" ".join(rng.choices(WORDS, k=40)) + f" {prefix}uniq{i}")


def age(root: Path, seconds: float = 3600.0) -> None:
    t = time.time() - seconds
    for p in root.rglob("*"):
        os.utime(p, (t, t))


def truth(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def cost(work: Path, n: int, repeat: int) -> list[dict[str, Any]]:
    folder = work / "docs"
    write_folder(folder, n, 1)
    age(folder)
    idx = Index.build(folder, work / "docs.slimrag", embedder=HashEmbedder())
    rows: dict[str, list[float]] = {"sync, nothing changed": [], "add, nothing changed": []}
    reads = {}
    for _ in range(repeat):
        s, rep = timed(lambda: idx.sync(folder))
        rows["sync, nothing changed"].append(s)
        reads["sync, nothing changed"] = (rep.read, rep.chunks)
        s, rep = timed(lambda: idx.add(folder))
        rows["add, nothing changed"].append(s)
        reads["add, nothing changed"] = (rep.unchanged, rep.chunks)  # add opens every unchanged file
    age(folder, 1800)
    s, rep = timed(lambda: idx.sync(folder))
    rows["sync, all touched"] = [s]
    reads["sync, all touched"] = (rep.read, rep.chunks)
    files = sorted(folder.rglob("*.txt"))
    k = max(1, n // 100)
    for p in files[:k]:
        p.write_text(p.read_text() + " edited")
    for p in files[k: 2 * k]:
        p.unlink()
    write_folder(folder / "new", k, 2, "n")
    t = time.time() - 900  # not just written (see sync.RACY_S), the other files' mtimes kept
    for p in [*files[:k], *(folder / "new").rglob("*")]:
        os.utime(p, (t, t))
    s, rep = timed(lambda: idx.sync(folder))
    rows["sync, 1% edited + 1% deleted + 1% new"] = [s]
    reads["sync, 1% edited + 1% deleted + 1% new"] = (rep.read, rep.chunks)
    assert {d.source: d.doc_id for d in idx.documents()} == truth(folder), "sync diverged from the folder"
    idx.close()
    return [{"case": c, "files": n, "median_s": round(statistics.median(v), 4), "runs": len(v),
             "files_read": reads[c][0], "chunks_embedded": reads[c][1]} for c, v in rows.items()]


def burst(folder: Path, seed: int) -> None:
    """Changes of the convergence trials: 300 new files, 30 edited, 30 renamed, 30 deleted."""
    write_folder(folder / "burst", 300, seed, "b")
    files = sorted(p for p in folder.rglob("f*.txt"))
    for i in range(30):
        files[i].write_text(files[i].read_text() + " edited")
        files[30 + i].rename(files[30 + i].with_name("renamed-" + files[30 + i].name))
        files[60 + i].unlink()


def child(path: Path, folder: Path) -> subprocess.Popen[str]:
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
            "from bench.crash import HashEmbedder\nfrom slimrag.index import writer\n"
            "from slimrag.index.core import Index\nimport time\n"
            f"writer.COMMIT_CHUNKS = {COMMIT_CHUNKS}\n"
            f"idx = Index.open({str(path)!r}, embedder=HashEmbedder())\n"
            "print('ready', flush=True)\nt0 = time.perf_counter()\n"
            f"idx.sync({str(folder)!r})\nprint('done', time.perf_counter() - t0, flush=True)\n")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})


def convergence(work: Path, kills: int, seed: int) -> dict[str, Any]:
    # An index records its folder's absolute path (its source root), so every trial runs at the
    # path the template was built at: built at work/trial, kept at work/template, copied back.
    trial, template = work / "trial", work / "template"
    write_folder(trial / "docs", 600, 3)
    age(trial / "docs")
    Index.build(trial / "docs", trial / "docs.slimrag", embedder=HashEmbedder()).close()
    burst(trial / "docs", 4)
    trial.rename(template)

    def fresh(name: str) -> tuple[Path, Path]:
        if trial.exists():
            shutil.rmtree(trial)
        shutil.copytree(template, trial, symlinks=True)
        return trial / "docs", trial / "docs.slimrag"

    folder, path = fresh("clean")
    c = child(path, folder)
    out, err = c.communicate(timeout=600)
    if c.returncode != 0 or "done" not in out:
        raise RuntimeError(f"clean sync failed: {err}")
    clean_s = float(out.split()[-1])
    rng = random.Random(seed)
    trials = []
    for k in range(kills):
        folder, path = fresh(f"trial-{k}")
        delay = rng.uniform(0, 1.1 * clean_s)
        c = child(path, folder)
        assert c.stdout is not None and c.stdout.readline().strip() == "ready"
        time.sleep(delay)
        killed = c.poll() is None
        c.send_signal(signal.SIGKILL)
        c.communicate(timeout=60)
        with Index.open(path, embedder=HashEmbedder()) as idx:
            before = len(idx.documents())
            rep = idx.sync(folder)
            check = idx.check()
            ok = check.ok and {d.source: d.doc_id for d in idx.documents()} == truth(folder)
            trials.append({"delay_s": round(delay, 3), "killed": killed, "docs_at_kill": before,
                           "resync_added": rep.added, "resync_updated": rep.updated, "resync_removed": rep.removed,
                           "ok": ok, "problems": check.problems()})
    return {"clean_sync_s": round(clean_s, 3), "kills": kills, "killed_mid_sync": sum(t["killed"] for t in trials),
            "converged": sum(t["ok"] for t in trials), "trials": trials}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=3000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench/results/sync.json"))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="slimrag-sync-") as tmp:
        rows = cost(Path(tmp) / "cost", args.files, args.repeat)
        conv = convergence(Path(tmp) / "kill", args.kills, args.seed) if args.kills else None
    print(f"{'case':<42} {'files':>6} {'median s':>9} {'read':>6} {'embedded':>9}")
    for r in rows:
        print(f"{r['case']:<42} {r['files']:>6} {r['median_s']:>9.3f} {r['files_read']:>6} {r['chunks_embedded']:>9}")
    if conv is not None:
        print(f"kill -9 mid-sync: {conv['killed_mid_sync']}/{conv['kills']} killed before the end, "
              f"{conv['converged']}/{conv['kills']} converged after one more sync (clean sync {conv['clean_sync_s']} s)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"cost": rows, "convergence": conv, "load": os.getloadavg()}, indent=1))
    return 0 if conv is None or conv["converged"] == conv["kills"] else 1


if __name__ == "__main__":
    sys.exit(main())
