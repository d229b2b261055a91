"""Benchmark: the everyday path: embedding throughput, the local embedder's runtimes, one-shot commands.

``python -m bench.ingest`` measures, in one run on the same texts (so ratios hold on a busy machine):

throughput
    ``N`` random Python-doc paragraphs (``bench.datasets.python_doc_paragraphs``, seeded), embedded by
    sentence-transformers' own ``encode(texts, batch_size=B)`` (its reference speed), by
    `Embedder.embed` (length-bucketed) with the torch, the ONNX and the torch-bf16 runtime at several batch sizes,
    by the pre-bucketing path (``embed_batch`` over file-order slices of 64), and by the whole
    ``Index.build`` (chunking, SQLite, compaction included) on each runtime. Each row is the best of
    ``--reps`` rounds, the rows of a round interleaved. With ``--int8`` also the ONNX int8 variant
    and its recall@10 against fp32 (self-queries: the first 8 words of 100 paragraphs).
cold commands
    A flat index of the 43,408 Python-doc paragraphs (``--cold-chunks``), kept under
    ``bench/data/`` once built: the first ``--cold-embed`` paragraphs are embedded for real (ONNX),
    the others reuse those vectors cyclically, because a cold search's cost (process start, imports,
    opening the catalog and the memory-mapped matrix, one query embedding, one matrix product) does
    not depend on the vectors' values and embedding 43k paragraphs takes tens of minutes here.
    Then a fresh ``slimrag search`` process per mode (median of ``--reps``), the modules a vector
    search imports (``-X importtime``), and ``slimrag ask`` to its first answer byte on stdout, with
    a phase profile of a cold ask (imports, index open, retrieval, LLM load, first token).

variants (``--variants``)
    The local embedder's variants (fp32, fused, int8, int8-fused, int8-block, torch-bf16) on 256-token chunks:
    chunks/s, tokens/s and share of the CPU's float32 GEMM peak, then gold top-5 on the question
    sets and recall@10 against fp32 (`bench.embed_variants` describes the method). Embeddings of
    the quality sets are cached, so ``--variant-sets`` and ``--variant-runtimes`` can split a long
    measurement into short runs; a last run with everything cached gathers one table.

Not here: compaction cost after adding rows and recall after update rounds (issue 10's slim
compaction rows) belong to ``bench/compaction.py``.

Prints one table and writes ``bench/results/ingest.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

RESULTS = Path(__file__).resolve().parent / "results" / "ingest.json"
DATA = Path(__file__).resolve().parent / "data"
QUERY = "How do I parse a JSON string into a Python object?"
SLIMRAG = str(Path(sys.executable).with_name("slimrag"))
RUNTIME_VARIANTS = ("onnx", "onnx-fused", "onnx-int8", "onnx-int8-fused", "onnx-int8-block", "torch-bf16")

# A cold vector search with the embedder on a given runtime (the CLI takes the index's recorded one).
_SEARCH_RUNTIME = """
import sys
import slimrag.cli
from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
with Index.open(sys.argv[1], embedder=LocalEmbedder(runtime=sys.argv[3])) as idx:
    print(idx.search(sys.argv[2], k=5, mode="vector")[0].source)
"""

# A cold `ask`, phase by phase, in a fresh interpreter (what `slimrag ask` does, with clocks).
_ASK_PROFILE = """
import json, sys, time
t0 = time.perf_counter()
import slimrag.cli
from slimrag.index.core import Index
from slimrag.rag.pipeline import RAG
from slimrag.embed.local import LocalEmbedder
t1 = time.perf_counter()
idx = Index.open(sys.argv[1], embedder=LocalEmbedder(runtime=sys.argv[3]))
t2 = time.perf_counter()
rag = RAG(idx, None)
hits = rag.retrieve(sys.argv[2], 4)
t3 = time.perf_counter()
mods = sorted(m for m in ("torch", "transformers", "sentence_transformers", "onnxruntime") if m in sys.modules)
rag.llm.load()
t4 = time.perf_counter()
for piece in rag.stream_answer(sys.argv[2], 4):
    if isinstance(piece, str) and piece:
        break
t5 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "open_s": t2 - t1, "retrieve_s": t3 - t2, "llm_load_s": t4 - t3,
                  "first_token_s": t5 - t4, "total_s": t5 - t0, "imported_before_llm": mods}))
"""


def _texts(n: int, seed: int = 0) -> list[str]:
    from bench.datasets import python_doc_paragraphs

    paras = [t for _, t in python_doc_paragraphs()]
    pick = np.random.default_rng(seed).choice(len(paras), min(n, len(paras)), replace=False)
    return [paras[int(i)] for i in pick]


def _best(fns: dict[str, Callable[[], Any]], reps: int) -> dict[str, float]:
    """Best wall seconds of each function over ``reps`` interleaved rounds."""
    times: dict[str, list[float]] = defaultdict(list)
    for _ in range(reps):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
            print(f"  {name}: {times[name][-1]:.1f}s", file=sys.stderr, flush=True)
    return {k: min(v) for k, v in times.items()}


def throughput(n: int, batch_sizes: list[int], reps: int, int8: bool) -> dict[str, Any]:
    """Chunks/s of every embedding path on the same ``n`` texts (see the module header)."""
    from sentence_transformers import SentenceTransformer

    from slimrag.embed.local import LocalEmbedder, default_model_dir
    from slimrag.index.core import Index

    texts = _texts(n)
    runtimes = ["torch", "onnx", "torch-bf16"] + (["onnx-int8"] if int8 else [])
    emb = {r: LocalEmbedder(runtime=r) for r in runtimes}
    st = SentenceTransformer(str(default_model_dir()), device="cpu", local_files_only=True)
    for e in emb.values():
        e.embed_batch(texts[:8])  # load (and export) outside the clock
    st.encode(texts[:8])
    pairs = [(f"p/{i:05d}.txt", t) for i, t in enumerate(texts)]
    work = Path(tempfile.mkdtemp(prefix="slimrag-bench-ingest-"))
    built: dict[str, int] = {}

    def build(r: str) -> Callable[[], None]:
        def run() -> None:
            idx = Index.build(pairs, work / r, embedder=emb[r], storage="flat", overwrite=True)
            built[r] = idx.last_report.chunks
            idx.close()
        return run

    def file_order() -> None:
        for s in range(0, len(texts), 64):
            emb["torch"].embed_batch(texts[s:s + 64])

    fns: dict[str, Callable[[], Any]] = {
        "st.encode bs=64": lambda: st.encode(texts, batch_size=64),
        "st.encode bs=16": lambda: st.encode(texts, batch_size=16),
        "torch file order bs=64 (before)": file_order}
    for r in runtimes:
        for b in batch_sizes:
            fns[f"{r} Embedder.embed bs={b}"] = _bound(emb[r].embed, texts, b)
    for r in ("torch", "onnx", "torch-bf16"):
        fns[f"{r} Index.build"] = build(r)  # embed_batch 64, capped by the runtime's batch_cap
    try:
        best = _best(fns, reps)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ref = best["st.encode bs=64"]
    rows = [{"path": k, "seconds": v, "chunks": built.get(k.split()[0], n) if "Index.build" in k else n,
             "chunks_per_s": (built.get(k.split()[0], n) if "Index.build" in k else n) / v, "vs_st_bs64": ref / v}
            for k, v in best.items()]
    out: dict[str, Any] = {"texts": n, "rows": rows, "token_lengths": _token_stats(emb["onnx"], texts)}
    if int8:
        out["int8_recall_at_10_vs_fp32"] = _int8_recall(emb["onnx"], emb["onnx-int8"], texts)
    return out


def _bound(embed: Callable[..., Any], texts: list[str], batch_size: int) -> Callable[[], Any]:
    return lambda: embed(texts, batch_size=batch_size)


def _token_stats(e: Any, texts: list[str]) -> dict[str, float]:
    lens = e.lengths(texts)
    return {"mean": float(lens.mean()), "p50": float(np.median(lens)), "p95": float(np.percentile(lens, 95)),
            "max": int(lens.max())}


def _int8_recall(fp32: Any, int8: Any, texts: list[str], nq: int = 100, k: int = 10) -> float:
    """recall@k of int8 search (int8 queries over int8 vectors) against fp32's exact top-k."""
    pick = np.random.default_rng(1).choice(len(texts), min(nq, len(texts)), replace=False)
    queries = [" ".join(texts[int(i)].split()[:8]) for i in pick]
    x32, q32 = fp32.embed(texts), fp32.embed(queries)
    x8, q8 = int8.embed(texts), int8.embed(queries)
    truth = np.argsort(-(q32 @ x32.T), axis=1)[:, :k]
    got = np.argsort(-(q8 @ x8.T), axis=1)[:, :k]
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(truth.tolist(), got.tolist(), strict=True)]))


def cold_index(n_chunks: int, n_embed: int) -> Path:
    """A flat index of ``n_chunks`` Python-doc paragraphs, built once (see the module header)."""
    from bench.datasets import python_doc_paragraphs
    from slimrag.embed.local import LocalEmbedder
    from slimrag.index.core import Index
    from slimrag.ingest.chunker import ChunkText
    from slimrag.ingest.source import PreparedDoc

    path = DATA / f"cold-flat-{n_chunks}-{n_embed}.slimrag"
    if (path / "manifest.json").is_file():
        return path
    paras = python_doc_paragraphs()[:n_chunks]
    emb = LocalEmbedder(runtime="onnx")
    real = emb.embed([t for _, t in paras[:n_embed]])
    by_file: dict[str, list[int]] = defaultdict(list)
    for i, (source, _) in enumerate(paras):
        by_file[source.split("#")[0]].append(i)
    tmp = path.with_name(path.name + ".tmp")
    idx = Index.create(tmp, embedder=emb, overwrite=True)

    def docs() -> Any:
        for source, rows in by_file.items():
            body = "\n\n".join(paras[i][1] for i in rows)
            yield PreparedDoc(source, hashlib.sha256(body.encode()).hexdigest(), 0.0, len(body),
                              [ChunkText(paras[i][1], {}) for i in rows], real[np.array(rows) % n_embed])

    idx.write(docs())
    idx.compact()
    idx.close()
    tmp.rename(path)
    return path


def _wall(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def _first_byte(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Seconds to the first byte on stdout, and to the process's end."""
    t = time.perf_counter()
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0) as p:
        assert p.stdout is not None
        p.stdout.read(1)
        first = time.perf_counter() - t
        p.stdout.read()
        if p.wait() != 0:
            raise RuntimeError(f"{cmd} exited with {p.returncode}")
    return first, time.perf_counter() - t


def _imports(cmd_args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Import seconds of a cold CLI run and whether the heavy stacks were imported."""
    code = "import sys; from slimrag.cli import main; sys.argv = ['slimrag'] + sys.argv[1:]; main()"
    res = subprocess.run([sys.executable, "-X", "importtime", "-c", code, *cmd_args], env=env,
                         capture_output=True, text=True, check=True)
    cumulative: dict[str, int] = {}
    for line in res.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cum, name = line.split("|")
            if not cum.strip().isdigit():  # the header line
                continue
            cumulative[name.strip()] = int(cum)  # a module is listed once: at its first import
    top = {m: cumulative[m] / 1e6 for m in ("torch", "transformers", "sentence_transformers", "onnxruntime",
                                            "tokenizers", "numpy", "click") if m in cumulative}
    return {"seconds_by_package": top, "imported_stacks": sorted(top)}


def cold(n_chunks: int, n_embed: int, reps: int, ask: bool) -> dict[str, Any]:
    path = cold_index(n_chunks, n_embed)
    env = dict(os.environ)
    out: dict[str, Any] = {"index": str(path), "chunks": n_chunks, "embedded_for_real": n_embed, "search": {}}
    for mode in ("keyword", "vector", "hybrid"):
        runs = [_wall([SLIMRAG, "search", str(path), QUERY, "--mode", mode], env) for _ in range(reps)]
        out["search"][mode] = {"median_s": statistics.median(runs), "runs_s": runs,
                               "imports": _imports(["search", str(path), QUERY, "--mode", mode], env)}
    for runtime in ("torch", "onnx"):
        runs = [_wall([sys.executable, "-c", _SEARCH_RUNTIME, str(path), QUERY, runtime], env) for _ in range(reps)]
        out["search"][f"vector, {runtime} runtime, no CLI"] = {"median_s": statistics.median(runs), "runs_s": runs}
    if ask:
        firsts = [_first_byte([SLIMRAG, "ask", str(path), QUERY, "--max-tokens", "16"], env) for _ in range(reps)]
        out["ask"] = {"first_byte_median_s": statistics.median(f for f, _ in firsts),
                      "total_median_s": statistics.median(t for _, t in firsts), "runs": firsts, "profile": {}}
        for runtime in ("torch", "onnx"):  # sequential phases; torch = the query embedding before this issue
            prof = subprocess.run([sys.executable, "-c", _ASK_PROFILE, str(path), QUERY, runtime], env=env,
                                  capture_output=True, text=True, check=True)
            out["ask"]["profile"][runtime] = json.loads(prof.stdout.strip().splitlines()[-1])
    return out


def _print(result: dict[str, Any]) -> None:
    if "variants" in result:
        from bench.embed_variants import table

        print(table(result["variants"]))
    if "throughput" in result or "cold" in result:
        print(f"{'measure':<44} {'seconds':>8} {'chunks/s':>9} {'vs st bs64':>10}")
    if "throughput" in result:
        for r in result["throughput"]["rows"]:
            print(f"{r['path']:<44} {r['seconds']:8.2f} {r['chunks_per_s']:9.1f} {r['vs_st_bs64']:9.2f}x")
        if "int8_recall_at_10_vs_fp32" in result["throughput"]:
            print(f"{'onnx-int8 recall@10 vs fp32':<44} {result['throughput']['int8_recall_at_10_vs_fp32']:8.3f}")
    if "cold" in result:
        c = result["cold"]
        for mode, r in c["search"].items():
            stacks = ",".join(r["imports"]["imported_stacks"]) if "imports" in r else ""
            print(f"{'cold search ' + mode:<44} {r['median_s']:8.2f}   {'imports ' + stacks if stacks else ''}")
        if "ask" in c:
            a = c["ask"]
            print(f"{'cold slimrag ask: first answer byte':<44} {a['first_byte_median_s']:8.2f}")
            for runtime, prof in a["profile"].items():
                phases = ", ".join(f"{k.removesuffix('_s')} {v:.2f}" for k, v in prof.items() if k.endswith("_s"))
                print(f"  ask phases, sequential, {runtime} query embedding: {phases}")
    print(f"load average (1 min) at end: {result['machine']['loadavg_1m_at_end']:.1f}")


def main() -> None:
    """Parse arguments, run the parts asked for, print the table, write the JSON file."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="paragraphs for the throughput rows")
    ap.add_argument("--batch-sizes", default="16,32,64", help="Embedder.embed batch sizes to compare")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--int8", action="store_true", help="also the ONNX int8 variant and its recall vs fp32")
    ap.add_argument("--cold-chunks", type=int, default=43408)
    ap.add_argument("--cold-embed", type=int, default=2048, help="paragraphs of the cold index embedded for real")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--skip-cold", action="store_true")
    ap.add_argument("--skip-ask", action="store_true")
    ap.add_argument("--variants", action="store_true", help="the embedder's graph variants: speed and quality")
    ap.add_argument("--variant-chunks", type=int, default=64, help="256-token chunks for the variants' speed")
    ap.add_argument("--variant-runtimes", default=",".join(RUNTIME_VARIANTS))
    ap.add_argument("--variant-sets", default="disfl_qa,nq_conflicts,folder", help="quality sets ('' for none)")
    ap.add_argument("--skip-variant-speed", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    result: dict[str, Any] = {"benchmark": "ingest"}
    if args.variants:
        from bench import embed_variants

        runtimes = tuple(args.variant_runtimes.split(","))
        result["variants"] = {}
        if not args.skip_variant_speed:
            result["variants"]["speed"] = embed_variants.speed(args.variant_chunks, args.reps, runtimes)
        if args.variant_sets:
            result["variants"]["quality"] = embed_variants.quality(runtimes, tuple(args.variant_sets.split(",")))
    if not args.skip_throughput:
        result["throughput"] = throughput(args.n, [int(b) for b in args.batch_sizes.split(",")], args.reps, args.int8)
    if not args.skip_cold:
        result["cold"] = cold(args.cold_chunks, args.cold_embed, max(args.reps, 3), not args.skip_ask)
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                         "loadavg_1m_at_end": os.getloadavg()[0]}
    result["unix_time"] = time.time()
    _print(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
