"""The four serving modes of ``bench.generation``, one class each, picked from :data:`MODES`.

Every mode serves a *burst* of requests (questions arrived together, each with its top-k
passages in relevance order) one prefill at a time, as the engine's prefill gate does, and
returns them in service order with their prompts. All modes share one loaded model; b, c and d
have one knowledge tree each, with the same byte budgets.

- ``a`` no reuse: relevance order, arrival order, ``LocalGenerator(cache=None)``.
- ``b`` prefix reuse in retrieval order: what vLLM's or SGLang's prefix cache gives. The cache is
  our tree keyed by segments; since each segment is tokenized on its own, matching a path of
  segment keys *is* token-prefix matching at segment granularity (a request can reuse a
  passage only when every token before it is the same). Arrival order (vLLM's FCFS).
- ``c`` ContextPilot (PyPI ``contextpilot`` 0.5.0, its CPU path ``ContextPilot(use_gpu=False)``):
  each burst's passage lists go through ``reorder`` (its context index: search, reorder to the
  matched node's prefix, insert), which also returns its execution order for the burst; same
  tree as b. Its own printing is silenced; its time is charged to the burst's requests.
- ``d`` slimrag: knowledge tree + planner + longest-cached-prefix-first admission. Each time the
  gate frees, every waiting request is planned against the tree as it is *now* and the one with
  the most cached tokens is admitted (:func:`slimrag.llm.engine.scheduler.pick_next`, the rule the
  engine's scheduler uses; the age bound is not reached inside a burst here); its prompt is the
  plan made at admission. Planning and scoring time is charged to the admitted request.
- ``e`` slimrag blend (issue 9): d's planner and admission, with ``CacheConfig(reuse="blend")``:
  passages past the exact prefix are placed from their position-independent entries and only a
  recompute set (one mode per recompute policy, ``--recompute``) and the question are prefilled.
  All e modes of a run share one tree (entries do not depend on the policy), so they see the
  same cache and their differences are the policy's alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from bench.qa_workload import Request
from slimrag.llm.engine.scheduler import pick_next
from slimrag.llm.kv.blend import BlendReuse
from slimrag.llm.kv.config import CacheConfig
from slimrag.llm.kv.tree import KVTree
from slimrag.llm.local import LocalGenerator
from slimrag.llm.weights import LoadedModel
from slimrag.prompt import Prompt
from slimrag.rag.plan import plan_prompt


@dataclass(frozen=True)
class Scheduled:
    """A request as a mode serves it: its prompt and the ordering time charged to it (s)."""

    request: Request
    prompt: Prompt
    overhead_s: float
    plan_s: float = 0.0  # one planning call alone (mode d), the planner overhead proper


def relevance_prompt(r: Request) -> Prompt:
    """Passages in relevance order (no ranking line: the order is the ranking)."""
    return plan_prompt(r.question, r.ranked, None)[0]


def pilot_prompts(burst: Sequence[Request], reordered: list[list[str]], schedule: list[int]
                  ) -> list[tuple[Request, Prompt]]:
    """The burst in ContextPilot's execution order, each with its passages in ContextPilot's order
    (``reordered`` and ``schedule`` as its ``reorder`` returns them for the burst's key lists)."""
    # Its two code paths (first build, incremental) index `reordered` differently (scheduled
    # vs arrival order), so pair each request with a reordered list of the same passages.
    pool = [list(ctx) for ctx in reordered]
    out = []
    for i in schedule:
        r = burst[i]
        by_key = {p.key: p for p in r.ranked}
        ctx = next(c for c in pool if sorted(c) == sorted(by_key))
        pool.remove(ctx)
        out.append((r, Prompt(r.question, tuple(by_key[k] for k in ctx), ranking=tuple(p.key for p in r.ranked))))
    return out


class Mode:
    """A serving mode: a generator and an order of service for a burst."""

    name = ""
    label = ""
    blend = False  # True: answers are compared with exact prefill of the same prompt (fidelity)

    def __init__(self, model: LoadedModel, cache: CacheConfig) -> None:
        self.gen = LocalGenerator(loaded=model, cache=cache)

    def serve(self, burst: Sequence[Request]) -> Iterator[Scheduled]:
        """The burst in service order with prompts, lazily: the next request is chosen only
        after the previous one was served. Default: arrival order, relevance order."""
        return iter([Scheduled(r, relevance_prompt(r), 0.0) for r in burst])


class NoReuse(Mode):
    name, label = "a", "no reuse"

    def __init__(self, model: LoadedModel, cache: CacheConfig) -> None:
        self.gen = LocalGenerator(loaded=model, cache=None)


class PrefixReuse(Mode):
    name, label = "b", "prefix cache, retrieval order"


class ContextPilotOrder(Mode):
    name, label = "c", "prefix cache + ContextPilot"

    def __init__(self, model: LoadedModel, cache: CacheConfig) -> None:
        super().__init__(model, cache)
        from contextpilot.server.live_index import ContextPilot

        self.pilot = ContextPilot(use_gpu=False)

    def serve(self, burst: Sequence[Request]) -> Iterator[Scheduled]:
        t = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            reordered, schedule = self.pilot.reorder([[p.key for p in r.ranked] for r in burst])
        share = (time.perf_counter() - t) / len(burst)
        return iter([Scheduled(r, prompt, share) for r, prompt in pilot_prompts(burst, reordered, schedule)])


class SlimragPlanner(Mode):
    name, label = "d", "slimrag tree + planner"

    def serve(self, burst: Sequence[Request]) -> Iterator[Scheduled]:
        waiting = list(burst)
        view = self.gen.planning_cache()
        while waiting:
            t = time.perf_counter()
            plans = [plan_prompt(r.question, r.ranked, view) for r in waiting]
            spent = time.perf_counter() - t
            scores = [lambda plan=plan: plan.cached_tokens for _, plan in plans]
            i = pick_next([0.0] * len(waiting), scores, 0.0, float("inf"))
            prompt = plans[i][0]
            r = waiting.pop(i)
            yield Scheduled(r, prompt, time.perf_counter() - t, spent / len(plans))


class BlendPlanner(SlimragPlanner):
    """Mode e for one recompute policy over a (shared) blend tree; ``name`` is e1, e2, ..."""

    name, label, blend = "e", "slimrag blend", True

    def __init__(self, model: LoadedModel, cache: CacheConfig, recompute: str = "boundary:8",
                 tree: KVTree | None = None, name: str = "e") -> None:
        tree = tree if tree is not None else KVTree(dataclasses.replace(cache, reuse="blend", recompute=recompute))
        self.gen = LocalGenerator(loaded=model, cache=BlendReuse(tree, cache.device, recompute=recompute))
        self.name, self.label, self.recompute = name, f"blend {recompute}", recompute


def blend_modes(model: LoadedModel, cache: CacheConfig, policies: Sequence[str]) -> list[Mode]:
    """One mode e per recompute policy, all over one tree with ``cache``'s budgets."""
    tree = KVTree(dataclasses.replace(cache, reuse="blend"))
    return [BlendPlanner(model, cache, policy, tree, f"e{i + 1}") for i, policy in enumerate(policies)]


MODES: dict[str, type[Mode]] = {m.name: m for m in (NoReuse, PrefixReuse, ContextPilotOrder, SlimragPlanner)}
