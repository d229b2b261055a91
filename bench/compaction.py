"""Slim compaction: incremental update (`slimrag.index.store.slim.update`) against a full rebuild.

    python -m bench.compaction                         # real MiniLM vectors cached in bench/data
    python -m bench.compaction --data synthetic --n 3000
    python -m bench.compaction --row-ms 25             # skip measuring the embedding cost
    python -m bench.compaction --data synthetic --n 100000 --sections 1 --fracs 0.01   # at scale

The compaction rows of issue 10's benchmark (`bench/ingest.py` holds the embedding ones). Each
data set is a matrix of unit-norm vectors and query vectors; ``recompute`` returns stored rows, so
the cost of re-embedding is *modelled*: rows recomputed x the measured per-row embedding time of
the local MiniLM on this machine (``row ms``, measured on the corpus's own texts where it has
them, else on disfl_qa contexts). Printed as tables and written as JSON (``--out``).

1. **Cost after adding 1% and 10% new rows** to a slim generation of the other rows: compute
   seconds (walk, prune, build), rows recomputed, and modelled wall = compute + recomputed x row
   ms, for the incremental update and for a full rebuild (which recomputes every old row);
   their ratios: ``compute_ratio`` (wall seconds of compute), ``cpu_ratio`` (CPU seconds: the
   steadier figure on a shared machine), ``wall_ratio`` (with the modelled re-embedding).
2. **Recall after 5 rounds** of add / remove / compact (each round adds and removes ``--churn``
   of the starting size), recall@10 at the default `SearchConfig` against exact search over the
   live rows, next to a fresh build of the same live rows; per ``UpdateConfig.rerank`` (with
   ``recompute_share=1``, so rerank is not lowered).
3. **Drift**: the drift ratio (mean PQ direction error of new rows over the build's) for 20% new
   rows from the same distribution, half from another data set, and all from another, and
   recall@10 (queries: half the set's, half new rows) with the kept codebooks against retrained
   ones: the measurement behind ``UpdateConfig.drift_threshold``.

Data sets (``--data``): ``disfl`` (1,204 disfl_qa contexts, questions as queries),
``pydocs`` (the first 3,000 python-doc paragraphs, self-queries; needs the cached embeddings
``bench.index --corpus pydocs --limit 3000`` makes), ``synthetic`` (`bench.vectors.text_like`).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.vectors import text_like
from slimrag.config import SearchConfig
from slimrag.index.store.slim import SlimConfig, SlimSearcher, build_slim
from slimrag.index.store.slim.artifacts import SlimArtifacts
from slimrag.index.store.slim.update import UpdateConfig, update_slim

os.environ.setdefault("HF_HUB_OFFLINE", "1")
K = 10
#: data sets whose vectors play "new rows from another distribution" in section 3
OTHER = {"disfl": ("pydocs", "synthetic"), "pydocs": ("disfl", "synthetic"), "synthetic": ("disfl",)}


def load(name: str, n: int, nq: int) -> tuple[np.ndarray, np.ndarray, list[str] | None, str]:
    """(vectors, query vectors, texts or None, description)."""
    if name == "synthetic":
        x, q = text_like(n, nq, seed=0)
        return x, q, None, f"synthetic text_like n={n}"
    from bench.index import _disfl, _pydocs

    corpus = _disfl(None, nq, 0) if name == "disfl" else _pydocs(3000, nq, 0)
    return (np.ascontiguousarray(corpus.vectors, np.float32), np.ascontiguousarray(corpus.query_vectors, np.float32),
            corpus.texts, f"{corpus.name}: {len(corpus.texts)} real MiniLM vectors; {corpus.note}")


def row_ms(texts: list[str] | None, sample: int = 64) -> tuple[float, str]:
    """Milliseconds per row of the local MiniLM embedding ``sample`` corpus texts (batched as the
    slim index's recompute is), after one warm-up batch."""
    from slimrag.embed.local import LocalEmbedder

    if texts is None:
        from bench.datasets import disfl_qa

        texts, src = sorted({x.context for x in disfl_qa()}), "disfl_qa contexts"
    else:
        src = "the corpus's own texts"
    pick = [texts[i] for i in np.random.default_rng(1).choice(len(texts), min(sample, len(texts)), replace=False)]
    emb = LocalEmbedder()
    emb.embed(pick[:8])
    t = time.perf_counter()
    emb.embed(pick, batch_size=16)
    return 1000 * (time.perf_counter() - t) / len(pick), f"MiniLM on {len(pick)} of {src}"


def recall(art: SlimArtifacts, x: np.ndarray, q: np.ndarray) -> float:
    """recall@10 of the default search against exact search over ``x`` (row i of art is x[i])."""
    searcher = SlimSearcher(art, lambda rows: x[rows], SlimConfig(cache_bytes=0), SearchConfig())
    res = searcher.search_batch(q, K)
    truth = np.argsort(-(q @ x.T), axis=1, kind="stable")[:, :K]
    return float(np.mean([len(set(r.rows.tolist()) & set(t.tolist())) / K for r, t in zip(res, truth, strict=True)]))


def cost(x: np.ndarray, ms: float, frac: float, upd: UpdateConfig) -> dict[str, Any]:
    """Section 1: a generation of the first rows of a seeded permutation, then ``frac`` more."""
    perm = np.random.default_rng(2).permutation(len(x))
    n_new = max(1, int(round(frac * len(x) / (1 + frac))))
    old, new = perm[:-n_new], perm[-n_new:]
    art = build_slim(x[old])
    t, c = time.perf_counter(), time.process_time()
    up = update_slim(art, old, np.ones(len(old), bool), new, x[new], lambda rows: x[old[rows]], update=upd)
    inc_s, inc_cpu = time.perf_counter() - t, time.process_time() - c
    t, c = time.perf_counter(), time.process_time()
    build_slim(x[np.sort(perm)])
    full_s, full_cpu = time.perf_counter() - t, time.process_time() - c
    inc_wall = inc_s + up.stats.recomputed * ms / 1000
    full_wall = full_s + len(old) * ms / 1000
    return {"added": f"{frac:.0%}", "old_rows": len(old), "new_rows": n_new, "inc_compute_s": round(inc_s, 2),
            "inc_cpu_s": round(inc_cpu, 2), "inc_recomputed": up.stats.recomputed, "inc_wall_s": round(inc_wall, 1),
            "full_compute_s": round(full_s, 2), "full_cpu_s": round(full_cpu, 2), "full_recomputed": len(old),
            "full_wall_s": round(full_wall, 1), "compute_ratio": round(inc_s / full_s, 4),
            "cpu_ratio": round(inc_cpu / full_cpu, 4), "wall_ratio": round(inc_wall / full_wall, 3),
            "recompute_ratio": round(up.stats.recomputed / len(old), 3)}


def rounds(x: np.ndarray, q: np.ndarray, churn: float, upd: UpdateConfig, n_rounds: int = 5) -> dict[str, Any]:
    """Section 2: start from 80% of the rows, then per round add and remove ``churn`` of that."""
    rng = np.random.default_rng(3)
    perm = rng.permutation(len(x))
    start = int(0.8 * len(x))
    ids, reserve = perm[:start], list(perm[start:])
    art = build_slim(x[ids])
    step = max(1, int(churn * start))
    recomputed = 0
    for _ in range(n_rounds):
        add = np.array([reserve.pop() for _ in range(min(step, len(reserve)))], dtype=np.int64)
        live = np.ones(len(ids), bool)
        live[rng.choice(len(ids), step, replace=False)] = False
        cur = ids
        up = update_slim(art, cur, live, add, x[add], lambda rows, cur=cur: x[cur[rows]], update=upd)
        art, ids = up.artifacts, up.ids
        recomputed += up.stats.recomputed
    inc = recall(art, x[ids], q)
    fresh = recall(build_slim(x[ids]), x[ids], q)
    return {"rerank": upd.rerank, "live_rows": len(ids), "churn_per_round": step, "recomputed_total": recomputed,
            "recall_inc": round(inc, 4), "recall_fresh": round(fresh, 4), "gap": round(fresh - inc, 4)}


def drift(x: np.ndarray, q: np.ndarray, other: np.ndarray, name: str) -> list[dict[str, Any]]:
    """Section 3: 20% new rows from the same law, then from ``other``; kept vs retrained codebooks."""
    perm = np.random.default_rng(4).permutation(len(x))
    base = perm[: int(0.8 * len(x))]
    same = perm[int(0.8 * len(x)):]
    art = build_slim(x[base])
    out = []
    half = len(same) // 2
    mixed = np.concatenate([x[same[:half]], other[: len(same) - half]])
    for label, new in ((f"same distribution ({name})", x[same]), ("half other", mixed),
                       ("other distribution", other[: len(same)])):
        codes = art.pq.encode(new)
        ratio = float(art.pq.direction_error(new, codes).mean()) / float(art.pq_mse or 1.0)
        allx = np.concatenate([x[base], new])
        kept = update_slim(art, base, np.ones(len(base), bool), np.arange(len(x), len(x) + len(new)), new,
                           lambda rows: x[base[rows]], update=UpdateConfig(drift_threshold=1e9)).artifacts
        qs = np.concatenate([q[: len(q) // 2], new[np.random.default_rng(5).choice(len(new), len(q) // 2)]])
        out.append({"new_rows": label, "drift": round(ratio, 3), "recall_kept": round(recall(kept, allx, qs), 4),
                    "recall_retrained": round(recall(build_slim(allx), allx, qs), 4)})
    return out


def _table(rows: list[dict[str, Any]]) -> str:
    cols = list(rows[0])
    width = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    lines = [" ".join(c.rjust(width[c]) for c in cols)]
    lines += [" ".join(str(r[c]).rjust(width[c]) for c in cols) for r in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", choices=("disfl", "pydocs", "synthetic"), default="disfl")
    ap.add_argument("--n", type=int, default=3000, help="rows of the synthetic set")
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--row-ms", type=float, help="per-row embedding ms (default: measured here)")
    ap.add_argument("--churn", type=float, default=0.02, help="share added and removed per round")
    ap.add_argument("--reranks", default="0,2,4,8", help="UpdateConfig.rerank values for the rounds")
    ap.add_argument("--sections", default="1,2,3", help="which of the sections 1-3 to run (1 alone at scale)")
    ap.add_argument("--fracs", default="0.01,0.1", help="shares of new rows section 1 adds")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    sections = {int(s) for s in args.sections.split(",") if s}
    if not sections <= {1, 2, 3}:
        ap.error("--sections takes numbers from 1, 2, 3")
    x, q, texts, desc = load(args.data, args.n, args.queries)
    if args.row_ms is None:
        ms, how = row_ms(texts)
    else:
        ms, how = args.row_ms, "given (--row-ms)"
    print(f"data: {desc}\nrecompute cost modelled at {ms:.1f} ms/row ({how})\n")
    default = UpdateConfig()
    load_before = os.getloadavg()[0]
    costs, rr, dr = [], [], []
    if 1 in sections:
        costs = [cost(x, ms, float(f), default) for f in args.fracs.split(",") if f]
        print(f"1. compaction cost, UpdateConfig() = {default}\n{_table(costs)}\n")
    if 2 in sections:
        rr = [rounds(x, q, args.churn, UpdateConfig(rerank=int(r), recompute_share=1.0))
              for r in args.reranks.split(",")]
        rr.append({**rounds(x, q, args.churn, default), "rerank": f"default {default.rerank}/{default.recompute_share}"})
        print(f"2. recall@10 after 5 rounds of +{args.churn:.0%} / -{args.churn:.0%} / compact\n{_table(rr)}\n")
    for other_name in OTHER[args.data] if 3 in sections else ():
        other, _, _, other_desc = load(other_name, len(x), args.queries)
        print(f"3. drift, other distribution: {other_desc}")
        dr += [{"other": other_name, **row} for row in drift(x, q, other, args.data)]
        print(_table(dr[-3:]) + "\n")
    tag = "" if args.data != "synthetic" or args.n == 3000 else f"-{args.n}"
    out = args.out or Path(__file__).resolve().parent / "results" / f"compaction-{args.data}{tag}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"data": desc, "row_ms": ms, "row_ms_source": how, "update_config": str(default),
                               "load1_before_after": [load_before, os.getloadavg()[0]],
                               "cost": costs, "rounds": rr, "drift": dr}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
