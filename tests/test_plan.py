"""The planner: cached path first, the rest by relevance, ranking preserved."""

from __future__ import annotations

import random

import pytest

from slimrag.llm.kv import CacheConfig, KVTree, SegmentKV
from slimrag.prompt import Passage
from slimrag.rag.plan import Plan, plan_passages, split_turn

S = SegmentKV.simulated


def tree_with(*paths: tuple[str, list[str], list[int]]) -> KVTree:
    tree = KVTree.simulated(CacheConfig(device="cpu", host_bytes=1 << 20))
    for root, path, tokens in paths:
        with tree.matching(root, path) as m:
            tree.insert(root, path, [S(n) for n in tokens[len(m.nodes):]])
    return tree


def test_empty_tree_or_no_tree_keeps_relevance_order() -> None:
    ranked = ["c", "b", "a", "d"]
    for tree in (None, tree_with()):
        plan = plan_passages(ranked, tree, "sys")
        assert plan == Plan(tuple(ranked), tuple(ranked))
    # A tree cached under another system prompt is another namespace.
    plan = plan_passages(ranked, tree_with(("other", ["a", "b"], [5, 5, 5])), "sys")
    assert plan.order == tuple(ranked) and plan.cached == 0


def test_cached_path_first_then_rest_by_relevance() -> None:
    tree = tree_with(("sys", ["a", "b", "x"], [10, 20, 30, 40]))
    plan = plan_passages(["c", "b", "e", "a", "d"], tree, "sys")
    assert plan.order == ("a", "b", "c", "e", "d")
    assert plan.ranking == ("c", "b", "e", "a", "d")
    assert (plan.cached, plan.cached_tokens) == (2, 60)


def test_prefers_longer_cached_child_then_relevance() -> None:
    tree = tree_with(("sys", ["x"], [5, 10]), ("sys", ["y"], [5, 50]))
    assert plan_passages(["x", "y"], tree, "sys").order == ("y", "x")
    tree = tree_with(("sys", ["x"], [5, 10]), ("sys", ["y"], [5, 10]))
    assert plan_passages(["y", "x"], tree, "sys").order == ("y", "x")
    assert plan_passages(["x", "y"], tree, "sys").order == ("x", "y")


def test_walk_follows_only_retrieved_children_and_has_no_side_effects() -> None:
    tree = tree_with(("sys", ["a", "e", "b"], [1, 1, 1, 1]), ("sys", ["a", "b"], [1, 1, 1]))
    before = tree.stats()
    plan = plan_passages(["b", "a", "b"], tree, "sys")  # duplicates keep their first place
    assert plan.order == ("a", "b") and plan.cached == 2 and plan.ranking == ("b", "a")
    assert tree.stats() == before


def test_wide_tree_scans_the_smaller_side() -> None:
    rng = random.Random(7)
    pool = [f"p{i}" for i in range(300)]
    paths = [("sys", rng.sample(pool, 3), [8, 8, 8, 8]) for _ in range(200)]
    tree = tree_with(*paths)
    for root, path, _ in paths[:20]:
        ranked = rng.sample([k for k in pool if k not in path], 5) + path[::-1]
        plan = plan_passages(ranked, tree, root)
        assert plan.cached >= 1  # greedy one-step look-ahead: some cached path, maybe not this one
        assert sorted(plan.order) == sorted(ranked) and plan.ranking == tuple(ranked)
        with tree.matching(root, list(plan.order)) as m:
            assert m.passages == plan.cached and m.tokens == plan.cached_tokens


def test_chat_turn_does_not_repeat_earlier_passages() -> None:
    turn = split_turn(["a", "b", "c", "a"], present={"b"})
    assert (turn.new, turn.repeated) == (("a", "c"), ("b",))
    tree = tree_with(("sys", ["c"], [4, 4]))
    plan = plan_passages(["a", "b", "c"], tree, "sys", present={"b"})
    assert plan.order == ("c", "a") and plan.earlier == ("b",) and plan.ranking == ("a", "c")


def test_plan_builds_a_prompt_with_the_ranking() -> None:
    passages = [Passage(k, f"doc/{k}.md#0", f"text {k}") for k in ["c", "b", "a"]]
    plan = plan_passages([p.key for p in passages], tree_with(("sys", ["a"], [3, 3])), "sys")
    prompt = plan.prompt("why?", passages)
    assert [p.key for p in prompt.passages] == ["a", "c", "b"]
    assert "Most relevant first: doc/c.md#0, doc/b.md#0, doc/a.md#0." in prompt.question_text()


def test_prefix_is_walked_first_and_must_be_cached() -> None:
    tree = tree_with(("sys", ["e1", "e2", "a", "b"], [4, 4, 4, 4, 4]))
    plan = plan_passages(["b", "c", "a"], tree, "sys", prefix=["e1", "e2"])
    assert plan.order == ("a", "b", "c") and plan.cached == 2 and plan.cached_tokens == 20
    # A prefix that is not cached makes nothing after it usable: relevance order.
    plan = plan_passages(["b", "c", "a"], tree, "sys", prefix=["e2", "e1"])
    assert plan.order == ("b", "c", "a") and plan.cached == 0


class View:
    """A planning view over a simulated tree, as an engine exposes it."""

    def __init__(self, tree: KVTree) -> None:
        self.tree = tree

    def root_key(self, prompt) -> str:  # noqa: ANN001
        return "m|" + prompt.system_key()

    def walk(self, root_key, choose):  # noqa: ANN001, ANN201
        return self.tree.walk(root_key, choose)


def test_plan_prompt_uses_content_keys_and_states_the_ranking() -> None:
    from slimrag.prompt import Prompt
    from slimrag.rag.plan import plan_prompt

    a, b, c = (Passage(k, f"doc/{k}.md#0", f"text of {k}") for k in "abc")
    tree = KVTree.simulated(CacheConfig(device="cpu", host_bytes=1 << 20))
    view = View(tree)
    first, plan = plan_prompt("q1", [a, b], view)
    assert [p.key for p in first.passages] == ["a", "b"] and plan.cached == 0
    segs = first.segments()
    root, path = view.root_key(first), [s.key for s in segs[1:-1]]
    assert path == [first.passage_key(a), first.passage_key(b)]
    tree.insert(root, path, [S(5), S(7), S(9)])
    prompt, plan = plan_prompt("q2", [c, b, a], view)
    assert [p.key for p in prompt.passages] == ["a", "b", "c"] and (plan.cached, plan.cached_tokens) == (2, 21)
    assert prompt.ranking == ("c", "b", "a")
    assert "Most relevant first: doc/c.md#0, doc/b.md#0, doc/a.md#0." in prompt.question_text()
    # Same chunk id, other text (another index, a rebuilt chunk): another key, never served.
    a2 = Passage("a", "doc/a.md#0", "changed text")
    assert Prompt("q", (a2,)).passage_key(a2) != first.passage_key(a)
    assert plan_prompt("q3", [a2, b], view)[1].cached == 0
    with pytest.raises(ValueError, match="share the key"):
        plan_prompt("q", [a, a2], view)


def test_chat_turn_keeps_earlier_passages_first_and_unrepeated() -> None:
    from slimrag.rag.plan import plan_prompt

    a, b, c = (Passage(k, f"doc/{k}.md#0", f"text of {k}") for k in "abc")
    prompt, plan = plan_prompt("again?", [c, a], None, earlier=[a, b], history=(("user", "q"), ("assistant", "x")))
    assert [p.key for p in prompt.passages] == ["a", "b", "c"]
    assert plan.earlier == ("a",) and plan.order == ("c",)
    assert "Most relevant first: doc/c.md#0, doc/a.md#0." in prompt.question_text()
    head = prompt.segments()[0].text
    assert "Earlier in this conversation" not in head  # history after the passages, not in the root
    assert "User: q\nAssistant: x" in prompt.segments()[-1].text
