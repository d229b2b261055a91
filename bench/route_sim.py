"""The fleet part of ``bench.route``: 16 or 64 simulated replicas under the three routing policies.

Each replica is a simulated knowledge tree (`KVTree.simulated`, one byte per token, ``sim_budget``
tokens) serving one request at a time in arrival order: a request's TTFT is its wait plus
``a + b × uncached tokens`` and it then decodes for ``decode_s`` (costs measured by
``bench.route``'s calibration on a real replica). The replica plans each request's passage order
on its own tree (`slimrag.rag.plan.plan_passages`), matches and inserts as the engine does. The
routers are the real code: round robin; today's rule (`choose` over `PrefixTree`s of the chats'
text, inserted when a prefill ends); events + passages (`choose_planned` over `KVView`s that the
trees' own events keep, as the replicas' events would). Arrivals are Poisson at ``sim_load`` times
the fleet's capacity with nothing cached. The system segment is ``SYSTEM_TOKENS`` long (the
embedded model's default system prompt).

Blend reuse (``reuse="blend"``, as ``serve --reuse blend``; `slimrag.llm.kv.blend`): a replica
matches the exact prefix, then places every later passage whose entry (its node right under the
system segment) it holds, and computes the rest in context. Its tree keeps only the system
segment and entries. The recompute policy's own ``select`` counts the placed tokens computed again
(a policy that reads deviations is given zeros: the count is right, which tokens does not matter
here); those and the unplaced passages are the uncached tokens. A passage seen first costs its
entry's forward after the first token (``b × its tokens``, before the replica takes the next
request), as the engine computes it in ``store``; that forward's fixed cost and the deviation
policy's partial forward are not charged, so blend's figures here lean optimistic. Events + passages prices blend replicas with
`KVView.reusable` (``Replica.reuse``), as the router does for a replica whose ``/healthz`` says blend.
"""

from __future__ import annotations

import heapq
import random
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from slimrag.llm.kv import CacheConfig, KVTree, SegmentKV
from slimrag.llm.kv.blend import BlendReuse
from slimrag.llm.kv.config import BLEND, DEFAULT_RECOMPUTE, EXACT
from slimrag.llm.kv.recompute import RecomputePolicy, Span, parse_recompute
from slimrag.rag.plan import plan_passages
from slimrag.route.kv_policy import choose_planned
from slimrag.route.kv_view import KVView
from slimrag.route.planner import RoutePlan
from slimrag.route.policy import Replica, RouterConfig, choose
from slimrag.route.prefix_tree import PrefixTree

SYSTEM_TOKENS = 45
ROOT = "model|system"


@dataclass
class _Events:
    """What `Replica.exact` reads of an event stream: a view kept by the tree's own events."""

    view: KVView
    exact: bool = True


@dataclass
class _Job:
    arrival: float
    plan: RoutePlan
    key: str
    estimate: int
    order: tuple[str, ...] = ()
    cached: int = 0
    match: Any = None
    entries: Any = None  # blend: the entries placed
    unseen: tuple[str, ...] = ()  # blend: passages computed in context, whose entries it then stores


@dataclass
class _Server:
    tree: KVTree
    queue: deque[_Job] = field(default_factory=deque)
    busy: bool = False


def _store(tree: KVTree, plan: RoutePlan, order: tuple[str, ...], match: Any) -> None:
    """What the engine does after a prefill: insert the segments ``match`` lacked, release it."""
    tokens, done = dict(zip(plan.keys, plan.tokens, strict=True)), len(match.nodes)
    payloads = ([SegmentKV.simulated(SYSTEM_TOKENS)] if done == 0 else []) + [
        SegmentKV.simulated(tokens[key]) for key in order[max(0, done - 1):]]
    tree.insert(ROOT, order, payloads)
    tree.release(match)


def _place(tree: KVTree, plan: RoutePlan, job: _Job, policy: RecomputePolicy) -> None:
    """A blend replica's prefill of ``job`` (module header): its exact prefix and the entries it
    places, held in ``job`` until `_store_blend`; ``job.cached``: the tokens served and not recomputed."""
    tokens = dict(zip(plan.keys, plan.tokens, strict=True))
    job.match = tree.match(ROOT, job.order)
    first = max(0, len(job.match.nodes) - 1)  # the first passage past the exact prefix
    job.entries = tree.entries(ROOT, job.order[first:])
    held = set(job.entries.path)
    start, spans = SYSTEM_TOKENS + sum(tokens[k] for k in job.order[:first]), []
    for key in job.order[first:]:
        if key in held and start > SYSTEM_TOKENS:  # at the entry's own position it is exact
            spans.append(Span(start, tokens[key]))
        start += tokens[key]
    zeros = [0.0] * sum(sp.tokens for sp in spans) if policy.needs_deviation else None
    recomputed = len(policy.select(spans, zeros))
    job.unseen = tuple(k for k in job.order[first:] if k not in held)
    job.cached = job.match.tokens + sum(node.tokens for node in job.entries.nodes) - recomputed


def _store_blend(tree: KVTree, plan: RoutePlan, job: _Job) -> int:
    """What a blend replica stores after a prefill: a missing system segment and the entries of the
    passages it saw first; releases the lease. Returns the tokens of the new entries (computed after
    the first token)."""
    tokens = dict(zip(plan.keys, plan.tokens, strict=True))
    if not job.match.nodes:
        tree.insert(ROOT, [], [SegmentKV.simulated(SYSTEM_TOKENS)])
    for key in job.unseen:
        tree.insert(ROOT, [key], [SegmentKV.simulated(tokens[key])])
    tree.release(job.entries)
    tree.release(job.match)
    return sum(tokens[k] for k in job.unseen)


def run_sim(policy: str, n: int, arrivals: list[tuple[float, str, RoutePlan]], costs: dict[str, float],
            budget: int, config: RouterConfig | None = None, reuse: str = EXACT,
            recompute: str | None = None) -> dict[str, Any]:
    """One policy over ``n`` simulated replicas that reuse by ``reuse`` (``exact`` or ``blend``,
    with the ``recompute`` policy, default the engine's, as ``serve --reuse blend`` has it); the
    figures `bench.route` reports."""
    a, b, decode = costs["a_s"], costs["b_s_per_token"], costs["decode_s"]
    config = config or RouterConfig()
    blend = reuse == BLEND
    placing = parse_recompute(recompute or DEFAULT_RECOMPUTE)  # serve --reuse blend's own default
    servers = [_Server(KVTree.simulated(CacheConfig(device="cpu", host_bytes=budget))) for _ in range(n)]
    reps = [Replica(f"http://sim-{i}:1", PrefixTree(), reuse=reuse) for i in range(n)]
    peeks = [BlendReuse(s.tree, "cpu", recompute) for s in servers] if blend else []  # what each holds, for "chose the longest"
    if policy == "events":
        for s, r in zip(servers, reps, strict=True):
            view = KVView()
            s.tree.subscribe(view.apply)
            r.events = _Events(view)  # type: ignore[assignment]
    heap: list[tuple[float, int, str, int, _Job]] = []
    seq = 0
    ttfts: list[float] = []
    prompt = cached = longest = judged = arrived = turn = 0
    last = 0.0

    def push(t: float, kind: str, i: int, job: _Job) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, seq, kind, i, job))

    def start(i: int, now: float) -> None:
        s = servers[i]
        if s.busy or not s.queue:
            return
        job = s.queue.popleft()
        s.busy = True
        plan = plan_passages(job.plan.keys, s.tree, ROOT)
        job.order = plan.order
        if blend:
            _place(s.tree, job.plan, job, placing)
        else:
            job.match = s.tree.match(ROOT, job.order)
            job.cached = job.match.tokens
        total = SYSTEM_TOKENS + sum(job.plan.tokens)
        push(now + a + b * (total - job.cached), "prefilled", i, job)

    for t, question, plan in arrivals:
        push(t, "arrive", -1, _Job(t, plan, f"<user>{question}\n", 0))
    while heap:
        now, _, kind, i, job = heapq.heappop(heap)
        last = now
        if kind == "arrive":
            real = [peek.cached_tokens(ROOT, job.plan.keys) for peek in peeks] if blend else \
                [plan_passages(job.plan.keys, s.tree, ROOT).cached_tokens for s in servers]
            if policy == "rr":
                i, arrived = arrived % n, arrived + 1
            elif policy == "approx":
                i = reps.index(choose(reps, job.key, config)[0])
            else:
                replica, _, job.estimate = choose_planned(reps, job.plan, job.key, config, turn)
                turn += 1
                i = reps.index(replica)
            if max(real) > min(real):
                judged += 1
                longest += real[i] == max(real)
            reps[i].in_flight += 1
            reps[i].pending_prefill += job.estimate
            servers[i].queue.append(job)
            start(i, now)
        elif kind == "prefilled":
            entry_s = 0.0
            if blend:
                entry_s = b * _store_blend(servers[i].tree, job.plan, job)
            else:
                _store(servers[i].tree, job.plan, job.order, job.match)
            reps[i].pending_prefill -= job.estimate
            reps[i].tree.insert(job.key)
            total = SYSTEM_TOKENS + sum(job.plan.tokens)
            ttfts.append(now - job.arrival)
            prompt += total
            cached += job.cached
            push(now + decode + entry_s, "done", i, job)
        else:
            reps[i].in_flight -= 1
            servers[i].busy = False
            start(i, now)
    first = arrivals[0][0]
    ttfts.sort()
    return {"policy": policy, "replicas": n, "reuse": reuse, "requests": len(ttfts), "reused_share": round(cached / prompt, 3),
            "ttft_p50_s": round(statistics.median(ttfts), 3), "ttft_p90_s": round(ttfts[int(0.9 * (len(ttfts) - 1))], 3),
            "req_per_s": round(len(ttfts) / (last - first), 3),
            "chose_longest_share": round(longest / judged, 3) if judged else None}


def reuse_bound(warm: list[RoutePlan], plans: list[RoutePlan], budget: int = 1 << 40) -> float:
    """The share of ``plans``' prompt tokens (in order) that one replica would reuse after it served
    ``warm`` and every earlier plan, its tree holding ``budget`` tokens (default: unlimited). Unlimited,
    no router over several replicas can reuse more, since each of them holds a part of what this
    one holds (estimated tokens). With a budget it is a reference, not a bound: one replica of the
    fleet's memory (``replicas × budget``) is about what routing that splits the passages among
    the replicas could hold; one replica's own budget, about what every replica would get were
    each sent every passage."""
    return _in_order(warm, plans, budget)[0]


def working_set(plans: list[RoutePlan]) -> tuple[int, int]:
    """(tokens of every distinct segment that ``plans`` put in a tree: the system segment and each
    passage under its parent, in the order one replica plans them; tokens of those a later plan
    reused, the hot set), as one replica of unlimited memory that served them in order holds them."""
    _, held, hot = _in_order([], plans, 1 << 40)
    return held, hot


def _in_order(warm: list[RoutePlan], plans: list[RoutePlan], budget: int) -> tuple[float, int, int]:
    """(the reused share of ``plans``' prompt tokens, the tokens held at the end, the tokens of the
    distinct segments reused) of one simulated tree of ``budget`` tokens serving ``warm`` and then
    ``plans`` in order."""
    tree = KVTree.simulated(CacheConfig(device="cpu", host_bytes=budget))
    prompt = cached = 0
    hot: dict[int, int] = {}
    for n, plan in enumerate([*warm, *plans]):
        order = plan_passages(plan.keys, tree, ROOT).order
        match = tree.match(ROOT, order)
        if n >= len(warm):
            prompt += SYSTEM_TOKENS + sum(plan.tokens)
            cached += match.tokens
        hot.update((id(node), node.tokens) for node in match.nodes)
        _store(tree, plan, order, match)
    return cached / max(1, prompt), sum(tier.used for tier in tree.stats().tiers), sum(hot.values())


def simulate_fleet(n: int, questions: list[str], plans: dict[str, RoutePlan | None], costs: dict[str, float],
                   args: Any) -> list[dict[str, Any]]:
    """The three policies over ``n`` simulated replicas (module header)."""
    rng = random.Random(args.seed)
    usable = [q for q in questions if plans.get(q) is not None]
    arrivals_n = getattr(args, "sim_arrivals", 40) * n  # 40 a replica by default
    usable = (usable * (1 + arrivals_n // max(1, len(usable))))[:arrivals_n]
    mean_tokens = statistics.mean(SYSTEM_TOKENS + sum(plans[q].tokens) for q in usable)  # type: ignore[union-attr]
    service = costs["a_s"] + costs["b_s_per_token"] * mean_tokens + costs["decode_s"]
    rate = args.sim_load * n / service
    t, arrivals = 0.0, []
    for q in usable:
        t += rng.expovariate(rate)
        plan = plans[q]
        assert plan is not None
        arrivals.append((t, q, plan))
    reuse, recompute = getattr(args, "reuse", EXACT), getattr(args, "recompute", None)
    return [run_sim(policy, n, arrivals, costs, args.sim_budget, reuse=reuse, recompute=recompute)
            for policy in ("rr", "approx", "events")]
