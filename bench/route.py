"""Routing side by side (issue 31): round robin, today's approximate tree, and KV events + passages.

    .venv/bin/python -m bench.route [--requests 30] [--direct 10]

(it plans the questions first, then takes ``/tmp/slimrag-timing.lock`` for the measured runs only.)

One run, one machine, three `slimrag serve` replicas on 127.0.0.1 over the disfl_qa flat index
(``bench/data/disfl_qa.slimrag``, see `bench.qa_workload`), the embedded model, ``--kv-events`` on.
For each policy the replicas start afresh (their own ``$SLIMRAG_HOME``, its ``models`` linked to
the real one, so no KV survives from one policy to the next):

- **rr**: the client sends request i to replica i mod 3 itself (no router hop);
- **approx**: ``create_router_app`` without an index (today's router: SGLang's approximate tree);
- **events**: ``create_router_app(index=...)``: exact views from the replicas' events, passages
  retrieved by the router, prefill saved against load, the plan passed on.

Workload: ``--requests`` questions through the policy (``--concurrency`` 2 clients, one per core)
and, at the same time, ``--direct`` questions sent straight to replica 0 by a second client (state a
router cannot guess from what it sent). Questions follow a Zipf(``--zipf-s`` 1.2) popularity over
``--passages`` (40) disfl_qa passages (3% of the corpus's 1,204 documents take every retrieval),
each passage's questions without repeats (`distinct_zipf`: the same text twice would credit a router
that keys on text for what users rarely do);
each chat asks for ``k`` 4 passages, a ``free`` answer (the grounded default prefills evidence
sentences, not passages) of ``--max-tokens`` 8, streamed, so TTFT is the first content byte.

Reported per policy (router client only): prompt tokens reused (``cached_tokens``), TTFT p50/p90,
requests/s, and how often the chosen replica held the longest real cached prefix of the request's
passages at send time, among the requests for which the replicas differ (every replica holds the
system segment soon, which would make ties of most choices). "Real" is read from the bench's own mirror of every replica's tree (its own
`EventStream` per replica, checked equal to the trees in tests/test_kv_events.py) and the
replicas' own planner replayed on it (`KVView.plan`). Beside them, the direct client's own: its
prompt tokens reused on replica 0 and its TTFT p50/p90 (what the routed chats' placement costs the
clients that do not come through the router).

Faults (``--faults``, a fourth run with the events policy): replica 0 publishes nothing (started
without ``--kv-events``; routed by its approximate tree), replica 2 is killed (SIGKILL) a third of
the way in and restarted 3 s later, and five batches of replica 1's events are dropped at the
router. Reported: how long after the kill the router dropped its view of the dead replica and left
it out (the health interval is ``--health-interval`` 1 s), the attempts sent to it (each failed over;
no request is lost, or the run would stop), how long after the restart its view was exact again,
the replayed gap, and whether the router's views equal the mirror's at the end.

Fleet (``--fleet 16,64``): a discrete-event simulation of 16 and 64 replicas with the costs
measured here (TTFT = a + b × uncached tokens; decode time per request), each replica a simulated
knowledge tree (``--sim-budget`` tokens), one request at a time (a slimrag replica admits one
prefill at a time), Poisson arrivals at ``--sim-load`` of the fleet's uncached capacity, the same
three policies with the router's real code (`choose`, `choose_planned`, `KVView`).

Bound: the share of the router's chats' prompt tokens that *one* replica of unlimited memory would
reuse had it served every chat in order (`bench.route_sim.reuse_bound`, estimated tokens; also with
the direct chats served first): no router over several replicas reuses more, so it says how far
apart the policies can be on this workload at all.

Sweep: ``--policies rr,approx,events,events:0,events:0.3`` adds the events policy with other
``spread_share`` values (`slimrag.route.kv_policy`), each on fresh replicas, in the same run.

Repeats: a policy named twice runs twice (labelled ``events``, ``events#2``), so
``--policies events,approx,approx,events,rr`` interleaves them ABBA, against the drift of the
machine's load; each events part is compared with the approximate-tree part of the same rank, and
the report gives every pair's ratios and their medians. Each part records the 1-minute load
average (first, mean, max, last; sampled every 2 s): other work shares the cores outside the lock.

Cache regime: ``--kv-budget MIB`` gives each replica ``serve --kv-budget`` (that much passage KV,
in memory only). Unbounded (the default: 1 GiB in memory, 2 GiB on disk) every replica holds
everything it sees, so all of them end up holding the hot passages and routing cannot multiply
the fleet's cache; a budget below the hot set (the segments some later chat reuses) is the
regime where it can. The bound then also gives the reuse of one replica at that budget and of one
with the three replicas' memory (references, see `reuse_bound`), with the working and hot sets.
Each part reports the tokens every replica's tree held at its end.

Reuse: ``--reuse blend --recompute POLICY`` runs every replica with ``serve --reuse blend``: a
passage's entry (its KV right after the system segment) is placed wherever the passage stands
(`slimrag.llm.kv.blend`), so what a replica can save is every entry it holds of a chat's passages,
not only the cached path in front; the router reads the mode from each replica's ``/healthz``
(`slimrag.route.kv_view.KVView.reusable`), and so does the bench's mirror for "chose the longest".
The bounds stay exact reuse's (one replica of unlimited memory reusing every cached path).

Start deadline: each replica has ``--start-timeout`` (180 s, the model load on a loaded machine
included) to answer ``/healthz`` and the in-process router 30 s; one that exits or misses it stops
the bench with `StartError`, naming it and the end of its ``serve.log``. Replicas run unbuffered
under ``-X faulthandler``, and one that misses its deadline is stopped with SIGABRT first, so its
log ends with every thread's stack (where a silent start hangs).

Writes ``bench/results/route.json`` (``--out``) and prints a table. The machine has 2 cores shared by three
replicas, the router and the clients: absolute times are slow; compare within the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

from bench.qa_workload import INDEX, passages_and_questions, zipf
from bench.route_sim import reuse_bound, simulate_fleet, working_set
from slimrag.api.schemas import ChatRequest
from slimrag.files import slimrag_home
from slimrag.llm.kv.config import EXACT, REUSE_MODES
from slimrag.route.events import EventStream
from slimrag.route.planner import RoutePlan, RoutePlanner
from slimrag.route.policy import RouterConfig

RESULTS = Path(__file__).parent / "results" / "route.json"
#: KV bytes per token of the embedded model (SmolLM2-135M, float32: 2 × 30 layers × 3 heads × 64 × 4;
#: a replica's tree held 6,773,760 bytes for 147 tokens), to turn ``--kv-budget`` MiB into tokens.
KV_BYTES_PER_TOKEN = 46080
TIMEOUT = 300.0
#: Seconds a replica (model load included) or the in-process router may take to answer; ``--start-timeout``.
START_TIMEOUT = 180.0


def distinct_zipf(n: int, passages: int, s: float, seed: int) -> list[str]:
    """``n`` questions whose passages follow `bench.qa_workload.zipf`, each passage's questions taken
    in a shuffled order without repeats until they run out (then again): users rarely send the same
    text twice, and a router that keys on text must not be credited for repeats of it."""
    import random

    _, by_passage = passages_and_questions()
    rng = random.Random(seed)
    left: dict[int, list[str]] = {}
    out = []
    for q in zipf(n, passages, s, seed):
        if not left.get(q.passage):
            left[q.passage] = rng.sample([x.question for x in by_passage[q.passage]], len(by_passage[q.passage]))
        out.append(left[q.passage].pop())
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class StartError(RuntimeError):
    """A replica, or the router, that did not come up: the bench stops with this message."""


def log_tail(path: Path, lines: int = 8) -> str:
    """The last ``lines`` lines of a log file ("(empty)" or "(none)" when there is nothing)."""
    if not path.exists():
        return "(none)"
    tail = path.read_text(errors="replace").strip().splitlines()[-lines:]
    return "\n".join("    " + line for line in tail) or "(empty)"


class Replica:
    """A `slimrag serve` process with its own ``$SLIMRAG_HOME`` (fresh KV, shared models); its
    output goes to ``serve.log`` there, shown when it fails to start."""

    def __init__(self, home: Path, events: bool = True, kv_budget: int | None = None,
                 reuse: tuple[str, ...] = ()) -> None:
        self.home, self.events, self.kv_budget, self.reuse = home, events, kv_budget, reuse
        self.port, self.ev_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = home / "serve.log"
        self.proc: subprocess.Popen[bytes] | None = None
        home.mkdir(parents=True, exist_ok=True)
        if not (home / "models").exists():
            (home / "models").symlink_to(slimrag_home() / "models")

    def start(self, index: Path = INDEX) -> None:
        # -X faulthandler: a replica stopped with SIGABRT at its start deadline writes every
        # thread's stack to its log (`wait`); unbuffered, so the log shows how far it got
        cmd = [sys.executable, "-X", "faulthandler", "-m", "slimrag", "serve", str(index), "--port", str(self.port),
               "--workers", "2", "--search-workers", "1"]
        if self.events:
            cmd += ["--kv-events", f"tcp://127.0.0.1:{self.ev_port}"]
        if self.kv_budget is not None:
            cmd += ["--kv-budget", str(self.kv_budget)]
        cmd += list(self.reuse)
        env = {**os.environ, "SLIMRAG_HOME": str(self.home), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
               "PYTHONUNBUFFERED": "1"}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)

    def wait(self, timeout: float = START_TIMEOUT) -> None:
        """Until its ``/healthz`` answers 200; `StartError` (the replica killed, its log's tail in
        the message) when it exits first or ``timeout`` seconds pass."""
        assert self.proc is not None, "start() first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (code := self.proc.poll()) is not None:
                raise StartError(f"replica {self.url} exited with status {code} before it answered /healthz; "
                                 f"the end of {self.log}:\n{log_tail(self.log)}")
            try:
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        self.proc.send_signal(signal.SIGABRT)  # faulthandler writes its threads' stacks to the log
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.kill()
        raise StartError(f"replica {self.url} did not answer /healthz within {timeout:g}s (stopped with SIGABRT: "
                         f"its threads' stacks are in its log; raise --start-timeout on a loaded machine); "
                         f"the end of {self.log}:\n{log_tail(self.log, 60)}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


@contextmanager
def replicas(root: Path, events: tuple[bool, ...] = (True, True, True),
             timeout: float = START_TIMEOUT, kv_budget: int | None = None,
             reuse: tuple[str, ...] = ()) -> Iterator[list[Replica]]:
    """Replicas started together (each with ``serve --kv-budget kv_budget`` when given, and the
    ``serve`` flags ``reuse``: ``--reuse blend --recompute ...``), each given ``timeout`` seconds
    from its start to answer; all killed on the way out (and when one fails to start)."""
    reps = [Replica(root / f"r{i}", e, kv_budget, reuse) for i, e in enumerate(events)]
    try:
        for r in reps:
            r.start()
        deadline = time.monotonic() + timeout
        for r in reps:
            r.wait(max(1.0, deadline - time.monotonic()))
        yield reps
    finally:
        for r in reps:
            r.kill()


@contextmanager
def serving(app: Any, timeout: float = 30.0) -> Iterator[str]:
    """``app`` under uvicorn in a thread on a free 127.0.0.1 port; `StartError` when it has not
    started within ``timeout`` seconds (or its thread ended: uvicorn logs why)."""
    import socket

    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            thread.join(10)
            sock.close()
            raise StartError(f"the router did not start within {timeout:g}s" if thread.is_alive()
                             else "the router's server stopped before it started (its log above says why)")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


class Mirror:
    """The bench's own view of every replica's tree, from their events, on a loop thread."""

    def __init__(self, reps: list[Replica], reuse: str = EXACT) -> None:
        self.reuse = reuse
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.streams: list[EventStream | None] = [None] * len(reps)
        self.tasks: list[Any] = []
        for i, r in enumerate(reps):
            if r.events:
                self.watch(i, r)

    def watch(self, i: int, r: Replica) -> None:
        async def start() -> None:
            stream = EventStream(f"tcp://127.0.0.1:{r.ev_port}", f"tcp://127.0.0.1:{r.ev_port + 1}")
            self.streams[i] = stream
            self.tasks.append(asyncio.get_running_loop().create_task(stream.run()))

        asyncio.run_coroutine_threadsafe(start(), self.loop).result()

    def cached(self, plan: RoutePlan) -> list[int]:
        async def read() -> list[int]:
            return [s.view.reusable(plan.keys, self.reuse) if s is not None else 0 for s in self.streams]

        return asyncio.run_coroutine_threadsafe(read(), self.loop).result()

    def held(self, i: int) -> dict[Any, Any]:
        async def read() -> dict[Any, Any]:
            s = self.streams[i]
            return s.view.held() if s is not None else {}

        return asyncio.run_coroutine_threadsafe(read(), self.loop).result()

    def held_tokens(self) -> list[int]:
        """Tokens each replica's tree holds now (0 for one that publishes nothing)."""
        return [sum(tokens for _, tokens in self.held(i).values()) for i in range(len(self.streams))]

    def close(self) -> None:
        async def stop() -> None:
            for t in self.tasks:
                t.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def chat_body(question: str, args: argparse.Namespace) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": question}], "k": args.k, "max_tokens": args.max_tokens,
            "answer": "free", "stream": True, "stream_options": {"include_usage": True}}


def ask(client: httpx.Client, url: str, question: str, args: argparse.Namespace) -> dict[str, Any]:
    """One streamed chat: TTFT (first content), usage, the replica that answered."""
    t0 = time.perf_counter()
    ttft, usage, replica = None, None, None
    with client.stream("POST", url + "/v1/chat/completions", json=chat_body(question, args)) as r:
        r.raise_for_status()
        replica = r.headers.get("x-slimrag-replica", url)
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            if ttft is None and any(c["delta"].get("content") for c in chunk.get("choices", [])):
                ttft = time.perf_counter() - t0
            usage = chunk.get("usage") or usage
    end = time.perf_counter() - t0
    u = usage or {}
    return {"ttft": ttft if ttft is not None else end, "total": end, "replica": replica,
            "prompt": u.get("prompt_tokens", 0), "cached": u.get("prompt_tokens_details", {}).get("cached_tokens", 0)}


def run_policy(policy: str, reps: list[Replica], plans: dict[str, RoutePlan | None], questions: list[str],
               direct: list[str], args: argparse.Namespace, faults: bool = False) -> dict[str, Any]:
    """The workload through ``policy`` over running ``reps``; per-request records and summary."""
    from slimrag.route.app import create_router_app

    mirror = Mirror(reps, args.reuse)
    time.sleep(1.0)  # the mirror's first replays
    urls = [r.url for r in reps]
    kind, _, spread = policy.partition(":")  # "events:X": the events policy with spread_share X
    config = RouterConfig(health_interval_s=args.health_interval,
                          spread_share=float(spread) if spread else args.spread_share)
    app = None if kind == "rr" else create_router_app(urls, config, index=str(INDEX) if kind == "events" else None)
    records: list[dict[str, Any]] = []
    fault_log: dict[str, Any] = {}
    lock = threading.Lock()
    with ExitStack() as stack:
        front = stack.enter_context(serving(app)) if app is not None else None
        router = app.state.router if app is not None else None
        if router is not None:  # wait until the router follows every publishing replica
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not all(
                    r.exact() for r, rep in zip(router.replicas, reps, strict=True) if rep.events):
                time.sleep(0.1)
        client = stack.enter_context(httpx.Client(timeout=TIMEOUT))
        t_start = time.perf_counter()

        def one(i: int, question: str) -> None:
            plan = plans.get(question)
            before = mirror.cached(plan) if plan is not None else None
            url = urls[i % len(urls)] if front is None else front
            sent = time.monotonic()
            rec = ask(client, url, question, args)
            rec.update(i=i, sent=sent, before=before, chosen=urls.index(rec["replica"]))
            with lock:
                records.append(rec)

        def direct_client() -> list[dict[str, Any]]:
            out = []
            for q in direct:
                out.append(ask(client, urls[0], q, args))
            return out

        sampler = LoadSampler()
        with ThreadPoolExecutor(args.concurrency + 1) as pool:
            side = pool.submit(direct_client)
            futures = []
            for i, q in enumerate(questions):
                if faults and i == len(questions) // 3:
                    fault_log = inject(reps, router, mirror, args.start_timeout)  # its thread adds the timings to it
                futures.append(pool.submit(one, i, q))
                while sum(not f.done() for f in futures) >= args.concurrency:
                    time.sleep(0.01)
            for f in futures:
                f.result()
            direct_records = side.result()
        wall = time.perf_counter() - t_start
        load = sampler.stop()
        if faults:
            fault_log.update(settle(reps, router, mirror, records, fault_log, args))
        time.sleep(0.5)  # the last insertions' events
        held = mirror.held_tokens()
    mirror.close()
    return (summarize(policy, records, direct_records, wall) | {"load_avg": load, "held_tokens_at_end": held}
            | ({"faults": fault_log} if faults else {}))


class LoadSampler:
    """The machine's 1-minute load average every 2 s while a part runs (other agents' work shares
    the 2 cores outside the timing lock, which moves a part's TTFT): first, mean and max."""

    def __init__(self) -> None:
        self.samples = [os.getloadavg()[0]]
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.done.wait(2.0):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> dict[str, float]:
        self.done.set()
        self.thread.join(5)
        self.samples.append(os.getloadavg()[0])
        return {"start": round(self.samples[0], 2), "mean": round(statistics.mean(self.samples), 2),
                "max": round(max(self.samples), 2), "end": round(self.samples[-1], 2)}


def inject(reps: list[Replica], router: Any, mirror: Mirror, start_timeout: float) -> dict[str, Any]:
    """Kill replica 2 (restarted 3 s later, in a thread) and drop 5 of replica 1's event batches."""
    router.replicas[1].events.drop_next(5)
    out: dict[str, Any] = {"gaps_before": router.replicas[1].events.counts.gaps}
    killed = out["killed_at"] = time.monotonic()
    reps[2].kill()

    def watch() -> None:
        dead = router.replicas[2]
        while dead.exact() and time.monotonic() - killed < 30:  # its view is dropped ...
            time.sleep(0.02)
        out["view_dropped_s"] = round(time.monotonic() - killed, 3)
        while dead.healthy() and time.monotonic() - killed < 30:  # ... and it is left out
            time.sleep(0.02)
        out["left_out_s"] = round(time.monotonic() - killed, 3)
        time.sleep(max(0.0, killed + 3.0 - time.monotonic()))
        reps[2].start()
        out["started_at"] = time.monotonic()
        try:
            reps[2].wait(start_timeout)
        except StartError as exc:  # raised again by settle, in the bench's thread
            out["error"] = exc
            return
        out["listening_s"] = round(time.monotonic() - out["started_at"], 3)
        while not (dead.exact() and dead.healthy()) and time.monotonic() - out["started_at"] < 60:
            time.sleep(0.05)
        out["exact_again_s"] = round(time.monotonic() - out["started_at"], 3)

    out["thread"] = threading.Thread(target=watch, daemon=True)
    out["thread"].start()
    return out


def settle(reps: list[Replica], router: Any, mirror: Mirror, records: list[dict[str, Any]],
           log: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The fault run's outcome (module header)."""
    log.pop("thread").join(90 + args.start_timeout)
    if "error" in log:
        raise log["error"]
    time.sleep(1.0)
    text = router.metrics.render_all(router.replicas)
    dead = router.replicas[2].url
    attempts = sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith("slimrag_router_upstream_total") and dead in line and 'status="error"' in line)
    views_equal = {i: router.replicas[i].events.view.held() == mirror.held(i) for i in (1, 2)}
    s1 = router.replicas[1].events.counts
    return {k: v for k, v in log.items() if k.endswith("_s")} | {
        "attempts_to_dead_replica": attempts, "requests_lost": 0,  # any failed request would have raised
        "replica1_gaps_replayed": s1.gaps - log["gaps_before"], "replica1_holes": s1.holes,
        "views_equal_mirror_at_end": views_equal, "replica0_publishes": False,
        "replica0_answered": sum(r["chosen"] == 0 for r in records),
        "routed_by_kv": sum(float(x.split()[-1]) for x in text.splitlines()
                            if x.startswith("slimrag_router_routed_total") and 'reason="kv' in x)}


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def longest_share(records: list[dict[str, Any]]) -> dict[str, Any]:
    """How often the chosen replica held the longest real prefix, where the replicas differed."""
    judged = [r for r in records if r["before"] is not None and max(r["before"]) > min(r["before"])]
    best = sum(r["before"][r["chosen"]] == max(r["before"]) for r in judged)
    return {"chose_longest": f"{best}/{len(judged)}", "chose_longest_share": round(best / len(judged), 3) if judged else None}


def direct_ttft(direct: list[dict[str, Any]]) -> dict[str, float | None]:
    """TTFT p50/p90 of the chats the direct client sent to replica 0 (None when it sent none): what
    the routed chats' placement costs the clients that do not come through the router."""
    ttfts = [r["ttft"] for r in direct]
    return {"direct_ttft_p50_s": round(statistics.median(ttfts), 3) if ttfts else None,
            "direct_ttft_p90_s": round(pct(ttfts, 0.9), 3) if ttfts else None}


def summarize(policy: str, records: list[dict[str, Any]], direct: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    ttfts = [r["ttft"] for r in records]
    return {"policy": policy, "requests": len(records), "prompt_tokens": sum(r["prompt"] for r in records),
            "cached_tokens": sum(r["cached"] for r in records),
            "ttft_p50_s": round(statistics.median(ttfts), 3), "ttft_p90_s": round(pct(ttfts, 0.9), 3),
            "req_per_s": round(len(records) / wall, 3), "wall_s": round(wall, 1),
            **longest_share(records),
            "direct_requests": len(direct), "direct_cached_tokens": sum(r["cached"] for r in direct),
            **direct_ttft(direct),
            "per_replica": [sum(r["chosen"] == i for r in records) for i in range(3)],
            "records": [{k: v for k, v in r.items() if k != "replica"} for r in records]}


@contextmanager
def timing_lock(path: str = "/tmp/slimrag-timing.lock") -> Iterator[None]:
    """The machine's shared timing lock, held for the measured part only (planning is not timed)."""
    import fcntl

    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def calibrate(root: Path, plans: dict[str, RoutePlan | None], args: argparse.Namespace) -> dict[str, float]:
    """Costs for the fleet simulation, on one idle replica: a cold and a warm TTFT per question."""
    qs = [q for q, p in plans.items() if p is not None][: args.calibrate]
    cold, warm = [], []
    with replicas(root, (True,), args.start_timeout) as reps, httpx.Client(timeout=TIMEOUT) as client:
        for q in qs:
            cold.append(ask(client, reps[0].url, q, args))
            warm.append(ask(client, reps[0].url, q, args))
    # TTFT = a + b × uncached tokens, through the cold and warm means; decode = total − TTFT
    uc = statistics.mean(r["prompt"] - r["cached"] for r in cold)
    uw = statistics.mean(r["prompt"] - r["cached"] for r in warm)
    tc, tw = statistics.mean(r["ttft"] for r in cold), statistics.mean(r["ttft"] for r in warm)
    b = (tc - tw) / max(1.0, uc - uw)
    decode = statistics.mean(r["total"] - r["ttft"] for r in cold + warm)
    return {"a_s": round(max(0.0, tw - b * uw), 4), "b_s_per_token": round(b, 6), "decode_s": round(decode, 4),
            "cold_ttft_s": round(tc, 3), "warm_ttft_s": round(tw, 3), "cold_uncached": round(uc), "warm_uncached": round(uw)}


def plan_all(questions: list[str], args: argparse.Namespace) -> dict[str, RoutePlan | None]:
    """Each distinct question's plan, as the router makes it; the planner's index and embedder are
    closed before anything is timed."""
    planner = RoutePlanner(INDEX)
    try:
        return {q: planner.plan(ChatRequest.model_validate(chat_body(q, args) | {"stream": False}))
                for q in dict.fromkeys(questions)}
    finally:
        planner.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--direct", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--passages", type=int, default=40)
    ap.add_argument("--zipf-s", type=float, default=1.2)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--health-interval", type=float, default=1.0)
    ap.add_argument("--start-timeout", type=float, default=START_TIMEOUT,
                    help="seconds each replica may take to answer /healthz before the bench stops")
    ap.add_argument("--policies", default="rr,approx,events",
                    help="comma-separated; events:X runs the events policy with spread_share X (a sweep)")
    ap.add_argument("--spread-share", type=float, default=RouterConfig().spread_share,
                    help="RouterConfig.spread_share of the events policy (slimrag.route.kv_policy)")
    ap.add_argument("--kv-budget", type=int, metavar="MIB",
                    help="each replica's KV budget (serve --kv-budget; memory only, no disk tier); default: unbounded")
    ap.add_argument("--reuse", choices=REUSE_MODES, default=EXACT,
                    help="the replicas' serve --reuse; blend: a passage's KV placed wherever it stands")
    ap.add_argument("--recompute", help="the replicas' serve --recompute (with --reuse blend)")
    ap.add_argument("--faults", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--calibrate", type=int, default=3)
    ap.add_argument("--fleet", default="16,64")
    ap.add_argument("--sim-budget", type=int, default=3000, help="KV tokens a simulated replica holds")
    ap.add_argument("--sim-load", type=float, default=0.8)
    ap.add_argument("--sim-requests", type=int, default=1000, help="Zipf arrivals drawn for the fleet (40 per replica used)")
    ap.add_argument("--sim-passages", type=int, default=200, help="passages the fleet's Zipf draws from")
    ap.add_argument("--sim-arrivals", type=int, default=40, help="arrivals a simulated replica")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--fleet-only", action="store_true", help="redo the fleet simulation from --out's costs")
    args = ap.parse_args()

    if args.fleet_only:  # the simulation again, with the costs and runs of an earlier output
        out = json.loads(args.out.read_text())
        for run in [*out["policies"].values(), *([out["faults"]] if "faults" in out else [])]:
            run.update(longest_share(run["records"]))
        sim_questions = distinct_zipf(args.sim_requests, args.sim_passages, args.zipf_s, args.seed + 2)
        plans = plan_all(sim_questions, args)
        out["fleet"] = {n: simulate_fleet(int(n), sim_questions, plans, out["costs"], args) for n in args.fleet.split(",")}
        args.out.write_text(json.dumps(out, indent=1, default=str))
        print(report(out))
        return
    questions = distinct_zipf(args.requests, args.passages, args.zipf_s, args.seed)
    direct = distinct_zipf(args.direct, args.passages, args.zipf_s, args.seed + 1)
    sim_questions = distinct_zipf(args.sim_requests, args.sim_passages, args.zipf_s, args.seed + 2) if args.fleet else []
    t = time.perf_counter()
    plans = plan_all(questions + direct + sim_questions, args)
    print(f"planned {len(plans)} questions in {time.perf_counter() - t:.1f}s (before the timing lock)", file=sys.stderr)
    out: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "policies": {}}
    with timing_lock(), tempfile.TemporaryDirectory(prefix="route-bench-") as tmp:
        root = Path(tmp)
        for n, (label, policy) in enumerate(labelled(args.policies.split(","))):
            with replicas(root / f"{policy}-{n}", timeout=args.start_timeout, kv_budget=args.kv_budget,
                          reuse=reuse_flags(args)) as reps:
                out["policies"][label] = run_policy(policy, reps, plans, questions, direct, args) | {"label": label}
            print(table_row(out["policies"][label]), file=sys.stderr)
            save(args.out, out)  # a later failure (a replica that does not restart) keeps what was measured
        if args.faults:
            with replicas(root / "faults", (False, True, True), args.start_timeout, args.kv_budget,
                          reuse_flags(args)) as reps:
                out["faults"] = run_policy("events", reps, plans, questions, direct, args, faults=True)
            print("faults:", out["faults"]["faults"], file=sys.stderr)
        if args.fleet:
            out["costs"] = calibrate(root / "calibrate", plans, args)
    out["bound"] = bounds(plans, questions, direct, args.kv_budget)
    if args.fleet:
        out["fleet"] = {n: simulate_fleet(int(n), sim_questions, plans, out["costs"], args)
                        for n in args.fleet.split(",")}
    save(args.out, out)
    print(report(out))


def reuse_flags(args: argparse.Namespace) -> tuple[str, ...]:
    """The ``serve`` flags of ``--reuse`` and ``--recompute`` (none for exact reuse, serve's default)."""
    if args.reuse == EXACT:
        return ()
    return ("--reuse", args.reuse, *(("--recompute", args.recompute) if args.recompute else ()))


def labelled(policies: list[str]) -> list[tuple[str, str]]:
    """(label, policy) per part: a policy's repeats (an ABBA order such as
    ``events,approx,approx,events``) are labelled ``events``, ``events#2``, ..."""
    seen: dict[str, int] = {}
    out = []
    for p in policies:
        seen[p] = seen.get(p, 0) + 1
        out.append((p if seen[p] == 1 else f"{p}#{seen[p]}", p))
    return out


def bounds(plans: dict[str, RoutePlan | None], questions: list[str], direct: list[str],
           kv_budget: int | None) -> dict[str, Any]:
    """`reuse_bound` of the router's chats (module header), the workload's working set, and with
    ``kv_budget`` (MiB per replica) the same for one replica of that budget and one of the three
    replicas' memory together (references, not bounds: `reuse_bound`)."""
    known = [p for q in questions if (p := plans[q]) is not None]
    warm = [p for q in direct if (p := plans[q]) is not None]
    out: dict[str, Any] = {"one_replica_reused_share": round(reuse_bound([], known), 3),
                           "with_direct_first_reused_share": round(reuse_bound(warm, known), 3),
                           **dict(zip(("working_set_tokens", "hot_set_tokens"), working_set(warm + known), strict=True))}
    if kv_budget is not None:
        tokens = (kv_budget << 20) // KV_BYTES_PER_TOKEN
        out |= {"budget_tokens": tokens, "budget_share_of_hot_set": round(tokens / out["hot_set_tokens"], 3),
                "one_replica_at_budget_reused_share": round(reuse_bound([], known, tokens), 3),
                "one_replica_of_three_budgets_reused_share": round(reuse_bound([], known, 3 * tokens), 3)}
    return out


def save(path: Path, out: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1, default=str))


def ratios(pol: dict[str, dict[str, Any]]) -> list[str]:
    """Events policies against the approximate tree: each repeat against the approximate tree's
    repeat of the same rank (an ABBA order pairs the first events part with the first approx part),
    then the medians of those ratios."""
    approx = [s for s in pol.values() if s["policy"] == "approx"]
    lines = []
    for kind in dict.fromkeys(s["policy"] for s in pol.values() if s["policy"].startswith("events")):
        runs = [s for s in pol.values() if s["policy"] == kind]
        pairs = [(e, a) for e, a in zip(runs, approx, strict=False)]
        got = [(e["cached_tokens"] / max(1, a["cached_tokens"]), e["ttft_p90_s"] / a["ttft_p90_s"],
                e["ttft_p50_s"] / a["ttft_p50_s"]) for e, a in pairs]
        for (e, a), (r, p90, p50) in zip(pairs, got, strict=True):
            lines.append(f"{e.get('label', kind)}/{a.get('label', 'approx')}: reused {r:.2f}x, p90 TTFT {p90:.2f}x, "
                         f"p50 {p50:.2f}x")
        if len(got) > 1:
            med = [statistics.median(x) for x in zip(*got, strict=True)]
            lines.append(f"{kind}/approx, median of {len(got)} pairs: reused {med[0]:.2f}x, p90 TTFT {med[1]:.2f}x, "
                         f"p50 {med[2]:.2f}x")
    return lines


def table_row(s: dict[str, Any]) -> str:
    def sec(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    direct = f"{sec(s.get('direct_ttft_p50_s'))}/{sec(s.get('direct_ttft_p90_s'))}"
    return (f"{s.get('label', s['policy']):<9} {s['cached_tokens']:>8}/{s['prompt_tokens']:<8} {s['ttft_p50_s']:>7.2f} "
            f"{s['ttft_p90_s']:>7.2f} {s['req_per_s']:>6.3f} {s['chose_longest']:>8} {s['direct_cached_tokens']:>8} "
            f"{direct:>11} {s['per_replica']} load {s.get('load_avg', {}).get('mean', '-')}")


def report(out: dict[str, Any]) -> str:
    lines = ["policy    reused/prompt tokens  p50 s   p90 s  req/s  longest  direct-reused  direct p50/p90 s  "
             "per-replica  load"]
    lines += [table_row(s) for s in out["policies"].values()]
    lines += ratios(out["policies"])
    if "bound" in out:
        b = out["bound"]
        lines.append(f"bound (one replica that served every chat, estimated tokens): reused share "
                     f"{b['one_replica_reused_share']}, {b['with_direct_first_reused_share']} with the direct chats first; "
                     f"working set {b['working_set_tokens']} tokens, of which reused (hot) {b['hot_set_tokens']}")
        if "budget_tokens" in b:
            lines.append(f"budget {b['budget_tokens']} tokens per replica ({b['budget_share_of_hot_set']} of the "
                         f"hot set): one replica at the budget {b['one_replica_at_budget_reused_share']}, one of "
                         f"three budgets {b['one_replica_of_three_budgets_reused_share']}")
    if "faults" in out:
        lines.append(f"faults: {out['faults']['faults']}")
    lines.append(f"costs: {out.get('costs')}")
    for n, rows in out.get("fleet", {}).items():
        for row in rows:
            lines.append(f"fleet {n:>3} {row['policy']:<7} reused {row['reused_share']:.3f}  p50 {row['ttft_p50_s']:.2f}"
                         f"  p90 {row['ttft_p90_s']:.2f}  req/s {row['req_per_s']:.2f}  longest {row['chose_longest_share']}")
    return "\n".join(lines)


if __name__ == "__main__":
    try:
        main()
    except StartError as exc:
        sys.exit(f"bench.route: {exc}")
