"""Reading and chunking time per MB on pathological files: is ingest linear in file size?

    python -m bench.chunking                     # 1, 2, 5, 10 MB of each kind
    python -m bench.chunking --sizes 1 5 50      # sizes in MB (50 MB: a minute or two per kind)
    python -m bench.chunking --kinds oneline     # some kinds only
    python -m bench.chunking --old               # also time the patterns they replaced, on small inputs

Each file is written to a temporary folder and goes through the real per-document path
(`slimrag.ingest.source.prepare`: bounded read, reader, MiniLM tokenizer, windows of 200 tokens
with 40 of overlap) with ``max_file_bytes`` raised above the file, so nothing is skipped.
Embedding is not included (it is linear in chunks and measured by bench/index.py).

Kinds (all one line unless said): ``oneline`` prose words; ``noSpace`` one 'word' without a space
(one [UNK] token); ``mdHeading`` a markdown heading line whose title holds a long run of spaces (the
pattern the old heading regex was cubic in); ``htmlLt`` ``<a`` repeated without ``>`` (CPython's
HTMLParser rescanned the rest of the input for each); ``json`` an array of records on one line.

Linear means the per-MB column stays flat as the size grows; the ``x`` column is the per-MB time
divided by that of the smallest size. Prints a table and writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path

from slimrag.ingest.chunker import default_chunker
from slimrag.ingest.outcome import Skipped
from slimrag.ingest.source import InputItem, prepare


def _oneline(n: int) -> tuple[str, bytes]:
    words = b"the lighthouse keeper trims the wick before the storm reaches the harbour "
    return "oneline.txt", (words * (n // len(words) + 1))[:n]


def _nospace(n: int) -> tuple[str, bytes]:
    return "nospace.txt", b"x" * n


def _md_heading(n: int) -> tuple[str, bytes]:
    return "heading.md", b"# kiwi" + b" " * (n - 20) + b"orchard\n\nbody\n"


def _html_lt(n: int) -> tuple[str, bytes]:
    return "lt.html", b"<p>penguins</p>" + b"<a" * ((n - 15) // 2)


def _json(n: int) -> tuple[str, bytes]:
    rec = b'{"name": "Ada", "note": "first computer program", "n": 1815},'
    body = rec * (n // len(rec))
    return "records.json", b"[" + body[:-1] + b"]"


KINDS: dict[str, Callable[[int], tuple[str, bytes]]] = {
    "oneline": _oneline, "noSpace": _nospace, "mdHeading": _md_heading, "htmlLt": _html_lt, "json": _json,
}


def time_prepare(folder: Path, name: str, data: bytes) -> tuple[float, int]:
    """Seconds to read, parse and chunk one file through `prepare`, and the chunks it gave."""
    path = folder / name
    path.write_bytes(data)
    chunker = default_chunker(200, 40)
    chunker.count("warm up")
    t0 = time.perf_counter()
    out = prepare(InputItem(name, path, None, 0.0, max_bytes=len(data) + 1), None, chunker)
    dt = time.perf_counter() - t0
    path.unlink()
    if isinstance(out, Skipped):
        raise SystemExit(f"{name} was skipped: {out.reason}")
    return dt, len(out.pieces)


def time_old_patterns(lengths: list[int]) -> list[dict]:
    """The replaced code paths on small inputs: the backtracking heading regex and HTMLParser on
    undefused ``<a`` runs (each doubling of the input should cost ~2x if linear)."""
    old_heading = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
    rows = []
    for n in lengths:
        line = "# a" + " " * n + "b"
        t0 = time.perf_counter()
        old_heading.match(line)
        rows.append({"kind": "old md regex", "chars": len(line), "seconds": time.perf_counter() - t0})
    for n in lengths:
        html = "<a" * (n * 8)
        t0 = time.perf_counter()
        p = HTMLParser()
        p.feed(html)
        p.close()
        rows.append({"kind": "old HTMLParser", "chars": len(html), "seconds": time.perf_counter() - t0})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=float, nargs="+", default=[1, 2, 5, 10], help="file sizes in MB")
    ap.add_argument("--kinds", nargs="+", choices=sorted(KINDS), default=list(KINDS))
    ap.add_argument("--old", action="store_true", help="also time the replaced patterns on small inputs")
    ap.add_argument("--out", type=Path, default=Path("bench/results/chunking.json"))
    args = ap.parse_args()

    rows: list[dict] = []
    print(f"{'kind':<10} {'MB':>6} {'chunks':>8} {'seconds':>8} {'s/MB':>7} {'x':>5}")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.kinds:
            base = None
            for mb in args.sizes:
                name, data = KINDS[kind](int(mb * 2**20))
                dt, chunks = time_prepare(Path(tmp), name, data)
                per_mb = dt / (len(data) / 2**20)
                base = base or per_mb
                rows.append({"kind": kind, "mb": len(data) / 2**20, "chunks": chunks, "seconds": dt,
                             "s_per_mb": per_mb, "vs_smallest": per_mb / base})
                print(f"{kind:<10} {len(data) / 2**20:>6.1f} {chunks:>8} {dt:>8.2f} {per_mb:>7.2f} "
                      f"{per_mb / base:>5.2f}", flush=True)
    old = time_old_patterns([250, 500, 1000]) if args.old else []
    for r in old:
        print(f"{r['kind']:<16} {r['chars']:>8} chars {r['seconds']:>8.3f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "old": old}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
