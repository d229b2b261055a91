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

Throughput, old against new, in one run (``--passages N`` or ``--folder DIR``):

    python -m bench.chunking --passages 20000                  # bench.scale's synthetic passages
    python -m bench.chunking --passages 20000 --corpus pydocs  # Python doc paragraphs (real prose)
    python -m bench.chunking --folder bench/data/python3.11-doc   # real files, read by the readers

Each passage is one document (as `bench.scale` builds them); a folder's files are the documents.
``old`` tokenizes every section with its offsets (``Chunker(word_counts=False)``), ``new`` counts
by words (`slimrag.ingest.wordcount`, the default). Each mode gets a fresh chunker (the word table
starts cold, as in a build) and both cut the same documents block by block (``--block``,
default 500; which mode goes first alternates), so that the load of a shared machine falls on
both alike. Two levels: ``chunk`` (`Chunker.chunk` on the document's sections, parsed
beforehand) and ``prepare`` (`slimrag.ingest.source.prepare`, the per-document step that
bench.scale's ``chunk`` phase times: read, hash, parse, chunk). Chunks per second, µs per
document, the new/old speedup in wall and in CPU seconds (the process's; on a loaded machine
the figure to trust, as the chunker runs on one thread), and whether both cut identical chunks
(compared in full; the run fails if not). JSON: ``--out`` (default
``bench/results/chunking_throughput.json``, one entry per corpus).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path

from slimrag.errors import IngestError
from slimrag.ingest.chunker import Chunker, default_chunker, load_tokenizer
from slimrag.ingest.outcome import Skipped
from slimrag.ingest.source import InputItem, PreparedDoc, load, parse, prepare


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


def corpus_items(args: argparse.Namespace) -> list[InputItem]:
    """The documents of the throughput mode: ``--passages`` inline texts of ``--corpus``
    (synthetic: `bench.passages`, seed 0; pydocs: `bench.datasets.python_doc_paragraphs`, repeated
    if fewer), or every file the crawl keeps under ``--folder``."""
    if args.folder:
        from slimrag.ingest.crawl import crawl

        skipped: list = []
        files = list(crawl(args.folder, ignore=(), max_bytes=64 << 20, skipped=skipped))
        return [InputItem(str(f.path), f.path, None, f.mtime, 64 << 20) for f in files]
    if args.corpus == "synthetic":
        from bench.passages import Passages

        texts = [t for _, t in Passages(0).pairs(args.passages)]
    else:
        from bench.datasets import python_doc_paragraphs

        paras = [t for _, t in python_doc_paragraphs()]
        texts = [paras[i % len(paras)] for i in range(args.passages)]
    return [InputItem(f"p{i:07d}", None, t, 0.0) for i, t in enumerate(texts)]


def _chunker(mode: str) -> Chunker:
    from slimrag.embed.local import default_model_dir

    return Chunker(load_tokenizer(str(default_model_dir())), 200, 40, word_counts=mode == "new")


def throughput(items: list[InputItem], block: int) -> list[dict]:
    """Old against new on ``items`` at both levels (module header): a fresh chunker per mode, the
    documents in blocks of ``block``, each block cut by both (which goes first alternates)."""
    sections = []  # the chunk level's input, parsed untimed; files prepare would skip left out
    for item in items:
        try:
            sections.append(parse(item.source, load(item)[1], item.path))
        except IngestError:
            continue
    rows = []
    for level in ("chunk", "prepare"):
        chunkers = {"old": _chunker("old"), "new": _chunker("new")}
        seconds, cpu, cut = {"old": 0.0, "new": 0.0}, {"old": 0.0, "new": 0.0}, {"old": [], "new": []}
        work = sections if level == "chunk" else items
        for b, lo in enumerate(range(0, len(work), block)):
            for mode in (("old", "new") if b % 2 == 0 else ("new", "old")):
                chunker, part = chunkers[mode], work[lo: lo + block]
                t0, c0 = time.perf_counter(), time.process_time()
                if level == "chunk":
                    out = [chunker.chunk(secs) for secs in part]
                else:
                    out = [d.pieces if isinstance(d, PreparedDoc) else d for d in (prepare(i, None, chunker) for i in part)]
                seconds[mode] += time.perf_counter() - t0
                cpu[mode] += time.process_time() - c0
                cut[mode].extend(out)
        chunks = sum(len(c) for c in cut["old"] if isinstance(c, list))
        for mode in ("old", "new"):
            rows.append({"level": level, "mode": mode, "documents": len(work), "chunks": chunks,
                         "seconds": seconds[mode], "chunks_per_s": chunks / seconds[mode],
                         "us_per_document": seconds[mode] / len(work) * 1e6,
                         "speedup": seconds["old"] / seconds[mode], "cpu_s": cpu[mode],
                         "cpu_speedup": cpu["old"] / cpu[mode], "identical": cut["old"] == cut["new"]})
    return rows


def main_throughput(args: argparse.Namespace) -> None:
    items = corpus_items(args)
    name = f"folder:{args.folder}" if args.folder else f"{args.corpus}-{len(items)}"
    load_before = os.getloadavg()
    rows = throughput(items, args.block)
    load_after = os.getloadavg()
    print(f"{name}: {len(items)} documents, blocks of {args.block}, "
          f"load {load_before[0]:.2f} -> {load_after[0]:.2f}")
    print(f"{'level':<8} {'mode':<4} {'chunks':>8} {'seconds':>8} {'chunks/s':>9} {'us/doc':>8} {'x':>5} "
          f"{'CPU s':>7} {'CPU x':>5} identical")
    for r in rows:
        print(f"{r['level']:<8} {r['mode']:<4} {r['chunks']:>8} {r['seconds']:>8.2f} {r['chunks_per_s']:>9.0f} "
              f"{r['us_per_document']:>8.1f} {r['speedup']:>5.2f} {r['cpu_s']:>7.2f} {r['cpu_speedup']:>5.2f} "
              f"{r['identical']}")
    out = args.out or Path("bench/results/chunking_throughput.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    runs = json.loads(out.read_text()) if out.exists() else {}
    runs[name] = {"rows": rows, "block": args.block, "load_before": load_before, "load_after": load_after,
                  "cpus": os.cpu_count()}
    out.write_text(json.dumps(runs, indent=2))
    print(f"wrote {out}")
    if not all(r["identical"] for r in rows):
        raise SystemExit("old and new chunks differ")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=float, nargs="+", default=[1, 2, 5, 10], help="file sizes in MB")
    ap.add_argument("--kinds", nargs="+", choices=sorted(KINDS), default=list(KINDS))
    ap.add_argument("--old", action="store_true", help="also time the replaced patterns on small inputs")
    ap.add_argument("--passages", type=int, default=0, help="throughput mode: old against new on N passages")
    ap.add_argument("--corpus", choices=["synthetic", "pydocs"], default="synthetic", help="throughput mode's text")
    ap.add_argument("--folder", type=Path, default=None, help="throughput mode on the files of a folder instead")
    ap.add_argument("--block", type=int, default=500, help="throughput mode: documents per alternating block")
    ap.add_argument("--out", type=Path, default=None,
                    help="JSON (default bench/results/chunking.json, chunking_throughput.json with --passages)")
    args = ap.parse_args()
    if args.passages or args.folder:
        main_throughput(args)
        return
    args.out = args.out or Path("bench/results/chunking.json")

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
