"""Routing by the passages a chat will use: prefill tokens saved against load (issue 31).

`slimrag.route.policy.choose` routes by conversation text and an approximate tree; this rule
routes by what each replica really holds. For a chat the router has planned
(`slimrag.route.planner`: its passages' cache keys and estimated tokens), each replica gets a cost
in prefill-token units, as NVIDIA Dynamo's KV router weighs overlap against queued work:

    cost = prefill_weight × (prompt tokens − tokens it holds of this prompt)
           + its pending prefill + decode_tokens × its requests in flight

and the cheapest replica answers (ties: the one holding more, then ``--replica`` order).

- *Tokens it holds*: with an exact view (`KVView`, fed by its KV events), the replica's own
  planner replayed over the view (`KVView.plan`): the system segment plus the longest cached
  path of the passages in the order the replica will put them. A replica without events, or whose
  view has a hole, is scored by its approximate tree instead: the matched share of the routing text
  times the prompt's tokens. When no replica in the pool has an exact view, this rule is not used
  at all and `choose` decides exactly as before.
- *Prompt tokens*: the passages' estimated tokens plus the system segment's (its block size in any
  view; unknown, it counts the same for every replica and drops out).
- *Pending prefill*: the uncached tokens of chats routed there whose first byte has not come
  back (a slimrag replica sends its 200 with its first piece, so prefill is over by then).

Knobs (`RouterConfig`)
    ``prefill_weight`` 1.0 (Dynamo's ``overlap_score_weight``): how much a token this request must
    prefill weighs against a token of work already queued. Higher chases cache hits onto busy
    replicas (lower TTFT for the hit, queueing for the rest); 0 routes by load alone.
    ``decode_tokens`` 64: the queued work one request in flight stands for beyond its prefill
    (its decoding), in prefill-token units. A CPU replica decodes a token in the time it prefills
    about 10-40 (one matrix-vector product per token vs a matrix-matrix product per ~64), so 64
    prices a short answer; raise it for long answers.
    ``chars_per_token`` 4.0: the estimate for passage tokens no view knows (English under SmolLM2's
    tokenizer; about 3 for code).
"""

from __future__ import annotations

from collections.abc import Sequence

from slimrag.route.planner import RoutePlan
from slimrag.route.policy import Replica, RouterConfig, choose


def held_tokens(replica: Replica, plan: RoutePlan, key: str | None, total: int) -> int:
    """The prompt tokens ``replica`` holds of ``plan``: exactly from its view, else estimated from
    its approximate tree's match of the routing ``key``."""
    if replica.exact():
        assert replica.events is not None
        return replica.events.view.plan(plan.keys).cached_tokens
    if not key:
        return 0
    return round(total * replica.tree.match(key) / len(key))


def choose_planned(pool: Sequence[Replica], plan: RoutePlan, key: str | None,
                   config: RouterConfig) -> tuple[Replica, str, int]:
    """The replica for a planned chat among ``pool`` (non-empty), why (``"kv"``: the one that holds
    the most; ``"kv_load"``: another one, load outweighed; else `choose`'s reasons), and the
    prefill tokens it is expected to compute. No side effects."""
    if not any(r.exact() for r in pool):
        replica, reason = choose(pool, key, config)
        return replica, reason, sum(plan.tokens)
    system = max((r.events.view.blocks[h].tokens for r in pool if r.exact() and r.events is not None
                  for h in r.events.view.roots), default=0)
    total = system + sum(plan.tokens)
    scored = []
    for i, r in enumerate(pool):
        held = min(total, held_tokens(r, plan, key, total))
        new = total - held
        cost = config.prefill_weight * new + r.pending_prefill + config.decode_tokens * r.in_flight
        scored.append((cost, -held, i, new))
    cost, held, i, new = min(scored)
    most = max(-s[1] for s in scored)
    return pool[i], "kv" if -held == most and most > 0 else "kv_load", new
