"""KV events (issue 31): vLLM's schema in both encodings, the tree's changes as events, and a
router's view kept equal to the tree over real ZMQ sockets on 127.0.0.1 (gaps replayed, restarts
rebuilt, holes and garbage survived).

The fixtures are written by hand from vLLM's published schema (``vllm/distributed/kv_events.py``:
msgspec structs tagged by class name under ``type``; arrays in declaration order before its June
2026 change, maps since), not produced by our encoder, so a decoder that only read its own
output would fail them."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

import msgpack
import pytest
import zmq

from slimrag.llm.kv import CacheConfig, KVTree, SegmentKV
from slimrag.llm.kv.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventLog,
    MalformedEvent,
    chain_hash,
    decode_batch,
    encode_batch,
    path_hash,
)
from slimrag.llm.kv.publish import EventPublisher, EventsConfig
from slimrag.route.events import EventStream
from slimrag.route.kv_view import KVView

S = SegmentKV.simulated
H1, H2, H3 = b"\x01" * 16, b"\x02" * 16, 0x7FFF_0000_0000_0001  # bytes and int hashes both occur

#: vLLM's current encoding: a map batch of map events (its fields as of the June 2026 change).
MAP_FIXTURE = {
    "ts": 1717000000.5,
    "events": [
        {"type": "AllBlocksCleared"},
        {"type": "BlockStored", "block_hashes": [H1], "parent_block_hash": None, "token_ids": [1, 2, 3],
         "block_size": 3, "lora_id": None, "medium": "GPU", "lora_name": None, "extra_keys": [None],
         "group_idx": 0, "kv_cache_spec_kind": "full_attention", "kv_cache_spec_sliding_window": None},
        {"type": "BlockStored", "block_hashes": [H2, H3], "parent_block_hash": H1, "token_ids": [],
         "block_size": 16, "lora_id": None, "medium": "CPU", "lora_name": None},
        {"type": "BlockRemoved", "block_hashes": [H3], "medium": "CPU", "group_idx": 0},
    ],
    "data_parallel_rank": 0,
}
#: The same batch in the earlier array encoding: [ts, events, rank], each event [tag, fields...].
ARRAY_FIXTURE = [
    1717000000.5,
    [
        ["AllBlocksCleared"],
        ["BlockStored", [H1], None, [1, 2, 3], 3, None, "GPU"],
        ["BlockStored", [H2, H3], H1, [], 16, None, "CPU", None],
        ["BlockRemoved", [H3], "CPU"],
    ],
    0,
]
EXPECTED = (
    AllBlocksCleared(),
    BlockStored((H1,), None, 3, "GPU", (1, 2, 3)),
    BlockStored((H2, H3), H1, 16, "CPU"),
    BlockRemoved((H3,), "CPU"),
)


@pytest.mark.parametrize("fixture", [MAP_FIXTURE, ARRAY_FIXTURE], ids=["map", "array"])
def test_both_vllm_encodings_decode_from_fixtures(fixture: object) -> None:
    batch = decode_batch(msgpack.packb(fixture, use_bin_type=True))
    assert batch.events == EXPECTED
    assert (batch.ts, batch.data_parallel_rank, batch.malformed) == (1717000000.5, 0, 0)


def test_unknown_fields_are_ignored_in_both_encodings() -> None:
    as_map = {"ts": 1.0, "future_batch_field": {"x": 1}, "events": [
        {"type": "BlockRemoved", "block_hashes": [H1], "medium": None, "brand_new": [1, 2]}]}
    as_array = [1.0, [["BlockRemoved", [H1], None, 7, "a field vLLM adds later"]], None, "more"]
    for fixture in (as_map, as_array):
        assert decode_batch(msgpack.packb(fixture, use_bin_type=True)).events == (BlockRemoved((H1,), None),)


def test_malformed_events_are_counted_and_skipped_and_garbage_is_refused() -> None:
    fixture = {"ts": 2.0, "events": [
        {"type": "BlockStored", "block_hashes": "not a list", "parent_block_hash": None, "block_size": 1},
        {"type": "BlockStored", "block_hashes": [H1], "parent_block_hash": None, "block_size": -4},
        {"type": "Teleported"}, 17, [],
        {"type": "AllBlocksCleared"},
    ]}
    batch = decode_batch(msgpack.packb(fixture, use_bin_type=True))
    assert batch.events == (AllBlocksCleared(),) and batch.malformed == 5
    for payload in (b"\xc1", b"", msgpack.packb({"events": []}), msgpack.packb("text"), b"\x92\x01"):
        with pytest.raises(MalformedEvent):
            decode_batch(payload)


@pytest.mark.parametrize("layout", ["map", "array"])
def test_our_encoder_round_trips_in_both_layouts(layout: str) -> None:
    assert decode_batch(encode_batch(EXPECTED, ts=3.0, layout=layout)).events == EXPECTED
    with pytest.raises(ValueError, match="layout"):
        encode_batch(EXPECTED, layout="yaml")


def tree_held(tree: KVTree) -> dict[bytes | int, tuple[bytes | int | None, int]]:
    """The tree's segments as a router's view names them: path hash -> (parent hash, tokens)."""
    held: dict[bytes | int, tuple[bytes | int | None, int]] = {}
    for node in tree.nodes():
        path = node.path()
        held[path_hash(path)] = (path_hash(path[:-1]) if len(path) > 1 else None, node.tokens)
    return held


def churn(tree: KVTree, rng: random.Random, n: int, each: Callable[[int], None] = lambda i: None) -> None:
    """``n`` requests of 3 passages out of 8, inserted the way the engine does (evicting and demoting)."""
    for i in range(n):
        path = rng.sample("abcdefgh", 3)
        with tree.matching("model|system@1", path) as m:
            tree.insert("model|system@1", path, [S(rng.randint(40, 160)) for _ in range(4 - len(m.nodes))])
        each(i)


def test_every_change_of_the_tree_is_an_event_and_the_view_follows_it() -> None:
    tree = KVTree.simulated(CacheConfig(device="cpu", host_bytes=2000, disk_bytes=2500))
    churn(tree, random.Random(1), 20)  # nodes held before the subscription arrive as a snapshot
    log = EventLog()
    tree.subscribe(log.append)
    assert log.events[0] == AllBlocksCleared()
    churn(tree, random.Random(2), 300)
    stats = tree.stats()
    assert stats.evictions and stats.demotions and stats.promotions, "the churn must move and drop segments"
    view = KVView()
    for event in log.events:
        view.apply(event)
    assert view.held() == tree_held(tree)
    media = {"host": "CPU", "disk": "DISK"}
    for node in tree.nodes():
        assert view.blocks[path_hash(node.path())].media == {media[tree.tiers.names[node.tier]]}
    root = path_hash(["model|system@1"])
    assert view.roots == {root} and chain_hash(root, "a") == path_hash(["model|system@1", "a"])
    tree.close()
    assert log.events[-1] == AllBlocksCleared()


def test_the_view_plans_as_the_replica_plans() -> None:
    """The router's plan over the view names the replica's own order and cached tokens."""
    from slimrag.rag.plan import plan_passages

    tree = KVTree.simulated(CacheConfig(device="cpu", host_bytes=10**6))
    log = EventLog()
    tree.subscribe(log.append)
    churn(tree, random.Random(3), 40)
    view = KVView()
    for event in log.events:
        view.apply(event)
    rng = random.Random(4)
    for _ in range(50):
        ranked = rng.sample("abcdefgh", 4)
        mine, theirs = view.plan(ranked), plan_passages(ranked, tree, "model|system@1")
        assert (mine.order, mine.cached_tokens) == (theirs.order, theirs.cached_tokens)


# -- over ZMQ --------------------------------------------------------------------------------------


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> float:
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)
    return time.monotonic() - start


def test_a_replayed_gap_leaves_the_view_equal_to_the_tree() -> None:
    async def main() -> None:
        tree = KVTree.simulated(CacheConfig(device="cpu", host_bytes=3000, disk_bytes=3000))
        pub = EventPublisher(EventsConfig("tcp://127.0.0.1:*"))
        tree.subscribe(pub.put)
        stream = EventStream(pub.endpoint, pub.replay_endpoint)
        task = asyncio.create_task(stream.run())
        try:
            await until(lambda: stream.topic is not None or len(stream.view) == 0)
            await asyncio.sleep(0.2)
            rng = random.Random(5)

            async def pace(i: int) -> None:
                if i == 60:
                    stream.drop_next(7)  # seven batches lost on the wire

            for i in range(150):
                churn(tree, rng, 1)
                await pace(i)
                await asyncio.sleep(0.002)  # one batch per request, as a replica under light load
            # the publisher's thread may still hold queued events when the stream has caught up
            # with what it sent (seq counts batches sent), so wait for the view itself
            await until(lambda: stream.next_seq == pub.seq and stream.view.held() == tree_held(tree))
            assert stream.counts.gaps >= 1 and stream.counts.holes == 0 and stream.exact
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            pub.close()

    asyncio.run(main())


def test_a_restarted_replica_is_empty_within_a_second_and_rebuilt() -> None:
    async def main() -> None:
        tree = KVTree.simulated(CacheConfig(device="cpu", host_bytes=10**5))
        pub = EventPublisher(EventsConfig("tcp://127.0.0.1:*"))
        tree.subscribe(pub.put)
        stream = EventStream(pub.endpoint, pub.replay_endpoint)
        task = asyncio.create_task(stream.run())
        second: EventPublisher | None = None
        try:
            churn(tree, random.Random(6), 30)
            await until(lambda: stream.view.held() == tree_held(tree) and len(stream.view) > 0)
            pub.close()  # the replica dies; a new one comes up on the same ports with its own tree
            fresh = KVTree.simulated(CacheConfig(device="cpu", host_bytes=10**5))
            second = EventPublisher(EventsConfig(pub.endpoint, pub.replay_endpoint))
            fresh.subscribe(second.put)  # its first event: AllBlocksCleared
            took = await until(lambda: len(stream.view) == 0, timeout=1.0)
            churn(fresh, random.Random(7), 5)
            # exact only once the rebuild's replay has ended: the view equals the tree a moment
            # before that (its last batch applied, the end marker not yet read)
            await until(lambda: stream.exact and stream.view.held() == tree_held(fresh))
            assert took < 1.0
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            pub.close()
            if second is not None:
                second.close()

    asyncio.run(main())


def test_garbage_on_the_wire_is_counted_and_a_hole_falls_back() -> None:
    """A raw PUB socket stands in for a replica that sends malformed frames, then skips numbers its
    (empty) replay socket cannot give back: the stream counts, marks the view inexact, goes on."""

    async def main() -> None:
        ctx = zmq.Context()
        pub, replay = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)
        pub.bind("tcp://127.0.0.1:*")
        replay.bind("tcp://127.0.0.1:*")
        endpoint, replay_at = (s.getsockopt_string(zmq.LAST_ENDPOINT) for s in (pub, replay))
        stream = EventStream(endpoint, replay_at, replay_timeout_s=1.0)
        task = asyncio.create_task(stream.run())

        def send(seq: int, payload: bytes, topic: bytes = b"kv@x") -> None:
            pub.send_multipart([topic, seq.to_bytes(8, "big"), payload])

        async def answer_replays() -> None:  # every replay gets "nothing buffered"
            while True:
                while replay.poll(0):
                    ident, _, _ = replay.recv_multipart()
                    replay.send_multipart([ident, b"", (-1).to_bytes(8, "big", signed=True), b""])
                await asyncio.sleep(0.01)

        answering = asyncio.create_task(answer_replays())
        try:
            await until(lambda: stream.counts.replays == 1)  # the connection's rebuild
            await asyncio.sleep(0.1)
            stored = encode_batch([BlockStored((H1,), None, 5, "CPU")])
            send(0, stored)
            pub.send_multipart([b"kv@x", b"short", b""])  # a sequence number that is not 8 bytes
            pub.send_multipart([b"one frame"])
            send(1, b"\xc1 not msgpack")
            await until(lambda: stream.next_seq == 2)
            assert stream.counts.malformed == 3 and stream.exact and H1 in stream.view.blocks
            send(5, encode_batch([BlockStored((H2,), H1, 7, "CPU")]))  # 2-4 never come back
            await until(lambda: stream.next_seq == 6)
            assert not stream.exact and stream.counts.holes == 1 and H2 in stream.view.blocks
        finally:
            task.cancel()
            answering.cancel()
            await asyncio.gather(task, answering, return_exceptions=True)
            pub.close(linger=0)
            replay.close(linger=0)
            ctx.term()

    asyncio.run(main())


def test_events_config_is_checked() -> None:
    assert EventsConfig("tcp://127.0.0.1:5557").replay() == "tcp://127.0.0.1:5558"
    assert EventsConfig("tcp://*:*").replay() == "tcp://*:*"
    with pytest.raises(ValueError, match="tcp://"):
        EventsConfig("127.0.0.1:5557")
    with pytest.raises(ValueError, match="replay endpoint"):
        EventsConfig("ipc:///tmp/kv").replay()


def test_a_blend_replica_is_priced_by_every_entry_it_holds() -> None:
    """Under blend reuse a replica places each passage's entry (its segment right under the system
    segment) wherever the passage stands: the view counts every entry of a request's passages, where
    exact reuse counts only the path its plan walks."""
    tree = KVTree.simulated(CacheConfig(device="cpu", host_bytes=10**6))
    log = EventLog()
    tree.subscribe(log.append)
    sizes = {"a": 120, "b": 80, "c": 150}
    for key, n in sizes.items():  # what a blend replica stores: the system segment and entries only
        with tree.matching("model|system@1", [key]) as m:
            tree.insert("model|system@1", [key], [S(45), S(n)][len(m.nodes):])
    view = KVView()
    for event in log.events:
        view.apply(event)
    asked = ["d", "b", "a"]
    assert view.reusable(asked, "blend") == 45 + 80 + 120
    assert view.reusable(asked) == view.plan(asked).cached_tokens == 45 + 120  # one step of the path
    assert view.reusable(["d", "e"], "blend") == 45 and KVView().reusable(asked, "blend") == 0
    tree.close()


def test_events_config_names_the_reuse_its_events_are_read_by() -> None:
    assert EventsConfig("tcp://127.0.0.1:5557").reuse == "exact"
    assert EventsConfig("tcp://127.0.0.1:5557", reuse="blend").reuse == "blend"
    with pytest.raises(ValueError, match="reuse"):
        EventsConfig("tcp://127.0.0.1:5557", reuse="approximate")
