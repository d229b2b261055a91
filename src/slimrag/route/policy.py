"""The routing rule of ``slimrag route``: which replica answers a request (cache-aware, load-balanced).

This follows SGLang's cache-aware router (``sgl-router/src/policies/cache_aware.rs``), which
combines two strategies and switches between them by load:

1. Cache affinity (approximate trees). The router keeps, per replica, a `PrefixTree` of the
   routing keys it sent there, a guess at what that replica's prefix cache holds that needs no
   report from the replica. For a chat completion the key is the conversation text (system and
   messages, role-tagged, in order), as SGLang's router keys on the raw prompt text. A slimrag
   replica decides the retrieved passages itself, so the router cannot key on the prompt it will
   build; but the same conversation retrieves the same passages, and a chat's next turn keeps the
   earlier turns' passages as a fixed prefix (`slimrag.rag.plan`), so the replica that answered
   the conversation so far holds most of the next turn's prompt in its KV cache. The match ratio
   is the matched characters over the key's length.
2. Load balancing (shortest queue). Each replica's load is its number of requests in flight
   through this router (other clients of the replica are not seen).

Per request, over the healthy replicas not yet tried for it:

- Load is *imbalanced* when both ``max - min > balance_abs_threshold`` and
  ``max > balance_rel_threshold * min`` (in-flight counts). Then: the least-loaded replica.
- Otherwise, when the longest match covers at least ``cache_threshold`` of the key: the replica
  with the longest match (the least loaded among equal matches).
- Otherwise: the least-loaded replica, the smallest tree among equals (the most cache room, which
  is what SGLang picks here regardless of load), then the first in ``--replica`` order. So
  sequential requests with new prefixes spread over the replicas.

The chosen replica's tree gets the key once the replica accepted the request (see
`slimrag.route.app`), so a failed attempt leaves no false belief behind. Requests without a key
(embeddings, search, models) go to the least-loaded replica. Where SGLang differs: it inserts at
selection time, needs the ratio strictly above the threshold, counts the load of unhealthy
workers too, and evicts by node count on a timer rather than by characters on insert.

Knobs (`RouterConfig`; SGLang's defaults in brackets where ours differ)
    ``cache_threshold`` 0.5: the match ratio from which affinity wins over spreading. Higher spreads
    more (each replica caches different conversations, more prefill); lower concentrates
    conversations on fewer replicas.
    ``balance_abs_threshold`` 4 [32] and ``balance_rel_threshold`` 1.5 [1.0001]: how uneven the
    in-flight counts may get before load wins over affinity. A slimrag replica works on 4 requests
    at once (``create_app``'s ``workers``) and queues the rest, while SGLang's thresholds suit GPU
    servers batching dozens; both must be exceeded, so a replica is never skipped for being one
    request busier than an idle one when ``balance_abs_threshold`` >= 1.
    ``max_tree_chars`` 4 Mi [SGLang caps nodes, 2**24]: characters kept per replica tree, evicted
    least recently used first (at the cap: 4 MB of text plus about 300 bytes per stored key).
    ``cooldown_s`` 10: how long a replica that failed (connection error, timeout, or 503/504 before
    any byte of its answer was sent) is left out; its tree is cleared, since a failure usually means a
    restart and an empty cache. When every untried replica is cooling down they are tried anyway.
    ``connect_timeout_s`` 3 and ``timeout_s`` 600: connecting to a replica, and waiting for its
    next bytes (generation can take minutes on a CPU, so this read deadline is only a last resort;
    a hung replica is found by the health check below).
    ``health_interval_s`` 2 and ``health_timeout_s`` 2: the active health check. Every interval
    the router sends ``GET /healthz`` to each replica; a replica that does not answer 200 within
    the timeout (dead: connection refused; hung: a SIGSTOPped or deadlocked process accepts the
    connection and never answers) is marked down until a later check passes, and the requests
    waiting on it for their first byte are taken back and sent to another replica (never a
    request that already received bytes: its stream ends with an error event). A check that passes
    brings a replica back at once, ending any cool-down: a restarted replica rejoins within one
    interval. Detection takes at most interval + timeout (4 s by default); a shorter interval
    finds failures sooner for one small request per replica per interval. 0 turns checks off.
    ``max_body_bytes`` 1 MiB: larger request bodies are refused with 413, as ``slimrag serve`` does.
    ``prefill_weight`` 1.0, ``decode_tokens`` 64, ``spread_share`` 0.1, ``unseen_weight`` 1.0 and
    ``chars_per_token`` 4.0:
    the cost of a chat routed by its passages over replicas that publish KV events; the rule and each trade-off are in
    `slimrag.route.kv_policy`. They do nothing when no replica publishes events or the router plans
    no passages (no ``--index``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from slimrag.route.prefix_tree import PrefixTree

if TYPE_CHECKING:
    from slimrag.route.events import EventStream


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """The router's knobs; see the module header for each one's trade-off."""

    cache_threshold: float = 0.5
    balance_abs_threshold: int = 4
    balance_rel_threshold: float = 1.5
    max_tree_chars: int = 1 << 22
    cooldown_s: float = 10.0
    connect_timeout_s: float = 3.0
    timeout_s: float = 600.0
    max_body_bytes: int = 1 << 20
    health_interval_s: float = 2.0
    health_timeout_s: float = 2.0
    prefill_weight: float = 1.0
    decode_tokens: int = 64
    spread_share: float = 0.1
    unseen_weight: float = 1.0
    chars_per_token: float = 4.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {self.cache_threshold}")
        if self.balance_abs_threshold < 0:
            raise ValueError(f"balance_abs_threshold must be >= 0, got {self.balance_abs_threshold}")
        if self.balance_rel_threshold < 1.0:
            raise ValueError(f"balance_rel_threshold must be >= 1, got {self.balance_rel_threshold}")
        if self.cooldown_s < 0:
            raise ValueError(f"cooldown_s must be >= 0, got {self.cooldown_s}")
        if self.health_interval_s < 0:
            raise ValueError(f"health_interval_s must be >= 0 (0: no health checks), got {self.health_interval_s}")
        if min(self.prefill_weight, self.decode_tokens, self.spread_share, self.unseen_weight) < 0:
            raise ValueError("prefill_weight, decode_tokens, spread_share and unseen_weight must be >= 0")
        for name in ("max_tree_chars", "connect_timeout_s", "timeout_s", "max_body_bytes", "health_timeout_s",
                     "chars_per_token"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


def replica_url(url: str) -> str:
    """A replica's server root: ``http(s)://host:port``, a trailing ``/`` or ``/v1`` dropped (the
    router adds ``/v1/...`` itself). Raises ValueError for anything else."""
    root = url.strip().rstrip("/").removesuffix("/v1").rstrip("/")
    parts = urlsplit(root)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path or parts.query:
        raise ValueError(f"replica URL must look like http://host:port, got {url!r}")
    return root


@dataclass(eq=False)
class Replica:
    """One backend server as the router sees it: its URL, requests in flight through the router,
    the approximate tree of what was sent to it, and until when it is left out after a failure."""

    url: str
    tree: PrefixTree = field(default_factory=PrefixTree)
    in_flight: int = 0
    down_until: float = 0.0
    #: False from a failed health check until one passes.
    checked_ok: bool = True
    #: Its KV event stream, once its ``/healthz`` named one (`slimrag.route.events`).
    events: EventStream | None = None
    #: How it reuses the segments its events name, as its ``/healthz`` says (``exact`` or ``blend``:
    #: `slimrag.route.kv_view.KVView.reusable`).
    reuse: str = "exact"
    #: Estimated prefill tokens routed here whose first byte has not come back yet.
    pending_prefill: int = 0
    #: Requests routed here that have not had their first byte back (the count behind ``pending_prefill``).
    waiting: int = 0
    #: Chats in flight there that this router did not send, and how many of them wait for their
    #: first piece, as of its last health check (``/healthz``'s ``load``; 0 when it reports none).
    unseen: int = 0
    unseen_waiting: int = 0

    def report_load(self, chats: int, waiting: int) -> None:
        """Record the load a replica reports (its ``/healthz``): what exceeds this router's own."""
        self.unseen = max(0, chats - self.in_flight)
        self.unseen_waiting = min(self.unseen, max(0, waiting - self.waiting))

    def read_load(self, load: object) -> None:
        """:meth:`report_load` from ``/healthz``'s ``load`` object (``{"chats": n, "waiting": m}``);
        anything else (absent, not an object, not numbers) reports nothing seen."""
        try:
            chats, waiting = (int(load.get("chats", 0)), int(load.get("waiting", 0))) if isinstance(load, dict) else (0, 0)
        except (TypeError, ValueError):  # not numbers
            chats, waiting = 0, 0
        self.report_load(chats, waiting)

    def exact(self) -> bool:
        """Whether the router holds an exact view of this replica's cache (its events, complete)."""
        return self.events is not None and self.events.exact

    def healthy(self, now: float | None = None) -> bool:
        """False while cooling down after a failure, or while its health check fails."""
        return self.checked_ok and (time.monotonic() if now is None else now) >= self.down_until

    def mark_down(self, cooldown_s: float) -> None:
        """Leave this replica out for ``cooldown_s`` and forget its tree (its cache is likely gone)."""
        self.down_until = time.monotonic() + cooldown_s
        self.tree.clear()
        if self.events is not None:
            self.events.invalidate()

    def checked(self, ok: bool) -> bool:
        """Record a health check; True when it changed the replica's state. A failed check leaves
        the replica out (and forgets its tree) until a check passes; a passed one ends a cool-down."""
        changed = ok != self.checked_ok
        if not ok and self.checked_ok:
            self.tree.clear()
        if changed and self.events is not None:  # down: forget; back: rebuild from its replay
            self.events.invalidate()
        if ok:
            changed = changed or self.down_until > time.monotonic()
            self.down_until = 0.0
        self.checked_ok = ok
        return changed


def imbalanced(pool: Sequence[Replica], config: RouterConfig) -> bool:
    """Whether the in-flight counts of ``pool`` are uneven enough for load to win over affinity:
    ``max - min > balance_abs_threshold`` and ``max > balance_rel_threshold * min``."""
    loads = [r.in_flight for r in pool]
    lo, hi = min(loads), max(loads)
    return hi - lo > config.balance_abs_threshold and hi > config.balance_rel_threshold * lo


def choose(pool: Sequence[Replica], key: str | None, config: RouterConfig) -> tuple[Replica, str]:
    """The replica for a request with routing ``key`` (None: no affinity) among ``pool`` (non-empty,
    the candidates in ``--replica`` order), and why: ``"balance"`` (load imbalanced, least loaded),
    ``"cache"`` (longest prefix match) or ``"least_loaded"``. No side effects."""
    if not pool:
        raise ValueError("choose needs at least one replica")
    least = min(pool, key=lambda r: (r.in_flight, r.tree.size))  # min keeps the first of equals
    if imbalanced(pool, config):
        return least, "balance"
    if key:
        matched = [r.tree.match(key) for r in pool]
        best = max(matched)
        if best > 0 and best >= config.cache_threshold * len(key):
            return min((r for r, m in zip(pool, matched, strict=True) if m == best),
                       key=lambda r: r.in_flight), "cache"
    return least, "least_loaded"
