"""Routing by what replicas really hold (issue 31), end to end on 127.0.0.1: two real `slimrag serve`
apps with the embedded model publish their knowledge trees' changes (``kv_events``), and a real
router with ``index`` follows them, retrieves each chat's passages itself, routes by the prefill
they save, and passes them on so the replica does not search again.

Ground truth is each replica's own tree (its nodes' path hashes and token counts), compared with
the router's view of it; and the replica's ``slimrag_planned_chats_total`` counts the chats it
answered without a search of its own."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx
import pytest
from asgi_server import running
from asgi_server import wait_for as _wait_for
from click.testing import CliRunner
from conftest import DOCS, write_tree
from test_kv_events import tree_held

from slimrag.cli import cli
from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.llm import weights
from slimrag.llm.kv.publish import EventsConfig
from slimrag.llm.local import LocalGenerator
from slimrag.rag.guards import Guards
from slimrag.rag.pipeline import RAG
from slimrag.route.app import create_router_app
from slimrag.route.kv_view import KVView
from slimrag.route.policy import RouterConfig
from slimrag.serve.app import create_app

TIMEOUT = 120.0  # prefills of the embedded model on a loaded 2-core machine
CATS, BREAD = "Where does Whiskers sleep?", "How long does the bread bake?"

#: This file's replicas take longer to settle: 20 s, polled every 50 ms.
wait_for = partial(_wait_for, timeout=20.0, every=0.05)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Index]:
    docs = write_tree(tmp_path_factory.mktemp("docs"), DOCS)
    with Index.build(docs, tmp_path_factory.mktemp("idx") / "route.slimrag", embedder=embedder) as idx:
        yield idx



def ask(client: httpx.Client, question: str) -> httpx.Response:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": question}], "k": 2, "max_tokens": 2,
                            "answer": "free"}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r


def planned(client: httpx.Client) -> float:
    line = next(x for x in client.get("/metrics").text.splitlines() if x.startswith("slimrag_planned_chats_total"))
    return float(line.split()[-1])


def test_the_router_follows_replica_events_and_routes_chats_by_their_passages(
        index: Index, smollm: weights.LoadedModel) -> None:
    rags = [RAG(index, LocalGenerator(loaded=smollm), guards=Guards(floor=None)) for _ in range(2)]
    trees = [r.llm.reuse.tree for r in rags]  # type: ignore[attr-defined]
    apps = [create_app(r, kv_events=EventsConfig("tcp://127.0.0.1:*"), workers=2) for r in rags]
    with running(apps[0]) as u0, running(apps[1]) as u1:
        routed = create_router_app([u0, u1], RouterConfig(health_interval_s=0.2), index=str(index.root))
        router = routed.state.router
        with running(routed) as url, httpx.Client(base_url=url, timeout=TIMEOUT) as client, \
                httpx.Client(base_url=u0, timeout=TIMEOUT) as direct0, \
                httpx.Client(base_url=u1, timeout=TIMEOUT) as direct1:
            wait_for(lambda: all(r.exact() for r in router.replicas), "both replicas' views")
            assert direct0.get("/healthz").json()["kv_events"]["endpoint"].startswith("tcp://127.0.0.1:")

            first = ask(client, CATS)
            home = [u0, u1].index(first.headers["x-slimrag-replica"])
            view = router.replicas[home].events.view
            wait_for(lambda: len(view) > 0 and view.held() == tree_held(trees[home]), "the view of the tree")

            # A client that talks to the other replica directly: state only its events can tell.
            other, direct = 1 - home, [direct0, direct1][1 - home]
            ask(direct, BREAD)
            other_view = router.replicas[other].events.view
            wait_for(lambda: len(other_view) > 0 and other_view.held() == tree_held(trees[other]),
                     "the directly used replica's view")

            before = [planned(direct0), planned(direct1)]
            again = ask(client, CATS)
            bread = ask(client, BREAD)
            assert again.headers["x-slimrag-replica"] == [u0, u1][home]
            assert bread.headers["x-slimrag-replica"] == [u0, u1][other]
            assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
            assert bread.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
            assert [planned(direct0), planned(direct1)] == [before[0] + (home == 0) + (other == 0),
                                                            before[1] + (home == 1) + (other == 1)]
            metrics = client.get("/metrics").text
            assert 'reason="kv"' in metrics and "slimrag_router_kv_exact" in metrics
            for i in range(2):
                wait_for(lambda i=i: router.replicas[i].events.view.held() == tree_held(trees[i]), "views")


def test_serve_kv_events_flag_is_checked(tmp_path: Any) -> None:
    runner = CliRunner()
    idx = tmp_path / "i.slimrag"
    idx.mkdir()
    bad = runner.invoke(cli, ["serve", str(idx), "--port", "0", "--kv-events", "127.0.0.1:5557"])
    assert bad.exit_code == 2 and "tcp://" in bad.output
    remote = runner.invoke(cli, ["serve", str(idx), "--port", "0", "--llm", "http://127.0.0.1:9/v1",
                                 "--kv-events", "tcp://127.0.0.1:5557"])
    assert remote.exit_code == 2 and "--llm" in remote.output
    budget = runner.invoke(cli, ["serve", str(idx), "--port", "0", "--llm", "http://127.0.0.1:9/v1",
                                 "--kv-budget", "60"])
    assert budget.exit_code == 2 and "--kv-budget" in budget.output
    assert runner.invoke(cli, ["serve", str(idx), "--port", "0", "--kv-budget", "0"]).exit_code == 2


@dataclass
class Followed:
    """What `Replica.exact` reads of an event stream: a view kept by hand, complete."""

    view: KVView
    exact: bool = True


def test_planned_rule_weighs_prefill_saved_against_load() -> None:
    """`choose_planned` with plain numbers: the holder wins until its queue outweighs the saving,
    and with no exact view anywhere the old rule decides alone."""
    from slimrag.llm.kv.events import BlockStored, chain_hash
    from slimrag.route.kv_policy import choose_planned
    from slimrag.route.planner import RoutePlan
    from slimrag.route.policy import Replica, choose
    from slimrag.route.prefix_tree import PrefixTree

    root = chain_hash(None, "model|system@1")
    holder = KVView()
    holder.apply(BlockStored((root,), None, 40, "CPU"))
    holder.apply(BlockStored((chain_hash(root, "p1"),), root, 300, "CPU"))
    reps = [Replica(f"http://127.0.0.1:{9000 + i}", PrefixTree()) for i in range(3)]
    reps[0].events, reps[1].events = Followed(KVView()), Followed(holder)  # type: ignore[assignment]
    plan = RoutePlan(((1, 0.9), (2, 0.8)), ("p2", "p1"), (300, 200))
    config = RouterConfig()
    chosen, reason, prefill = choose_planned(reps, plan, "<user>q\n", config)
    assert (chosen, reason, prefill) == (reps[1], "kv", 40 + 500 - 340)
    reps[1].pending_prefill = 600  # its queue now costs more than the 340 tokens it saves
    chosen, reason, _ = choose_planned(reps, plan, "<user>q\n", config)
    assert chosen is reps[0] and reason == "kv_load"  # 0 and 2 tie (nothing held): turn 0 picks 0
    assert choose_planned(reps, plan, "<user>q\n", config, turn=1)[0] is reps[2]  # ... turn 1 the next
    reps[1].events.exact = False  # type: ignore[union-attr]
    reps[0].events = None
    reps[1].pending_prefill = 0
    assert choose_planned(reps, plan, "<user>q\n", config)[:2] == choose(reps, "<user>q\n", config)


def _followed(*held: dict[str, int]) -> list[Any]:
    """Replicas with exact views: each holds the system segment (40 tokens) and passages
    ``key -> tokens`` right after it."""
    from slimrag.llm.kv.events import BlockStored, chain_hash
    from slimrag.route.policy import Replica
    from slimrag.route.prefix_tree import PrefixTree

    root = chain_hash(None, "model|system@1")
    reps = []
    for i, passages in enumerate(held):
        view = KVView()
        view.apply(BlockStored((root,), None, 40, "CPU"))
        for key, tokens in passages.items():
            view.apply(BlockStored((chain_hash(root, key),), root, tokens, "CPU"))
        rep = Replica(f"http://127.0.0.1:{9100 + i}", PrefixTree())
        rep.events = Followed(view)  # type: ignore[assignment]
        reps.append(rep)
    return reps


def test_planned_rule_spreads_chats_that_save_about_the_same() -> None:
    """Chats that save nothing but the system segment, which two replicas of three hold, go round
    the three replicas (the old rule sent every one to the first holder); a replica with requests
    in flight is passed over among near ties; a real saving still wins."""
    from slimrag.route.kv_policy import choose_planned
    from slimrag.route.planner import RoutePlan

    reps = _followed({}, {}, {})
    reps[2].events.view = KVView()  # type: ignore[union-attr]  # a fresh replica: not even the system segment
    plan = RoutePlan(((1, 0.9),), ("p9",), (500,))
    config = RouterConfig()
    chosen = [choose_planned(reps, plan, None, config, turn)[0] for turn in range(6)]
    assert [reps.index(r) for r in chosen] == [0, 1, 2, 0, 1, 2]
    exact_ties = RouterConfig(spread_share=0.0)  # exact ties only: the fresh replica is never chosen
    assert [reps.index(choose_planned(reps, plan, None, exact_ties, t)[0]) for t in range(3)] == [0, 1, 0]
    reps[0].in_flight = reps[1].in_flight = 1  # both busy decoding: the idle one, whatever the turn
    assert {reps.index(choose_planned(reps, plan, None, config, t)[0]) for t in range(3)} == {2}

    holders = _followed({"p1": 300}, {}, {})
    plan = RoutePlan(((1, 0.9),), ("p1",), (300,))
    for turn in range(3):
        assert choose_planned(holders, plan, None, config, turn)[:2] == (holders[0], "kv")


def test_planned_rule_balances_by_in_flight_counts_past_the_thresholds() -> None:
    """SGLang's switch: in-flight counts apart by more than ``balance_abs_threshold`` and
    ``balance_rel_threshold`` times: the least loaded answers, however much the busy one holds."""
    from slimrag.route.kv_policy import choose_planned
    from slimrag.route.planner import RoutePlan

    reps = _followed({"p1": 3000}, {}, {})
    plan = RoutePlan(((1, 0.9),), ("p1",), (3000,))
    config = RouterConfig(balance_abs_threshold=2, balance_rel_threshold=1.5)
    reps[0].in_flight, reps[1].in_flight, reps[2].in_flight = 3, 1, 2  # 3 - 1 = 2: not past the threshold
    assert choose_planned(reps, plan, None, config)[:2] == (reps[0], "kv")
    reps[0].in_flight = 4
    assert choose_planned(reps, plan, None, config)[:2] == (reps[1], "balance")


def test_the_router_weighs_chats_a_replica_answers_for_clients_it_cannot_see(
        index: Index, smollm: weights.LoadedModel) -> None:
    """Two clients keep asking replica 0 directly: its ``/healthz`` counts their chats (``load``),
    the router reads them at its health checks as load it did not send, and a planned chat that
    saves the same on both replicas goes to replica 1 (turn 0 picks replica 0 when no load is
    seen). When the direct clients stop, the replica's count and the router's unseen load are 0."""
    import threading

    rags = [RAG(index, LocalGenerator(loaded=smollm), guards=Guards(floor=None)) for _ in range(2)]
    apps = [create_app(r, kv_events=EventsConfig("tcp://127.0.0.1:*"), workers=2) for r in rags]
    with running(apps[0]) as u0, running(apps[1]) as u1:
        routed = create_router_app([u0, u1], RouterConfig(health_interval_s=0.2), index=str(index.root))
        router = routed.state.router
        with running(routed) as url, httpx.Client(base_url=url, timeout=TIMEOUT) as client, \
                httpx.Client(base_url=u0, timeout=TIMEOUT) as direct:
            wait_for(lambda: all(r.exact() for r in router.replicas), "both replicas' views")
            assert direct.get("/healthz").json()["load"] == {"chats": 0, "waiting": 0}
            stop, seen = threading.Event(), []

            def keep_asking() -> None:  # back to back, so replica 0 is almost never idle
                while not stop.is_set():
                    body = {"messages": [{"role": "user", "content": BREAD}], "k": 2, "max_tokens": 48,
                            "answer": "free"}
                    assert direct.post("/v1/chat/completions", json=body).status_code == 200

            side = [threading.Thread(target=keep_asking) for _ in range(2)]
            for t in side:
                t.start()
            try:
                wait_for(lambda: seen.append(direct.get("/healthz").json()["load"]) or seen[-1]["chats"] > 0,
                         "replica 0 to count its direct chats")
                assert 0 <= seen[-1]["waiting"] <= seen[-1]["chats"] <= 2
                wait_for(lambda: router.replicas[0].unseen > 0, "the router to read replica 0's load")
                assert router.replicas[1].unseen == 0
                assert ask(client, CATS).headers["x-slimrag-replica"] == u1
            finally:
                stop.set()
                for t in side:
                    t.join(TIMEOUT)
            assert direct.get("/healthz").json()["load"] == {"chats": 0, "waiting": 0}
            wait_for(lambda: router.replicas[0].unseen == 0, "the router to see replica 0 idle again")


def test_planned_rule_prices_unseen_chats() -> None:
    """A replica's unseen chats (reported, not sent by this router) cost like its own: a decoding
    one ``decode_tokens``, a waiting one the prompt's prefill; ``unseen_weight`` 0 ignores them."""
    from slimrag.route.kv_policy import choose_planned
    from slimrag.route.planner import RoutePlan

    reps = _followed({"p1": 300}, {}, {})
    plan = RoutePlan(((1, 0.9),), ("p1",), (300,))
    config = RouterConfig()
    assert choose_planned(reps, plan, None, config)[:2] == (reps[0], "kv")
    reps[0].report_load(chats=1, waiting=0)  # decoding for a direct client: 64 < the 300 it saves
    assert choose_planned(reps, plan, None, config)[:2] == (reps[0], "kv")
    reps[0].report_load(chats=2, waiting=1)  # one of them still to prefill: 340 + 128 > 300 saved
    assert choose_planned(reps, plan, None, config)[:2] == (reps[1], "kv_load")
    assert choose_planned(reps, plan, None, RouterConfig(unseen_weight=0.0))[:2] == (reps[0], "kv")
    reps[0].in_flight, reps[0].waiting = 2, 1  # the two are the router's own after all: none unseen
    reps[0].report_load(chats=2, waiting=1)
    assert (reps[0].unseen, reps[0].unseen_waiting) == (0, 0)


def test_planned_rule_prices_a_blend_replica_by_every_entry_it_holds() -> None:
    """A replica that reuses by blend places each passage's entry wherever it stands: for a chat on
    p3, p1 and p2 it saves p1 and p2 (600 tokens), more than the 450 of p3 on the other replica;
    priced as exact reuse it would save only the path its plan walks (p1, 300)."""
    from slimrag.route.kv_policy import choose_planned
    from slimrag.route.planner import RoutePlan

    reps = _followed({"p1": 300, "p2": 300}, {"p3": 450})
    plan = RoutePlan(((1, 0.9), (2, 0.8), (3, 0.7)), ("p3", "p1", "p2"), (450, 300, 300))
    config = RouterConfig()
    assert choose_planned(reps, plan, "<user>q\n", config)[0] is reps[1]
    reps[0].reuse = "blend"
    chosen, reason, prefill = choose_planned(reps, plan, "<user>q\n", config)
    assert (chosen, reason, prefill) == (reps[0], "kv", 40 + 1050 - 640)


def test_the_router_reads_a_replicas_reuse_from_its_healthz(index: Index, smollm: weights.LoadedModel) -> None:
    from slimrag.llm.kv.config import CacheConfig

    blend = RAG(index, LocalGenerator(loaded=smollm, cache=CacheConfig(reuse="blend")), guards=Guards(floor=None))
    app = create_app(blend, kv_events=EventsConfig("tcp://127.0.0.1:*", reuse="blend"), workers=1)
    with running(app) as u0:
        routed = create_router_app([u0], RouterConfig(health_interval_s=0.2), index=str(index.root))
        router = routed.state.router
        with running(routed), httpx.Client(base_url=u0, timeout=TIMEOUT) as direct:
            assert direct.get("/healthz").json()["kv_events"]["reuse"] == "blend"
            wait_for(lambda: router.replicas[0].exact() and router.replicas[0].reuse == "blend", "the blend view")
