"""Benchmark: a cold ``slimrag ask``, from spawn to the first byte of its answer (issue 28 item 5).

``python -m bench.cold_ask`` spawns ``slimrag ask`` (the installed entry point, a new process
each time, as a user runs it) and reads its stdout as it comes: *first byte* is the first byte of
the answer on stdout, *model* the moment the model's own words start (a grounded answer streams
its evidence sentences first and the model's sentence after `slimrag.rag.grounded.IN_SHORT`;
``--answer free`` has only the model's words, so both are the same), *total* the process's end.
Each case is run ``--reps`` times (default 3) and reported by its median:

(a) small, warm home
    A flat index of 40 short notes (the first ten paragraphs of 25-150 words of the json,
    statistics, pathlib and csv pages of the Python 3.11 docs, one note a file), built once under
    ``bench/data/cold-notes.slimrag`` with the default embedder. One untimed ask fills the home
    first (the persistent KV tier, any embedder export), then the same question is asked again.
(b) small, empty home
    The same index and question, each run with a new, empty ``SLIMRAG_HOME``: whatever a first
    run must create (the KV folder, an ONNX export of the embedder for an index recorded ``onnx``)
    is on the clock.
(c) 497 files, new question
    ``bench/data/pydocs-497.slimrag`` (the Python docs as 497 files; ``--big``), its
    questions from ``bench/pydocs_qa.json``: each run a question not asked before in this home,
    with the persistent KV tier (``$SLIMRAG_HOME/kv``) emptied before it, so nothing of its prompt
    was computed by an earlier process. The home is warmed first by one untimed ask of another
    question (the embedder's export).
(d) 497 files, asked before
    Right after each run of (c), the same question in a new process: its passages (and the
    system segment) were computed by the earlier process and are read from the KV tier.

``--baseline DIR/src`` (a source tree of an earlier commit: ``git archive REV src | tar -x -C DIR``)
runs that tree and the current one alternately, run by run, each with homes of its own, and
the table gives each first byte's ratio to the baseline's: on a shared machine only such ratios
within one run mean much.

Every spawn runs at normal priority; run the whole script under the shared timing lock
(``flock /tmp/slimrag-timing.lock python -m bench.cold_ask``). The load average is recorded with
each run, because on a shared machine it moves the absolute seconds.

Prints a table and writes ``bench/results/cold_ask.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from slimrag.rag.grounded import IN_SHORT

ROOT = Path(__file__).resolve().parent
DATA = ROOT / "data"
RESULTS = ROOT / "results" / "cold_ask.json"
SLIMRAG = str(Path(sys.executable).with_name("slimrag"))
SMALL = DATA / "cold-notes.slimrag"
NOTES = DATA / "cold-notes"
BIG = DATA / "pydocs-497.slimrag"
QA = ROOT / "pydocs_qa.json"
#: The pages the 40 notes come from, ten paragraphs each (module header).
NOTE_PAGES = ("json", "statistics", "pathlib", "csv")
SMALL_QUESTION = "How do I parse a JSON string into a Python object?"
#: Asked once in the 497-file case's home before the timed runs (never one of the timed questions).
WARMUP_QUESTION = "What does the glossary say a decorator is?"
#: The targets of issue 28's acceptance, first byte, seconds.
TARGETS = {"a": 2.0, "b": 4.0, "c": 4.0, "d": 2.0}


def write_notes(folder: Path) -> int:
    """The 40 notes of case (a) as files in ``folder``; returns how many."""
    from bench.datasets import python_docs_dir

    folder.mkdir(parents=True, exist_ok=True)
    n = 0
    for page in NOTE_PAGES:
        text = (python_docs_dir() / "library" / f"{page}.rst.txt").read_text(encoding="utf-8")
        paras = [p.strip() for p in re.split(r"\n\s*\n", text)]
        for i, p in enumerate([p for p in paras if 25 <= len(p.split()) <= 150 and not p.startswith("..")][:10]):
            (folder / f"{page}-{i:02d}.txt").write_text(p + "\n", encoding="utf-8")
            n += 1
    return n


def small_index(env: dict[str, str]) -> Path:
    """The 40-note flat index, built once (kept under ``bench/data``)."""
    if not (SMALL / "manifest.json").is_file():
        write_notes(NOTES)
        subprocess.run([SLIMRAG, "build", str(NOTES), "-o", str(SMALL), "--storage", "flat"], env=env,
                       check=True, stdout=subprocess.DEVNULL)
    return SMALL


def spawn(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """One ``slimrag ask``: seconds from spawn to its first stdout byte, to the model's first words
    (`IN_SHORT` in a grounded answer; the first byte with ``--answer free``; None when a grounded
    answer has no model sentence) and to its end."""
    load = os.getloadavg()[0]
    t = time.perf_counter()
    with subprocess.Popen([SLIMRAG, "ask", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          bufsize=0) as p:
        assert p.stdout is not None and p.stderr is not None
        out = p.stdout.read(1)
        first = time.perf_counter() - t
        model = None if IN_SHORT.encode() not in out else first
        while chunk := p.stdout.read(256):
            out += chunk
            if model is None and IN_SHORT.encode() in out:
                model = time.perf_counter() - t
        err = p.stderr.read()
        if p.wait() != 0:
            raise RuntimeError(f"slimrag ask {args} exited with {p.returncode}: {err.decode()[-2000:]}")
    total = time.perf_counter() - t
    if args[-2:] == ["--answer", "free"]:
        model = first
    return {"first_byte_s": first, "model_s": model, "total_s": total, "load_avg": load,
            "answer_head": out.decode("utf-8", "replace")[:160]}


def _env(home: Path, threads: int | None, src: str | None) -> dict[str, str]:
    """The environment of one spawn: its ``SLIMRAG_HOME``, threads, and the source tree it runs
    (``src`` put first on ``PYTHONPATH``; None: the installed one)."""
    env = dict(os.environ, SLIMRAG_HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("OMP_NUM_THREADS", None)  # the CLI picks its threads as a user's shell would leave it to
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    if src is not None:
        env["PYTHONPATH"] = src
    return env


def _summary(runs: list[dict[str, Any]], target: float) -> dict[str, Any]:
    med = {k: statistics.median(vals) if (vals := [r[k] for r in runs if r[k] is not None]) else None
           for k in ("first_byte_s", "model_s", "total_s")}
    return {"median": med, "target_first_byte_s": target, "met": med["first_byte_s"] <= target, "runs": runs}


def run(reps: int, extra: list[str], threads: int | None, cases: str,
        trees: dict[str, str | None]) -> dict[str, dict[str, Any]]:
    """The cases named in ``cases`` (letters of the module header), each ``reps`` times for each
    source tree of ``trees`` (name -> ``src`` folder, None for the installed one), the trees
    alternating run by run, each with homes of its own. Returns tree -> case -> summary."""
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {t: {c: [] for c in cases} for t in trees}
    scratch = Path(tempfile.mkdtemp(prefix="cold-ask-"))

    def env(tree: str, home: str) -> dict[str, str]:
        return _env(scratch / tree / home, threads, trees[tree])

    try:
        small = small_index(_env(scratch / "build-home", threads, None))
        ask_small = [str(small), SMALL_QUESTION, *extra]
        if "a" in cases:
            for t in trees:
                spawn(ask_small, env(t, "a"))  # fills the home
            for _ in range(reps):
                for t in trees:
                    runs[t]["a"].append(spawn(ask_small, env(t, "a")))
        if "b" in cases:
            for i in range(reps):
                for t in trees:
                    runs[t]["b"].append(spawn(ask_small, env(t, f"b{i}")))
        if ("c" in cases or "d" in cases) and BIG.exists():
            for t in trees:
                spawn([str(BIG), WARMUP_QUESTION, *extra], env(t, "big"))
            for q in [q["question"] for q in json.loads(QA.read_text())][1 : reps + 1]:
                for t in trees:
                    shutil.rmtree(scratch / t / "big" / "kv", ignore_errors=True)
                    for case in "cd":  # a question never asked, then the same again
                        result = spawn([str(BIG), q, *extra], env(t, "big")) | {"question": q}
                        if case in cases:
                            runs[t][case].append(result)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {t: {c: _summary(r, TARGETS[c]) for c, r in by_case.items() if r} for t, by_case in runs.items()}


LABELS = {"a": "(a) small flat, warm home", "b": "(b) small flat, empty home",
          "c": "(c) 497 files, question never asked", "d": "(d) 497 files, asked before"}


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def table(result: dict[str, Any]) -> str:
    """The medians of each case and tree against the target, with the first byte's ratio to the
    first tree's."""
    lines = [f"{'case':<38} {'tree':<9} {'first byte s':>12} {'model s':>8} {'total s':>8} {'target':>7}  met "
             f"{'ratio':>6}  load", "-" * 104]
    trees = list(result["trees"])
    for key, label in LABELS.items():
        for t in trees:
            c = result["cases"][t].get(key)
            if c is None:
                continue
            m = c["median"]
            base = result["cases"][trees[0]][key]["median"]["first_byte_s"]
            load = statistics.median(r["load_avg"] for r in c["runs"])
            lines.append(f"{label:<38} {t:<9} {m['first_byte_s']:12.2f} {_s(m['model_s']):>8} "
                         f"{m['total_s']:8.2f} {c['target_first_byte_s']:7.1f}  {'yes' if c['met'] else 'no ':<4}"
                         f"{m['first_byte_s'] / base:5.2f}x {load:5.1f}")
    return "\n".join(lines)


def main() -> None:
    """Parse arguments, run the cases, print the table, write the JSON file."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cases", default="abcd", help="which cases to run (letters of the header)")
    ap.add_argument("--threads", type=int, default=None,
                    help="OMP_NUM_THREADS for the spawned asks (default: unset, the CLI's own choice)")
    ap.add_argument("--answer", choices=("grounded", "free"), default=None,
                    help="the answer mode (default: the model's own, grounded for the embedded one)")
    ap.add_argument("--baseline", default=None,
                    help="a src folder of an earlier version (git archive REV src | tar -x -C DIR; give DIR/src), "
                         "run alternately with the current tree")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    extra = ["--answer", args.answer] if args.answer else []
    trees = ({"baseline": args.baseline} if args.baseline else {}) | {"current": os.environ.get("PYTHONPATH")}
    cases = run(args.reps, extra, args.threads, args.cases, trees)
    result = {"trees": trees, "cases": cases, "reps": args.reps, "answer": args.answer or "default",
              "threads": args.threads, "cpus": os.cpu_count(), "python": sys.version.split()[0]}
    print(table(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
