"""Routing by the passages a chat will use: prefill tokens saved against load (issue 31).

`slimrag.route.policy.choose` routes by conversation text and an approximate tree; this rule
routes by what each replica really holds. For a chat the router has planned
(`slimrag.route.planner`: its passages' cache keys and estimated tokens), each replica gets a cost
in prefill-token units, as NVIDIA Dynamo's KV router weighs overlap against queued work:

    cost = prefill_weight × (prompt tokens − tokens it holds of this prompt)
           + its pending prefill + decode_tokens × its requests in flight
           + unseen_weight × (prompt tokens × its unseen chats waiting + decode_tokens × its unseen chats)

Then, over the pool (healthy replicas not yet tried for the chat), as SGLang's cache-aware router
switches between affinity and its shortest queue:

1. *Imbalanced* (the in-flight counts differ by more than ``balance_abs_threshold`` and the
   largest exceeds ``balance_rel_threshold`` times the smallest, the same test and knobs as
   `choose`): only the least-loaded replicas are candidates; the cheapest of them answers
   (reason ``balance``).
2. Otherwise every replica whose cost is within ``spread_share`` of the prompt's tokens of the
   cheapest is a candidate: a saving that small (the system segment every replica soon holds, a
   few tokens of a passage) does not earn a replica a pile of requests. Among the candidates, the one with the fewest
   requests in flight (its unseen chats included) answers, and among equals the next in round-robin order (the router turns
   a counter per planned chat). So requests that save nothing, or the same everywhere, spread over
   the replicas instead of falling on the first of them (what the rule did before it spread: one
   replica of three never chosen, p90 TTFT 1.32x the approximate tree's in one run).

Reasons: ``kv`` when the answering replica holds the most of the chat (more than nothing),
``kv_load`` when another one answers (load or spreading outweighed the saving), ``balance`` as
in 1.

- *Tokens it holds*: with an exact view (`KVView`, fed by its KV events), the replica's own
  planner replayed over the view (`KVView.plan`): the system segment plus the longest cached
  path of the passages in the order the replica will put them; for a replica that reuses by blend
  (its ``/healthz`` says so), the system segment plus every passage entry it holds, in any order
  (`KVView.reusable`). A replica without events, or whose
  view has a hole, is scored by its approximate tree instead: the matched share of the routing text
  times the prompt's tokens. When no replica in the pool has an exact view, this rule is not used
  at all and `choose` decides exactly as before.
- *Prompt tokens*: the passages' estimated tokens plus the system segment's (its block size in any
  view; unknown, it counts the same for every replica and drops out).
- *Pending prefill*: the uncached tokens of chats routed there whose first byte has not come
  back (a slimrag replica sends its 200 with its first piece, so prefill is over by then).
- *Unseen chats*: load the router cannot see, from clients that talk to a replica directly. A
  slimrag replica reports the chats it is answering in its ``/healthz`` (``load``: in flight, and
  those waiting for their first piece); at each health check the router keeps what exceeds its own
  requests there (`Replica.report_load`). A waiting one is priced as a prefill of this prompt's
  size, nothing cached (a replica prefills one prompt at a time, so it goes first), and each one
  as a decoding request. A replica that reports nothing has none.

Knobs (`RouterConfig`)
    ``prefill_weight`` 1.0 (Dynamo's ``overlap_score_weight``): how much a token this request must
    prefill weighs against a token of work already queued. Higher chases cache hits onto busy
    replicas (lower TTFT for the hit, queueing for the rest); 0 routes by load alone.
    ``decode_tokens`` 64: the queued work one request in flight stands for beyond its prefill
    (its decoding), in prefill-token units. A CPU replica decodes a token in the time it prefills
    about 10-40 (one matrix-vector product per token vs a matrix-matrix product per ~64), so 64
    prices a short answer; raise it for long answers.
    ``spread_share`` 0.1: costs within this share of the prompt's tokens of the cheapest count as
    ties, spread by load and then round robin. 0.1 of a 4-passage prompt (~800 tokens) is 80 tokens:
    more than the system segment (45), less than one passage (~200), and about a request's fixed
    cost on a CPU replica (0.2 s, some 60 tokens of prefill). Relative, so that short passages
    still count: 0 spreads exact ties only (one replica then collects every chat that saves only
    the system segment there), 0.3 and up gives up single cached passages for balance.
    ``unseen_weight`` 1.0: how much the unseen chats weigh. The count is as old as the last health
    check (``health_interval_s``, 2 s by default; a CPU chat takes several): higher steers harder
    away from a replica its direct clients keep busy, at the risk of avoiding it for a chat that
    ended since; 0 ignores what replicas report (the rule before it read their load).
    ``balance_abs_threshold`` 4 and ``balance_rel_threshold`` 1.5: shared with `choose` (see
    `slimrag.route.policy`).
    ``chars_per_token`` 4.0: the estimate for passage tokens no view knows (English under SmolLM2's
    tokenizer; about 3 for code).
"""

from __future__ import annotations

from collections.abc import Sequence

from slimrag.route.planner import RoutePlan
from slimrag.route.policy import Replica, RouterConfig, choose, imbalanced


def held_tokens(replica: Replica, plan: RoutePlan, key: str | None, total: int) -> int:
    """The prompt tokens ``replica`` holds of ``plan``: exactly from its view, else estimated from
    its approximate tree's match of the routing ``key``."""
    if replica.exact():
        assert replica.events is not None
        return replica.events.view.reusable(plan.keys, replica.reuse)
    if not key:
        return 0
    return round(total * replica.tree.match(key) / len(key))


def choose_planned(pool: Sequence[Replica], plan: RoutePlan, key: str | None,
                   config: RouterConfig, turn: int = 0) -> tuple[Replica, str, int]:
    """The replica for a planned chat among ``pool`` (non-empty, in ``--replica`` order), why
    (``"kv"``, ``"kv_load"``, ``"balance"``, or `choose`'s reasons; module header), and the prefill
    tokens it is expected to compute. ``turn``: the round-robin position that breaks ties (the
    router counts its planned chats). No side effects."""
    if not any(r.exact() for r in pool):
        replica, reason = choose(pool, key, config)
        return replica, reason, sum(plan.tokens)
    system = max((r.events.view.blocks[h].tokens for r in pool if r.exact() and r.events is not None
                  for h in r.events.view.roots), default=0)
    total = system + sum(plan.tokens)
    held = [min(total, held_tokens(r, plan, key, total)) for r in pool]
    costs = [config.prefill_weight * (total - h) + r.pending_prefill + config.decode_tokens * r.in_flight
             + config.unseen_weight * (total * r.unseen_waiting + config.decode_tokens * r.unseen)
             for r, h in zip(pool, held, strict=True)]
    busy = [r.in_flight + (r.unseen if config.unseen_weight > 0 else 0) for r in pool]
    n = len(pool)
    if imbalanced(pool, config):
        least = min(r.in_flight for r in pool)
        i = min((i for i in range(n) if pool[i].in_flight == least), key=lambda i: (costs[i], (i - turn) % n))
        return pool[i], "balance", total - held[i]
    best = min(costs)
    near = [i for i in range(n) if costs[i] <= best + config.spread_share * total]
    i = min(near, key=lambda i: (busy[i], (i - turn) % n))
    most = max(held)
    return pool[i], "kv" if held[i] == most and most > 0 else "kv_load", total - held[i]
