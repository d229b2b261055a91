"""The router's Prometheus metrics: request counting as a replica counts it (`slimrag.api.metrics`),
plus counters and gauges per replica (names and meanings in the header of `slimrag.route.app`)."""

from __future__ import annotations

from collections.abc import Sequence

from slimrag.api.metrics import Metrics
from slimrag.route.policy import Replica


class RouterMetrics(Metrics):
    """The router's counters (request counting as in `Metrics`, plus per-replica ones) and gauges."""

    HELP = {
        "slimrag_requests_total": Metrics.HELP["slimrag_requests_total"],
        "slimrag_errors_total": Metrics.HELP["slimrag_errors_total"],
        "slimrag_router_routed_total": "Requests answered, by replica and routing reason.",
        "slimrag_router_upstream_total": "Attempts sent to replicas, by replica and status (error: none came).",
        "slimrag_router_failures_total": "Attempts failed before the first byte, or answers broken off, by replica.",
        "slimrag_router_health_checks_total": "Active health checks, by replica and result (ok, failed).",
    }
    GAUGES = {
        "slimrag_router_in_flight": ("Requests in flight through the router, by replica.", lambda r: r.in_flight),
        "slimrag_router_healthy": ("1 when the replica is not cooling down after a failure.",
                                   lambda r: int(r.healthy())),
        "slimrag_router_tree_chars": ("Characters in the replica's approximate prefix tree.",
                                      lambda r: r.tree.size),
        "slimrag_router_kv_segments": ("Segments in the replica's KV view, from its events (0 without).",
                                       lambda r: len(r.events.view) if r.events is not None else 0),
        "slimrag_router_kv_exact": ("1 when the replica's KV view is exact (its events, complete).",
                                    lambda r: int(r.exact())),
        "slimrag_router_kv_malformed": ("Malformed KV event messages and events skipped, by replica.",
                                        lambda r: r.events.counts.malformed if r.events is not None else 0),
    }

    def render_all(self, replicas: Sequence[Replica]) -> str:
        """The counters, then one gauge line per replica."""
        lines = [self.render().rstrip("\n")]
        for name, (text, value) in self.GAUGES.items():
            lines += [f"# HELP {name} {text}", f"# TYPE {name} gauge"]
            lines += [f'{name}{{replica="{r.url}"}} {value(r)}' for r in replicas]
        return "\n".join(lines) + "\n"
