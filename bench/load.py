"""Benchmark: ``slimrag serve`` under concurrent search and chat load (issue 12's load figure).

``python -m bench.load`` builds a small index (``--files`` text files of seeded sentences), starts
``slimrag serve`` on it as a subprocess on 127.0.0.1 (an ephemeral port), and drives it from this
process for ``--duration`` seconds (and at most ``--max-requests`` requests) with:

- ``--search-clients`` (50) clients, each posting ``/v1/search`` queries back to back;
- ``--chat-clients`` (8) clients, each streaming ``/v1/chat/completions`` back to back;
- one prober, a process of its own, sending ``GET /healthz`` every 100 ms: the liveness a load
  balancer sees (the paced model backend below is a process of its own too, so the load
  generator's event loop only measures the server).

Then it stops the server, prints p50/p99/max latency per endpoint (for chats: time to the first
token and to ``[DONE]``), the count of 5xx answers and of failed requests, and writes
``bench/results/load.json``. Everything stays on 127.0.0.1 and stops by itself.

The language model (``--llm``): by default a paced OpenAI-compatible backend started here, which
streams ``--tokens`` (64) tokens at ``--token-ms`` (20 ms) each, as a GPU server such as vLLM
would: the server's own work (retrieval, prompts, relaying) is real, the model is not on this CPU.
``--llm URL`` uses another backend; ``--llm local`` the embedded SmolLM2 (on a CPU, 8 concurrent
chats then dominate the machine: expect slow chats, which is the point of the test for searches).

The acceptance (issue 12, part 5): ``/healthz`` within 1 s (its max) and no 5xx, under 50 search
clients and 8 chat streams.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

RESULTS = Path(__file__).resolve().parent / "results" / "load.json"
ANIMALS = ("otter heron badger lynx walrus gecko falcon marmot ibis tapir quokka narwhal bison "
           "pelican ocelot").split()
PLACES = ("the river delta, the pine forest, the salt marsh, the high desert, the coral reef, the tundra, "
          "the old harbour, the limestone caves").split(", ")
FOODS = "clams, beetles, berries, mice, kelp, seeds, crabs, fish, roots, moss".split(", ")


def corpus(root: Path, files: int, seed: int = 7) -> Path:
    """``files`` small text files of seeded sentences about animals, places and foods."""
    rng = random.Random(seed)
    for i in range(files):
        animal = ANIMALS[i % len(ANIMALS)]
        lines = [f"The {animal} of note {i} lives in {rng.choice(PLACES)} and eats {rng.choice(FOODS)}."
                 for _ in range(rng.randint(4, 12))]
        (root / f"{animal}-{i:04d}.txt").write_text(" ".join(lines) + "\n", encoding="utf-8")
    return root


class _Paced(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat backend streaming ``tokens`` words, ``delay_s`` apart."""

    protocol_version = "HTTP/1.1"
    tokens, delay_s = 64, 0.02

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        payload = json.dumps({"object": "list", "data": [{"id": "paced", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        n = min(self.tokens, int(body.get("max_tokens") or self.tokens))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def send(obj: Any) -> None:
            data = f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        head = {"id": "x", "object": "chat.completion.chunk", "model": "paced"}
        try:
            for i in range(n):
                time.sleep(self.delay_s)
                send({**head, "choices": [{"index": 0, "delta": {"content": f"word{i} "}, "finish_reason": None}]})
            send({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
            send({**head, "choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": n}})
            send("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            return  # the client left: stop generating


def percentiles(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "p50_s": None, "p99_s": None, "max_s": None}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"n": len(values), "p50_s": round(statistics.median(ordered), 4), "p99_s": round(p99, 4),
            "max_s": round(ordered[-1], 4)}


async def drive(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """The load itself; returns latencies and failure counts."""
    import httpx

    lat: dict[str, list[float]] = {"search": [], "chat_ttft": [], "chat_total": []}
    fails: dict[str, int] = {"5xx": 0, "other_status": 0, "transport": 0, "stream_error": 0}
    statuses: dict[str, int] = {}
    deadline = time.monotonic() + args.duration
    budget = [args.max_requests]
    rng = random.Random(1)

    def more() -> bool:
        budget[0] -= 1
        return budget[0] >= 0 and time.monotonic() < deadline

    def count(status: int) -> None:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
        if status >= 500:
            fails["5xx"] += 1
        elif status != 200:
            fails["other_status"] += 1

    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def searcher() -> None:
            while more():
                q = f"what does the {rng.choice(ANIMALS)} eat in {rng.choice(PLACES)}?"
                t = time.perf_counter()
                try:
                    r = await client.post("/v1/search", json={"query": q, "k": 5})
                except httpx.HTTPError:
                    fails["transport"] += 1
                    continue
                lat["search"].append(time.perf_counter() - t)
                count(r.status_code)

        async def chatter() -> None:
            while more():
                q = f"Where does the {rng.choice(ANIMALS)} live and what does it eat?"
                body = {"messages": [{"role": "user", "content": q}], "stream": True, "max_tokens": args.tokens}
                t = time.perf_counter()
                first = None
                try:
                    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                        count(r.status_code)
                        last = ""
                        async for line in r.aiter_lines():
                            if line.startswith("data:"):
                                first = first or time.perf_counter()
                                last = line[5:].strip()
                        if r.status_code == 200 and last != "[DONE]":
                            fails["stream_error"] += 1
                except httpx.HTTPError:
                    fails["transport"] += 1
                    continue
                if first is not None:
                    lat["chat_ttft"].append(first - t)
                lat["chat_total"].append(time.perf_counter() - t)

        start = time.monotonic()
        await asyncio.gather(*(searcher() for _ in range(args.search_clients)),
                             *(chatter() for _ in range(args.chat_clients)))
        elapsed = time.monotonic() - start
    return {"elapsed_s": round(elapsed, 2), "latency": {k: percentiles(v) for k, v in lat.items()},
            "failures": fails, "statuses": statuses}


def probe(url: str, duration: float) -> None:
    """The ``--role probe`` process: ``GET /healthz`` every 100 ms for ``duration`` seconds; prints
    the latencies (JSON) and the statuses. A process of its own, so that the load generator's
    event loop and the GIL it shares with the client threads never delay (or excuse) a probe."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    lat, statuses, failed = [], {}, 0
    end = time.monotonic() + duration
    while time.monotonic() < end:
        t = time.perf_counter()
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
        try:
            conn.request("GET", "/healthz")
            status = conn.getresponse().status
            lat.append(time.perf_counter() - t)
            statuses[str(status)] = statuses.get(str(status), 0) + 1
        except OSError:
            failed += 1
        finally:
            conn.close()
        time.sleep(0.1)
    print(json.dumps({"latency": lat, "statuses": statuses, "failed": failed}))


def backend(tokens: int, token_ms: float) -> None:
    """The ``--role backend`` process: the paced model server; prints its URL, serves until killed."""
    _Paced.tokens, _Paced.delay_s = tokens, token_ms / 1000
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Paced)
    server.daemon_threads = True
    print(f"http://127.0.0.1:{server.server_address[1]}/v1", flush=True)
    server.serve_forever()


def role(*argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "bench.load", *argv], stdout=subprocess.PIPE, text=True)


def serve(index: Path, llm: str) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-c", "from slimrag.cli import main; main()", "serve", str(index), "--port", "0"]
    if llm != "local":
        cmd += ["--llm", llm]
    return spawn_server(cmd)


def spawn_server(cmd: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """Start a ``slimrag serve`` command and wait until its stderr names its URL; the rest of its
    stderr is drained on a thread so the server never blocks on a full pipe."""
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    for line in proc.stderr:
        if m := re.search(r"(http://127\.0\.0\.1:\d+)", line):
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # type: ignore[union-attr]
            return proc, m.group(1)
    raise SystemExit(f"slimrag serve did not start (exit {proc.wait()})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of load (default 30)")
    ap.add_argument("--max-requests", type=int, default=20_000, help="requests at most (default 20,000)")
    ap.add_argument("--search-clients", type=int, default=50)
    ap.add_argument("--chat-clients", type=int, default=8)
    ap.add_argument("--files", type=int, default=150, help="text files in the index (default 150)")
    ap.add_argument("--llm", default="paced", help="'paced' (default), 'local', or an OpenAI-compatible URL")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per chat answer (default 64)")
    ap.add_argument("--token-ms", type=float, default=20.0, help="paced backend: ms per token (default 20)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--role", choices=("main", "backend", "probe"), default="main", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "backend":
        return backend(args.tokens, args.token_ms)
    if args.role == "probe":
        return probe(args.url, args.duration)
    if not 0 < args.duration <= 600:
        ap.error("--duration must be in (0, 600]")

    from slimrag.index.core import Index

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "docs").mkdir()
        docs = corpus(Path(tmp) / "docs", args.files)
        t = time.perf_counter()
        Index.build(docs, Path(tmp) / "load.slimrag").close()
        build_s = time.perf_counter() - t
        paced = role("--role", "backend", "--tokens", str(args.tokens), "--token-ms", str(args.token_ms)) \
            if args.llm == "paced" else None
        llm = paced.stdout.readline().strip() if paced is not None and paced.stdout else args.llm
        proc, url = serve(Path(tmp) / "load.slimrag", llm)
        try:
            prober = role("--role", "probe", "--url", url, "--duration", str(args.duration))
            result = asyncio.run(drive(url, args))
            probed = json.loads(prober.communicate(timeout=60)[0])
        finally:
            proc.terminate()
            proc.wait(30)
            if paced is not None:
                paced.terminate()
                paced.wait(10)
        result["latency"] = {"healthz": percentiles(probed["latency"]), **result["latency"]}
        result["failures"]["transport"] += probed["failed"]
        for status, n in probed["statuses"].items():
            result["statuses"][status] = result["statuses"].get(status, 0) + n
            if int(status) >= 500:
                result["failures"]["5xx"] += n
    report = {"bench": "load", "machine": platform.machine(), "cpus": os.cpu_count(),
              "loadavg_1m": round(os.getloadavg()[0], 2), "index_files": args.files, "build_s": round(build_s, 1),
              "llm": args.llm, "tokens": args.tokens, "token_ms": args.token_ms,
              "search_clients": args.search_clients, "chat_clients": args.chat_clients, **result}
    print(f"\n{args.search_clients} search clients + {args.chat_clients} chat streams for {result['elapsed_s']} s "
          f"against slimrag serve ({args.files} files, llm={args.llm}); load average {report['loadavg_1m']}")
    print(f"{'endpoint':<12}{'n':>7}{'p50 s':>10}{'p99 s':>10}{'max s':>10}")
    for name, p in result["latency"].items():
        cells = [f"{p[k]:>10.3f}" if p[k] is not None else f"{'-':>10}" for k in ("p50_s", "p99_s", "max_s")]
        print(f"{name:<12}{p['n']:>7}{''.join(cells)}")
    print(f"5xx: {result['failures']['5xx']}  other failures: "
          f"{ {k: v for k, v in result['failures'].items() if k != '5xx'} }  statuses: {result['statuses']}")
    healthz_max = result["latency"]["healthz"]["max_s"]
    ok = result["failures"]["5xx"] == 0 and healthz_max is not None and healthz_max < 1.0
    print(f"acceptance (healthz max < 1 s, no 5xx): {'PASS' if ok else 'FAIL'}")
    report["acceptance_pass"] = ok
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
