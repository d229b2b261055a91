"""Benchmark: ``slimrag serve`` with decode batching off and on, at 1, 4 and 8 concurrent clients.

``python -m bench.serve_batch`` builds a small index (``--files`` text files of seeded sentences,
bench.load's corpus) and starts two servers on it on 127.0.0.1, each a process running what
``slimrag serve`` runs (``create_app`` with 8 chat workers, so eight chats run at once, served
by ``slimrag.api.listen``): one with decode width 1 (every stream decodes with its own one-token
forwards, taking turns through the model lock: the engine before batching), one with width 8
(the default: streams share decode steps). Both with ``OMP_NUM_THREADS=--threads`` (1), so the
comparison is not decided by torch's threads spinning against other processes on a shared
machine, and both without KV reuse (``cache=None``): with the knowledge tree, the planner orders
a question's passages by what earlier requests left cached, which depends on the timing of
concurrent requests, so the same question could get another prompt and another answer, and
answers could not be compared. (``slimrag serve --decode-width`` is the same knob on the CLI.) Then, for each client count, each server in turn
(the order alternates by level, so a change of load falls on both): ``clients`` clients each
stream ``--requests`` chat completions back to back (greedy, ``--tokens`` new tokens at most,
``--k`` passages, distinct questions). Prefill is not batched (one at a time, as before), so the
longer the answers against the prompts, the more batching shows. Per level and mode it reports:

- total completion tokens per second (all clients' tokens over the level's wall time),
- time to the first content chunk, p50 and max, as the client sees it,
- whether every question's answer is the same text in every run (both modes, every level).

Prints a table and writes ``bench/results/serve_batch.json``. The acceptance (issue 21): at 8
clients, batching on gives >= 2x the total tokens per second of batching off, answers identical.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.load import ANIMALS, PLACES, corpus, spawn_server

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

RESULTS = Path(__file__).resolve().parent / "results" / "serve_batch.json"
MODES = {"off": 1, "on": 8}


def questions(n: int) -> list[str]:
    """``n`` distinct questions about the corpus."""
    return [f"Where does the {ANIMALS[i % len(ANIMALS)]} live? Answer about {PLACES[(i // len(ANIMALS)) % len(PLACES)]}."
            for i in range(n)]


def server(index: str, width: int, stats: str) -> None:
    """The ``--role server`` process: ``slimrag serve``'s app over ``index`` with decode width
    ``width`` and no KV reuse; prints its URL on stderr and serves until terminated, keeping the
    batcher's steps and rows in the file ``stats``."""
    from slimrag.api.listen import bind, listen, run
    from slimrag.index.core import Index
    from slimrag.llm.engine.batcher import BatchConfig
    from slimrag.llm.local import LocalGenerator
    from slimrag.rag.pipeline import RAG
    from slimrag.serve.app import create_app, warm_up

    sock = bind("127.0.0.1", 0)
    with Index.open(index) as idx:
        gen = LocalGenerator(cache=None, batch=BatchConfig(width=width))
        rag = RAG(idx, gen)

        def report() -> None:  # uvicorn ends the process on SIGTERM itself, so keep the file current
            while True:
                counts = gen.batch_stats()
                part = Path(stats + ".part")  # replaced whole: a terminate mid-write leaves the last file
                part.write_text(json.dumps(counts and {"steps": counts.steps, "rows": counts.rows}))
                os.replace(part, stats)
                time.sleep(0.5)

        threading.Thread(target=report, daemon=True).start()
        warm_up(rag)
        app = create_app(rag, workers=8, warm=False)
        print(f"serving on http://127.0.0.1:{listen(sock)}", file=sys.stderr, flush=True)
        run(app, sock, "127.0.0.1", log_level="warning")


def start(index: Path, width: int, threads: int) -> tuple[subprocess.Popen[str], str]:
    """A server process (``--role server``) with decode width ``width``; returns it and its URL."""
    cmd = [sys.executable, "-m", "bench.serve_batch", "--role", "server", "--index", str(index),
           "--width", str(width), "--stats", str(index.parent / f"stats-{width}.json")]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    return spawn_server(cmd, env)


async def level(url: str, clients: int, asks: list[list[str]], tokens: int, k: int) -> dict[str, Any]:
    """``clients`` clients, client ``c`` streaming ``asks[c]`` one after another."""
    import httpx

    ttft: list[float] = []
    answers: dict[str, str] = {}
    completion = [0]

    async def client(http: httpx.AsyncClient, mine: list[str]) -> None:
        for q in mine:
            body = {"messages": [{"role": "user", "content": q}], "stream": True, "max_tokens": tokens,
                    "temperature": 0, "k": k, "stream_options": {"include_usage": True}}
            t, first, text = time.perf_counter(), None, []
            async with http.stream("POST", "/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    raise SystemExit(f"{url}: HTTP {r.status_code} for {q!r}: {(await r.aread())[:300]!r}")
                async for line in r.aiter_lines():
                    if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    if chunk.get("usage"):
                        completion[0] += int(chunk["usage"]["completion_tokens"])
                    for choice in chunk.get("choices", []):
                        piece = (choice.get("delta") or {}).get("content")
                        if piece:
                            first = first or time.perf_counter()
                            text.append(piece)
            if first is not None:
                ttft.append(first - t)
            answers[q] = "".join(text)

    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(http, asks[c]) for c in range(clients)))
        wall = time.perf_counter() - t0
    return {"clients": clients, "requests": sum(len(a) for a in asks[:clients]), "wall_s": round(wall, 2),
            "completion_tokens": completion[0], "tokens_per_s": round(completion[0] / wall, 2),
            "ttft_p50_s": round(statistics.median(ttft), 3) if ttft else None,
            "ttft_max_s": round(max(ttft), 3) if ttft else None, "answers": answers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", default="1,4,8", help="client counts (default 1,4,8)")
    ap.add_argument("--requests", type=int, default=2, help="chats per client per level (default 2)")
    ap.add_argument("--tokens", type=int, default=48, help="max new tokens per chat (default 48)")
    ap.add_argument("--files", type=int, default=40, help="text files in the index (default 40)")
    ap.add_argument("--k", type=int, default=4, help="passages per question (default 4, the API's)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each server (default 1)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--role", choices=("main", "server"), default="main", help=argparse.SUPPRESS)
    ap.add_argument("--index", help=argparse.SUPPRESS)
    ap.add_argument("--width", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--stats", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "server":
        return server(args.index, args.width, args.stats)
    counts = [int(c) for c in args.clients.split(",")]

    from slimrag.index.core import Index

    load_before = os.getloadavg()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "docs").mkdir()
        docs = corpus(Path(tmp) / "docs", args.files)
        Index.build(docs, Path(tmp) / "bench.slimrag").close()
        servers = {mode: start(Path(tmp) / "bench.slimrag", width, args.threads) for mode, width in MODES.items()}
        try:
            pool = questions(max(counts) * args.requests)
            for i, clients in enumerate(counts):
                asks = [pool[c * args.requests : (c + 1) * args.requests] for c in range(clients)]
                order = list(MODES) if i % 2 == 0 else list(reversed(MODES))
                for mode in order:
                    row = asyncio.run(level(servers[mode][1], clients, asks, args.tokens, args.k))
                    row["mode"], row["loadavg_1m"] = mode, round(os.getloadavg()[0], 2)
                    rows.append(row)
                    print(f"clients={clients} batching {mode}: {row['tokens_per_s']} tok/s, "
                          f"TTFT p50 {row['ttft_p50_s']} s (load {row['loadavg_1m']})", flush=True)
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(60)
        stats = {mode: json.loads(f.read_text()) if (f := Path(tmp) / f"stats-{width}.json").exists() else None
                 for mode, width in MODES.items()}
    # The same question must get the same answer in every run, whatever the mode or level.
    seen: dict[str, set[str]] = {}
    for row in rows:
        for q, a in row["answers"].items():
            seen.setdefault(q, set()).add(a)
    identical = all(len(a) == 1 for a in seen.values())
    differing = sorted(q for q, a in seen.items() if len(a) > 1)
    by = {(r["clients"], r["mode"]): r for r in rows}
    print(f"\nslimrag serve's app, no KV reuse, SmolLM2-135M float32, {args.threads} torch thread(s) per server, "
          f"{args.requests} chats x <= {args.tokens} tokens per client, k={args.k}; load average before "
          f"{load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}")
    print(f"{'clients':>7} | {'off tok/s':>9} {'on tok/s':>9} {'ratio':>6} | {'off TTFT p50':>12} "
          f"{'on TTFT p50':>12}")
    for c in counts:
        off, on = by[(c, "off")], by[(c, "on")]
        ratio = on["tokens_per_s"] / off["tokens_per_s"] if off["tokens_per_s"] else float("nan")
        print(f"{c:>7} | {off['tokens_per_s']:>9.2f} {on['tokens_per_s']:>9.2f} {ratio:>5.2f}x | "
              f"{off['ttft_p50_s']:>11.3f}s {on['ttft_p50_s']:>11.3f}s")
    on = stats.get("on")
    if on:
        print(f"batching on: {on['rows']} rows in {on['steps']} decode steps, {on['rows'] / max(on['steps'], 1):.2f} a step")
    print(f"identical answers in every run: {'yes' if identical else 'NO: ' + ', '.join(differing)}")
    top = max(counts)
    ratio8 = by[(top, "on")]["tokens_per_s"] / max(by[(top, "off")]["tokens_per_s"], 1e-9)
    ok = identical and ratio8 >= 2.0
    print(f"acceptance ({top} clients: on >= 2x off, identical answers): {'PASS' if ok else 'FAIL'}")
    report = {"bench": "serve_batch", "machine": platform.machine(), "cpus": os.cpu_count(),
              "loadavg_before": [round(x, 2) for x in load_before],
              "loadavg_after": [round(x, 2) for x in os.getloadavg()], "threads": args.threads,
              "requests_per_client": args.requests, "max_tokens": args.tokens, "k": args.k, "files": args.files,
              "modes": MODES, "identical_answers": identical, "differing_questions": differing,
              "ratio_at_max_clients": round(ratio8, 3), "acceptance_pass": ok, "batch_stats": stats,
              "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
