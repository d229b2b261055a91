"""The local embedder's graph variants: speed on 256-token chunks against the CPU's float32 peak,
and retrieval quality on questions against float32. Run by ``python -m bench.ingest --variants``.

Speed
    ``--variant-chunks`` (64) chunks of exactly 256 tokens ([CLS] + 254 + [SEP]), cut from
    nq_conflicts passages that are not in the quality sample below (real Wikipedia text), embedded
    by `LocalEmbedder.embed` on each runtime (batch 16, the ONNX runtimes' `batch_cap`), best of
    ``--reps`` interleaved rounds. all-MiniLM-L6-v2 on a 256-token chunk is 6.04 GFLOP (per layer
    and token: Q, K, V, O 4x384x384, FFN 2x384x1536, attention 2x256x384 multiply-adds; 6 layers),
    so chunks/s x 6.04 is the model's GFLOP/s, shown against the float32 peak of the same CPU
    (the best of numpy and torch on the FFN's GEMM, 16x256 tokens x 384 @ 384 x 1536) and against
    its bfloat16 peak (torch on the same GEMM in bfloat16: oneDNN, on AMX tiles where the CPU has
    them). Int8 and bfloat16 rows can exceed 100% of the float32 peak; that is the point of them.

Quality (questions as queries, vector search by brute force over one vector per passage)
    - ``disfl_qa``: all 1,204 passages, a seeded sample of 600 answerable questions (their gold
      answer is in their passage).
    - ``nq_conflicts``: the 1,500 passages of `bench.qa_sets` (same seed), their 1,500 questions.
    - ``folder``: the eight files of the test corpus (``tests/conftest.py``) and their twelve
      questions with their gold file (`bench.retrieval.TEST_QUESTIONS`). The only folder-of-files
      set with gold answers in bench/; tiny, a sanity row.
    Per set and runtime: gold passage in the top 5, and recall@10 of the runtime's top 10 against
    fp32's top 10 (same questions; top 8 on the folder, which has 8 files), and the cosine of each passage vector to its fp32 vector.
    Passages longer than 256 tokens are truncated by the model, as a chunk would be; the index's
    chunker is left out so that only the embedder differs between rows.

Embeddings are cached in ``bench/data/variant-emb/`` keyed by runtime, set and a hash of the
texts; a cached file is checked against a fresh embedding of its first 16 texts before use.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from bench.datasets import DATA

CACHE = DATA / "variant-emb"
#: multiply-adds x 2 of all-MiniLM-L6-v2 on one 256-token chunk (module header)
GFLOP_PER_CHUNK = 2 * 6 * 256 * (4 * 384 * 384 + 2 * 384 * 1536 + 2 * 256 * 384) / 1e9
RUNTIMES = ("onnx", "onnx-fused", "onnx-int8", "onnx-int8-fused", "onnx-int8-block", "torch-bf16")
SETS = ("disfl_qa", "nq_conflicts", "folder")


def quality_sets() -> dict[str, tuple[list[str], list[str], list[int]]]:
    """set -> (passages, questions, gold passage index per question); see the module header."""
    from bench.qa_sets import NQ_PASSAGES, nq_conflicts_rows
    from bench.qa_workload import normalize, passages_and_questions
    from bench.retrieval import TEST_QUESTIONS

    texts, by = passages_and_questions()
    items = [(qa.question, pid) for pid, qas in by.items() for qa in qas if normalize(qa.answer) in normalize(qa.context)]
    items = random.Random(0).sample(items, 600)
    rows = random.Random(0).sample(nq_conflicts_rows(), NQ_PASSAGES)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from conftest import DOCS

    names = list(DOCS)
    return {"disfl_qa": (texts, [q for q, _ in items], [g for _, g in items]),
            "nq_conflicts": ([r["context"] for r in rows], [r["question"] for r in rows], list(range(len(rows)))),
            "folder": ([DOCS[n] for n in names], [q for q, _ in TEST_QUESTIONS],
                       [names.index(g) for _, g in TEST_QUESTIONS])}


def chunks_256(n: int) -> list[str]:
    """``n`` texts of exactly 256 tokens from nq_conflicts passages outside the quality sample."""
    from bench.qa_sets import NQ_PASSAGES, nq_conflicts_rows
    from slimrag.embed.local import default_model_dir
    from slimrag.embed.onnx import load_tokenizer

    rows = nq_conflicts_rows()
    used = {r["context"] for r in random.Random(0).sample(rows, NQ_PASSAGES)}
    free = [r["context"] for r in rows if r["context"] not in used]
    tok = load_tokenizer(default_model_dir())
    tok.no_truncation()
    tok.no_padding()
    ids: list[int] = []
    for e in tok.encode_batch(random.Random(11).sample(free, 8 * n)):
        ids += e.ids[1:-1]
    windows = [tok.decode(ids[i * 254:(i + 1) * 254]) for i in range(len(ids) // 254)]
    # decoding and re-encoding a window does not always give 254 tokens back: keep those that do
    out = [w for w, e in zip(windows, tok.encode_batch(windows), strict=True) if len(e.ids) == 256][:n]
    if len(out) < n:
        raise RuntimeError(f"only {len(out)} windows of 256 tokens, {n} asked")
    return out


def gemm_peak(seconds: float = 2.0) -> dict[str, float]:
    """GFLOP/s of the FFN's GEMM (4096 x 384 @ 384 x 1536): float32 with numpy and with torch
    ("numpy", "torch"), and bfloat16 with torch ("torch-bf16": oneDNN, AMX where the CPU has it)."""
    out: dict[str, float] = {}
    a = np.random.default_rng(0).random((4096, 384), dtype=np.float32)
    b = np.random.default_rng(1).random((384, 1536), dtype=np.float32)
    fns: dict[str, Any] = {"numpy": lambda: a @ b}
    try:
        import torch

        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        ha, hb = ta.to(torch.bfloat16), tb.to(torch.bfloat16)
        fns["torch"] = lambda: ta @ tb
        fns["torch-bf16"] = lambda: ha @ hb
    except ImportError:
        print("torch not installed: GEMM peak from numpy only", file=sys.stderr)
    for name, fn in fns.items():
        for _ in range(3):
            fn()
        t, k = time.perf_counter(), 0
        while time.perf_counter() - t < seconds:
            fn()
            k += 1
        out[name] = 2 * 4096 * 384 * 1536 * k / (time.perf_counter() - t) / 1e9
    return out


def speed(n: int, reps: int, runtimes: tuple[str, ...] = RUNTIMES) -> dict[str, Any]:
    """Chunks/s, tokens/s and share of the float32 GEMM peak per runtime (module header)."""
    from slimrag.embed.local import LocalEmbedder

    texts = chunks_256(n)
    emb = {r: LocalEmbedder(runtime=r) for r in runtimes}
    lens = emb[runtimes[0]].lengths(texts)
    assert int(lens.min()) == int(lens.max()) == 256, (lens.min(), lens.max())
    for e in emb.values():
        e.embed(texts[:16])  # load (and build the variant) outside the clock
    peak = gemm_peak()
    best: dict[str, float] = defaultdict(lambda: float("inf"))
    for _ in range(reps):
        for r, e in emb.items():
            t = time.perf_counter()
            e.embed(texts, batch_size=16)
            best[r] = min(best[r], time.perf_counter() - t)
            print(f"  {r}: {time.perf_counter() - t:.1f}s", file=sys.stderr, flush=True)
    top = max(v for k, v in peak.items() if k != "torch-bf16")
    rows = {r: {"seconds": s, "chunks_per_s": n / s, "tokens_per_s": 256 * n / s,
                "gflop_per_s": GFLOP_PER_CHUNK * n / s, "share_of_fp32_peak": GFLOP_PER_CHUNK * n / s / top,
                "share_of_bf16_peak": GFLOP_PER_CHUNK * n / s / peak.get("torch-bf16", float("nan"))}
            for r, s in best.items()}
    return {"chunks": n, "tokens_per_chunk": 256, "gflop_per_chunk": GFLOP_PER_CHUNK, "gemm_fp32_gflops": peak,
            "runtimes": rows}


def _embedded(runtime: str, name: str, part: str, texts: list[str], emb: Any) -> np.ndarray:
    """Embeddings of ``texts``, from the cache when it holds them (checked on 16 texts)."""
    h = hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:16]
    path = CACHE / f"{runtime}-{name}-{part}-{h}.npy"
    if path.is_file():
        cached = np.load(path)
        fresh = emb.embed(texts[:16])
        if cached.shape == (len(texts), fresh.shape[1]) and (cached[:16] * fresh).sum(1).min() >= 1 - 1e-5:
            return cached
        print(f"stale cache {path}: re-embedding", file=sys.stderr)
    t = time.perf_counter()
    x = emb.embed(texts)
    print(f"  embedded {runtime} {name} {part}: {len(texts)} texts in {time.perf_counter() - t:.1f}s",
          file=sys.stderr, flush=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, x)
    tmp.rename(path)
    return x


def quality(runtimes: tuple[str, ...] = RUNTIMES, sets: tuple[str, ...] = SETS, ref: str = "onnx") -> dict[str, Any]:
    """Gold top-5 per set and runtime, recall@10 and cosine against ``ref`` (module header)."""
    from slimrag.embed.local import LocalEmbedder

    data = quality_sets()
    out: dict[str, Any] = {}
    for name in sets:
        passages, questions, gold = data[name]
        g = np.array(gold)
        vecs = {}
        for r in dict.fromkeys((ref, *runtimes)):
            e = LocalEmbedder(runtime=r)
            vecs[r] = (_embedded(r, name, "c", passages, e), _embedded(r, name, "q", questions, e))
        top_ref = np.argsort(-(vecs[ref][1] @ vecs[ref][0].T), axis=1)[:, :10]
        out[name] = {"passages": len(passages), "questions": len(questions), "runtimes": {}}
        for r, (c, q) in vecs.items():
            top = np.argsort(-(q @ c.T), axis=1)[:, :10]
            cos = (c * vecs[ref][0]).sum(1)
            out[name]["runtimes"][r] = {
                "gold_top5": float(np.mean([g[i] in top[i, :5] for i in range(len(g))])),
                "recall10_vs_fp32": float(np.mean([len(set(a) & set(b)) / len(b) for a, b in
                                                   zip(top.tolist(), top_ref.tolist(), strict=True)])),
                "cosine_median": float(np.median(cos)), "cosine_min": float(cos.min())}
    return out


def table(result: dict[str, Any]) -> str:
    """The per-runtime table: speed columns, then gold top-5 per set and recall@10 vs fp32."""
    sp, q = result.get("speed", {}), result.get("quality", {})
    runtimes = list(sp.get("runtimes", {})) or (list(next(iter(q.values()))["runtimes"]) if q else [])
    head = f"{'runtime':<16} {'chunks/s':>8} {'tokens/s':>8} {'% fp32':>6} {'% bf16':>6}"
    for name in q:
        head += f" {name + ' top5':>17} {'r@10':>5}"
    lines = [head]
    for r in runtimes:
        s = sp.get("runtimes", {}).get(r)
        line = f"{r:<16} " + (f"{s['chunks_per_s']:8.1f} {s['tokens_per_s']:8.0f} {100 * s['share_of_fp32_peak']:5.0f}%"
                              f" {100 * s.get('share_of_bf16_peak', float('nan')):5.1f}%"
                              if s else f"{'':8} {'':8} {'':6} {'':6}")
        for name in q:
            m = q[name]["runtimes"].get(r)
            line += f" {m['gold_top5']:17.3f} {m['recall10_vs_fp32']:5.3f}" if m else f" {'':17} {'':5}"
        lines.append(line)
    if sp:
        peak = ", ".join(f"{k} {v:.0f}" for k, v in sp["gemm_fp32_gflops"].items())
        lines.append(f"GEMM peak (4096x384 @ 384x1536), GFLOP/s: {peak}; "
                     f"{sp['gflop_per_chunk']:.2f} GFLOP per 256-token chunk")
    return "\n".join(lines)


if __name__ == "__main__":
    print(json.dumps(quality(("onnx",), ("folder",)), indent=1))
