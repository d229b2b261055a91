"""``bench.route``'s replicas have a start deadline (issue 31): a replica that exits, or that never
answers ``/healthz``, stops the bench with a message naming it and its log, instead of a hang."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench.route import Replica, StartError


def test_a_replica_that_exits_names_its_status_and_log(tmp_path: Path) -> None:
    rep = Replica(tmp_path / "home")
    rep.start(index=tmp_path / "no-such.slimrag")
    with pytest.raises(StartError, match=r"(?s)exited with status [1-9].*serve\.log") as err:
        rep.wait(120)
    assert "no-such.slimrag" in str(err.value)  # the tail of its log: serve's own message


def test_a_replica_that_never_answers_is_killed_at_the_deadline(tmp_path: Path) -> None:
    rep = Replica(tmp_path / "home")
    rep.log.write_text("loading the model\n")
    rep.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # alive, never listening
    t0 = time.monotonic()
    with pytest.raises(StartError, match=r"(?s)did not answer /healthz within 1s .*loading the model"):
        rep.wait(1.0)
    assert time.monotonic() - t0 < 10
    assert rep.proc.poll() is not None  # killed, not left behind


def test_repeated_policies_are_labelled_and_paired_by_rank() -> None:
    """An ABBA order runs each policy twice; each events part is compared with the approximate
    tree's part of the same rank, then the medians."""
    from bench.route import labelled, ratios

    assert labelled(["events", "approx", "approx", "events", "rr"]) == [
        ("events", "events"), ("approx", "approx"), ("approx#2", "approx"), ("events#2", "events"), ("rr", "rr")]
    part = {"cached_tokens": 100, "ttft_p90_s": 1.0, "ttft_p50_s": 1.0}
    pol = {"events": {**part, "policy": "events", "label": "events", "cached_tokens": 150, "ttft_p90_s": 0.5},
           "approx": {**part, "policy": "approx", "label": "approx"},
           "approx#2": {**part, "policy": "approx", "label": "approx#2", "ttft_p90_s": 2.0},
           "events#2": {**part, "policy": "events", "label": "events#2", "cached_tokens": 110, "ttft_p90_s": 1.0}}
    lines = ratios(pol)
    assert lines[0].startswith("events/approx: reused 1.50x, p90 TTFT 0.50x")
    assert lines[1].startswith("events#2/approx#2: reused 1.10x, p90 TTFT 0.50x")
    assert lines[2].startswith("events/approx, median of 2 pairs: reused 1.30x, p90 TTFT 0.50x")


def test_a_budget_below_the_hot_set_lowers_what_one_replica_can_reuse() -> None:
    """`reuse_bound` with a budget: plans that share their first passage reuse it while it fits,
    not when the tree is smaller than it; the hot set is the shared passage and the
    system segment."""
    from bench.route_sim import SYSTEM_TOKENS, reuse_bound, working_set
    from slimrag.route.planner import RoutePlan

    plans = [RoutePlan(((1, 0.9), (i + 2, 0.8)), ("hot", f"cold{i}"), (200, 300)) for i in range(4)]
    unlimited = reuse_bound([], plans)
    assert unlimited == 3 * (SYSTEM_TOKENS + 200) / (4 * (SYSTEM_TOKENS + 500))
    assert reuse_bound([], plans, budget=SYSTEM_TOKENS + 200) == unlimited  # the cold ones go first
    assert reuse_bound([], plans, budget=SYSTEM_TOKENS + 100) < unlimited  # the hot passage does not fit
    assert working_set(plans) == (SYSTEM_TOKENS + 200 + 4 * 300, SYSTEM_TOKENS + 200)


def test_the_direct_clients_ttft_is_reported_beside_the_routed_chats() -> None:
    """Each part's summary carries the direct client's TTFT p50/p90 (its own chats to replica 0),
    and the table prints them; a part without direct chats reports none rather than failing."""
    from bench.route import report, summarize

    def rec(ttft: float, chosen: int = 1) -> dict[str, Any]:
        return {"ttft": ttft, "total": ttft + 1, "replica": "r", "prompt": 100, "cached": 10, "before": None,
                "chosen": chosen}

    routed = [rec(t) for t in (1.0, 2.0, 3.0)]
    direct = [rec(t, 0) for t in (0.5, 0.7, 0.9, 1.1, 4.0)]
    s = summarize("approx", routed, direct, wall=10.0)
    assert (s["ttft_p50_s"], s["ttft_p90_s"]) == (2.0, 3.0)
    assert (s["direct_ttft_p50_s"], s["direct_ttft_p90_s"]) == (0.9, 4.0)
    assert s["direct_cached_tokens"] == 50
    row = report({"policies": {"approx": s}}).splitlines()[1]
    assert "0.90/4.00" in row
    none = summarize("approx", routed, [], wall=10.0)
    assert none["direct_ttft_p50_s"] is None and "-/-" in report({"policies": {"approx": none}})


def test_the_fleet_simulation_places_held_entries_under_blend_reuse() -> None:
    """A simulated blend replica places every passage entry it holds, paying the recompute policy's
    tokens for each one placed away from its own position; an exact one reuses only the planned
    path. One replica, requests far apart: (a), then (b), then (a, b)."""
    from bench.route_sim import SYSTEM_TOKENS, run_sim
    from slimrag.route.planner import RoutePlan

    ta, tb = 100, 200
    plans = [RoutePlan(((1, 0.9),), ("a",), (ta,)), RoutePlan(((2, 0.9),), ("b",), (tb,)),
             RoutePlan(((1, 0.9), (2, 0.8)), ("a", "b"), (ta, tb))]
    arrivals = [(100.0 * i, f"q{i}", p) for i, p in enumerate(plans)]
    costs = {"a_s": 0.1, "b_s_per_token": 0.001, "decode_s": 0.1}
    prompt = 3 * SYSTEM_TOKENS + 2 * ta + 2 * tb
    blend = run_sim("rr", 1, arrivals, costs, 10_000, reuse="blend", recompute="boundary:8")
    # the second request reuses the system segment; the third both entries, b (the longer) first and
    # a placed behind it (8 tokens recomputed); exact reuse serves only b's path
    assert blend["reused_share"] == round((SYSTEM_TOKENS + SYSTEM_TOKENS + ta + tb - 8) / prompt, 3)
    exact = run_sim("rr", 1, arrivals, costs, 10_000)
    assert exact["reused_share"] == round((SYSTEM_TOKENS + SYSTEM_TOKENS + tb) / prompt, 3)
    # under events + passages two blend replicas are priced by the entries they hold
    two = run_sim("events", 2, arrivals, costs, 10_000, reuse="blend", recompute="boundary:8")
    assert two["reuse"] == "blend" and two["requests"] == 3
