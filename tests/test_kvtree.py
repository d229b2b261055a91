"""The knowledge tree: prefix matching, GDSF eviction, tiers and byte budgets.

Most tests use the simulated tree (sizes only); the disk round trip and the split/assemble helpers
use small real tensors.
"""

from __future__ import annotations

import random

import pytest

from slimrag.llm.kv import (
    EVICTION_POLICIES,
    CacheConfig,
    KVTree,
    Match,
    SegmentKV,
    assemble_kv,
    cache_layers,
    prefill_cost,
    split_kv,
)

S = SegmentKV.simulated


def host_tree(host_bytes: int = 1000, **kw: object) -> KVTree:
    return KVTree.simulated(CacheConfig(device="cpu", host_bytes=host_bytes, **kw))  # type: ignore[arg-type]


def keys(tree: KVTree) -> set[str]:
    return {n.key for n in tree.nodes()}


def add(tree: KVTree, root: str, path: list[str], payloads: list[SegmentKV],
        costs: list[float] | None = None) -> int:
    """Insert the way an engine does: match, insert the suffix, release."""
    with tree.matching(root, path):
        return tree.insert(root, path, payloads, costs)


def test_match_returns_longest_cached_prefix() -> None:
    tree = host_tree()
    assert add(tree, "sys", ["a", "b"], [S(10), S(20), S(30)]) == 3
    assert add(tree, "sys", ["a", "c"], [S(40)]) == 1
    m = tree.match("sys", ["a", "b", "d"])
    assert [n.key for n in m.nodes] == ["sys", "a", "b"]
    assert (m.tokens, m.passages) == (60, 2)
    tree.release(m)
    with tree.matching("sys", ["b", "a"]) as m:  # order matters: b is not a child of sys
        assert [n.key for n in m.nodes] == ["sys"]
    with tree.matching("other-system", ["a"]) as m:  # the root key is the namespace
        assert m.nodes == () and m.tokens == 0
    tree.check()


def test_insert_then_match_hits_and_counts() -> None:
    tree = host_tree()
    m = tree.match("sys", ["a", "b"])
    assert m.nodes == ()
    assert tree.insert("sys", ["a", "b"], [S(5), S(7), S(9)]) == 3
    tree.release(m)
    with tree.matching("sys", ["a", "b"]) as m:
        assert m.tokens == 21 and m.passages == 2
        assert [p.tokens for p in m.payloads] == [5, 7, 9]
    st = tree.stats()
    assert (st.requests, st.hits, st.misses, st.served_tokens, st.inserted_tokens) == (2, 3, 3, 21, 21)
    # Already present segments are kept, not replaced; a missing prefix adds nothing.
    assert tree.insert("sys", ["a", "b"], [S(99)]) == 0
    assert tree.insert("sys", ["zz", "b"], [S(1)]) == 0
    assert tree.insert("nope", ["a"], [S(1)]) == 0
    with pytest.raises(ValueError):
        tree.insert("sys", ["a"], [S(1), S(1), S(1)])
    with pytest.raises(ValueError):
        tree.release(m)  # released by the context manager already


def test_gdsf_evicts_lowest_priority_leaf_first_and_ages_the_clock() -> None:
    tree = host_tree(1000)
    add(tree, "sys", [], [S(10)], costs=[1000.0])
    for key, cost in [("a", 300.0), ("b", 100.0), ("c", 200.0)]:
        add(tree, "sys", [key], [S(20)], costs=[cost])
    order = []
    for _ in range(4):
        before = keys(tree)
        victim = min(tree.nodes(), key=lambda n: tree.priority(n) if not n.children else (float("inf"),))
        assert tree.evict(1) > 0
        (gone,) = before - keys(tree)
        assert gone == victim.key
        assert tree.clock == pytest.approx(tree.priority(victim)[0])
        order.append(gone)
    assert order == ["b", "c", "a", "sys"]
    assert tree.stats().evictions == 4 and tree.stats().tiers[0].used == 0


def test_eviction_order_matches_brute_force() -> None:
    rng = random.Random(99)
    tree = host_tree(1 << 20)
    paths = [rng.sample("abcdefghij", rng.randint(1, 4)) for _ in range(40)]
    for path in paths:
        add(tree, "sys", path, [S(rng.randint(1, 50)) for _ in range(len(path) + 1)],
            costs=[rng.uniform(1, 100) for _ in range(len(path) + 1)])
    for _ in range(100):
        tree.release(tree.match("sys", rng.choice(paths)))
    while before := {id(n): n for n in tree.nodes()}:
        victim = min((n for n in before.values() if not n.children), key=tree.priority)
        tree.evict(1)  # exactly one node goes: the lowest-priority leaf
        assert set(before) - {id(n) for n in tree.nodes()} == {id(victim)}
        tree.check()


def test_frequency_raises_priority() -> None:
    tree = host_tree()
    add(tree, "sys", ["a"], [S(10), S(20)])
    add(tree, "sys", ["b"], [S(20)])
    for _ in range(3):
        tree.release(tree.match("sys", ["a"]))
    tree.evict(1)
    assert keys(tree) == {"sys", "a"}


def test_pinned_nodes_are_never_evicted() -> None:
    tree = host_tree()
    add(tree, "sys", ["a"], [S(10), S(20)], costs=[1.0, 0.001])  # "a" is the cheapest
    add(tree, "sys", ["b"], [S(20)], costs=[1000.0])
    m = tree.match("sys", ["a"])
    assert tree.evict(10_000) == 20  # only "b" may go
    assert keys(tree) == {"sys", "a"}
    tree.release(m)
    assert tree.evict(10_000) == 30
    assert keys(tree) == set()


def test_internal_nodes_outlive_their_children() -> None:
    tree = host_tree()
    # "a" is far cheaper than its child "b", but only leaves are evictable.
    add(tree, "sys", ["a", "b"], [S(10), S(10), S(10)], costs=[100.0, 0.001, 100.0])
    add(tree, "sys", ["c"], [S(10)], costs=[50.0])
    tree.evict(1)
    assert "b" in keys(tree) and "c" not in keys(tree)  # c is the cheapest *leaf*
    tree.evict(1)
    assert keys(tree) == {"sys", "a"}  # b went before its parent a
    tree.evict(1)
    assert keys(tree) == {"sys"}


@pytest.mark.parametrize("policy", sorted(EVICTION_POLICIES))
def test_random_workload_stays_within_budgets(policy: str) -> None:
    rng = random.Random(1234)
    cfg = CacheConfig(device="cuda", device_bytes=400, host_bytes=600, disk_bytes=900, policy=policy)
    tree = KVTree.simulated(cfg)
    size = {f"p{i}": rng.randint(5, 80) for i in range(40)} | {"s1": 30, "s2": 45}
    queries = [(rng.choice(["s1", "s2"]), rng.sample(sorted(size)[:40], rng.randint(1, 4))) for _ in range(60)]
    weights = [1 / (i + 1) for i in range(len(queries))]  # skewed, as real queries are
    held: list[Match] = []
    for _ in range(2000):
        r = rng.random()
        if r < 0.65:
            root, path = rng.choices(queries, weights)[0]
            m = tree.match(root, path)
            segs = [root, *path]
            tree.insert(root, path, [S(size[k]) for k in segs[len(m.nodes):]])
            if len(held) < 4 and rng.random() < 0.3:
                held.append(m)
            else:
                tree.release(m)
        elif r < 0.85 and held:
            tree.release(held.pop(rng.randrange(len(held))))
        else:
            tree.evict(rng.randint(1, 500), tier=rng.randrange(3))
        tree.check()
        for t in tree.stats().tiers:
            assert t.peak <= t.budget and t.used <= t.budget
        for m in held:  # pinned: still in the tree and in memory
            for node in m.nodes:
                assert node.kv is not None
                parent = node.parent
                assert parent is not None and parent.children.get(node.key) is node
    for m in held:
        tree.release(m)
    st = tree.stats()
    assert st.hits > 0 and st.evictions > 0 and st.demotions > 0 and st.promotions > 0
    assert all(n.pins == 0 for n in tree.nodes())


def test_tiers_demote_then_promote_on_hit() -> None:
    cfg = CacheConfig(device="cuda", device_bytes=30, host_bytes=30, disk_bytes=30)
    tree = KVTree.simulated(cfg)
    for key in "abc":
        add(tree, "sys", [key], [S(10), S(10)] if key == "a" else [S(10)])
    # sys + a + b fill the device; c pushed the coldest leaf (a) down to host.
    st = tree.stats()
    assert [t.used for t in st.tiers] == [30, 10, 0] and st.demotions == 1
    with tree.matching("sys", ["a"]) as m:
        assert m.passages == 1
        assert {n.key: n.tier for n in tree.nodes()}["a"] == 0
    assert tree.stats().promotions == 1
    tree.evict(30, tier=1)  # whatever is in host goes to disk, written once
    tree.check()
    assert tree.stats().tiers[2].used > 0


def test_disk_round_trip_returns_identical_tensors(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(0)

    def seg(n: int) -> SegmentKV:
        return SegmentKV.from_layers(
            [(torch.randn(1, 2, n, 4, generator=gen), torch.randn(1, 2, n, 4, generator=gen)) for _ in range(3)])

    sysk, a = seg(3), seg(5)
    cfg = CacheConfig(device="cpu", host_bytes=sysk.nbytes + a.nbytes, disk_bytes=1 << 20, disk_dir=str(tmp_path))
    tree = KVTree(cfg)
    add(tree, "sys", ["a"], [sysk, a])
    assert tree.evict(cfg.host_bytes) == cfg.host_bytes  # a, then sys, go to disk
    files = list(tmp_path.rglob("*.pt"))
    assert len(files) == 2 and tree.stats().tiers[1].used == cfg.host_bytes
    with tree.matching("sys", ["a"]) as m:
        assert m.passages == 1 and tree.stats().promotions == 2
        for got, want in zip(m.payloads, [sysk, a], strict=True):
            for (gk, gv), (wk, wv) in zip(got.layers, want.layers, strict=True):
                assert torch.equal(gk, wk) and torch.equal(gv, wv)
    tree.evict(cfg.host_bytes)  # files were kept: the second demotion writes nothing new
    assert sorted(tmp_path.rglob("*.pt")) == sorted(files) and tree.stats().demotions == 4
    tree.check()
    tree.close()
    assert list(tmp_path.rglob("*.pt")) == []


def test_split_and_assemble_round_trip() -> None:
    torch = pytest.importorskip("torch")
    from slimrag.llm.model import KVCache

    gen = torch.Generator().manual_seed(1)
    full = [(torch.randn(1, 3, 12, 8, generator=gen), torch.randn(1, 3, 12, 8, generator=gen)) for _ in range(2)]
    cache = KVCache.seeded(full, dtype=torch.float32, device="cpu")
    layers = cache_layers(cache)
    parts = split_kv(layers, [4, 3, 2])  # positions 9..11 (the question) are not cached
    assert [p.tokens for p in parts] == [4, 3, 2]
    assert parts[0].layers[0][0].data_ptr() != full[0][0].data_ptr()  # copies, not views
    joined = assemble_kv(parts[:2])
    for (k, v), (fk, fv) in zip(joined, full, strict=True):
        assert torch.equal(k, fk[:, :, :7]) and torch.equal(v, fv[:, :, :7])
    assert [p.tokens for p in split_kv(layers, [4, 3, 2], first=1)] == [3, 2]
    with pytest.raises(ValueError):
        split_kv(layers, [10, 5])


def test_engine_flow_with_tensors() -> None:
    """match -> assemble -> prefill the rest -> split -> insert -> release, as the engine does."""
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(2)
    tree = KVTree(CacheConfig(device="cpu", host_bytes=1 << 20))
    lengths = {"sys": 4, "a": 3, "b": 5}
    prompt_kv = [(torch.randn(1, 2, 14, 4, generator=gen), torch.randn(1, 2, 14, 4, generator=gen))]
    for path in (["a"], ["a", "b"]):
        segs = ["sys", *path]
        with tree.matching("sys", path) as m:
            if m.nodes:
                prefix = assemble_kv(m.payloads)
                assert torch.equal(prefix[0][0], prompt_kv[0][0][:, :, : m.tokens])
            tree.insert("sys", path, split_kv(prompt_kv, [lengths[s] for s in segs], first=len(m.nodes)))
    assert tree.stats().served_tokens == 7 and tree.stats().inserted_tokens == 12


def test_config_validation_and_helpers() -> None:
    with pytest.raises(ValueError):
        CacheConfig(policy="random")
    with pytest.raises(ValueError):
        CacheConfig(host_bytes=-1)
    with pytest.raises(ValueError):
        CacheConfig(device="cpu", host_bytes=0)
    assert [n for n, _ in CacheConfig(device="cpu", disk_bytes=1).tiers()] == ["host", "disk"]
    assert [n for n, _ in CacheConfig(device="cuda:0").tiers()] == ["device", "host"]
    assert prefill_cost(100, 4000) > prefill_cost(100, 0) > 0


def test_threads_share_one_tree() -> None:
    import threading

    tree = KVTree.simulated(CacheConfig(device="cuda", device_bytes=300, host_bytes=300, disk_bytes=300))
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(300):
                path = rng.sample("abcdefgh", rng.randint(1, 3))
                with tree.matching("sys", path) as m:
                    tree.insert("sys", path, [S(rng.randint(5, 40)) for _ in range(len(path) + 1 - len(m.nodes))])
                    assert all(n.kv is not None for n in m.nodes)
        except BaseException as exc:  # handed to the main thread, which fails the test
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    tree.check()
    assert all(n.pins == 0 for n in tree.nodes())


def test_cached_prefix_gives_the_same_logits_as_a_full_prefill() -> None:
    """Ground truth with a tiny random Llama on the engine: KV served by the tree equals KV
    computed afresh."""
    torch = pytest.importorskip("torch")
    from slimrag.llm.model import Decoder, KVCache, ModelConfig

    torch.manual_seed(0)
    cfg = ModelConfig(arch="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, rms_eps=1e-6, max_positions=128)
    shapes = {"model.embed_tokens.weight": (64, 32), "model.norm.weight": (32,), "lm_head.weight": (64, 32)}
    for i in range(2):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (32,), p + "post_attention_layernorm.weight": (32,),
                   p + "self_attn.q_proj.weight": (32, 32), p + "self_attn.k_proj.weight": (16, 32),
                   p + "self_attn.v_proj.weight": (16, 32), p + "self_attn.o_proj.weight": (32, 32),
                   p + "mlp.gate_proj.weight": (64, 32), p + "mlp.up_proj.weight": (64, 32),
                   p + "mlp.down_proj.weight": (32, 64)}
    model = Decoder.from_state_dict(cfg, {n: torch.randn(s) * 0.2 for n, s in shapes.items()})
    segs = {"sys": [1, 5, 9, 2], "a": [7, 7, 3], "b": [11, 4, 8, 8, 6], "q": [13, 2]}

    def forward(ids: list[int], cache: KVCache, start: int) -> torch.Tensor:
        with torch.no_grad():
            out = model.forward(torch.tensor(ids), torch.arange(start, start + len(ids)), cache)
        assert out is not None
        return out

    tree = KVTree(CacheConfig(device="cpu", host_bytes=1 << 20))
    keys = ["a", "b"]
    ids = segs["sys"] + segs["a"] + segs["b"] + segs["q"]
    want = forward(ids, model.new_cache(), 0)
    for _ in range(2):  # cold, then warm
        with tree.matching("sys", keys) as m:
            cache = (KVCache.seeded(assemble_kv(m.payloads), dtype=torch.float32, device="cpu") if m.nodes
                     else model.new_cache())
            got = forward(ids[m.tokens:], cache, m.tokens)
            lengths = [len(segs[k]) for k in ["sys", *keys]]
            tree.insert("sys", keys, split_kv(cache_layers(cache), lengths, first=len(m.nodes)))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert tree.stats().served_tokens == 12
