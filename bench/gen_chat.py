"""Multi-turn workload of ``bench.generation`` (issue 9, part 3): TTFT of chat follow-ups.

``python -m bench.generation --workloads multiturn`` (``--conversations`` 6, ``--turns`` 3):

- Conversations: ``--conversations`` disfl_qa passages with at least ``--turns`` questions each
  (seeded); a conversation asks ``--turns`` of its passage's questions in turn through
  `slimrag.rag.chat.Chat` over the flat index, top-``--k`` (4) per turn. A follow-up is retrieved
  on the question and on the question after the previous one (merged), so it brings partly new
  passages; passages already in the conversation are not repeated.
- Modes, each with its own `Chat` over one shared model (answers are greedy, so in exact mode
  both see the very same conversation, which the ``same`` column checks):

  - ``a`` no reuse (``cache=None``): every turn prefills its whole prompt;
  - ``d`` exact tree + turn replay (``CacheConfig()``, ``Chat(replay=True)``, opt-in): after each answer the chat
    keeps the turn and its answer in the tree (``Generator.keep``: the question and answer
    segments in one forward each, off the first-token path), so turn n+1 prefills only its new
    passages and question;
  - ``q`` (optional, ``--chat-modes adq``) exact tree without replay (``Chat.replay = False``,
    the default chat), earlier passages reused but the question segment, which carries the
    earlier questions, prefilled every turn; its prompts differ from a's (no answers in them).

- Measured per turn: engine TTFT (tokenize, match, prefill, first token; the usage of the
  engine's own last delta, so retrieval is left out and equal for all modes anyway), prompt and
  computed tokens, and for ``d`` the seconds and tokens of the ``keep`` after the answer (work
  between turns, not on any TTFT). Modes run turn by turn in a rotating order so a noisy
  neighbour hits them alike.

Reported: per mode and turn, mean TTFT, prompt tokens, computed tokens, the ratio to mode a, the
share of turns whose answer equals mode a's, and the share of follow-ups whose answer repeats the
previous turn's word for word (``repeat``: a small model shown its own answer tends to copy it).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Iterator, Sequence
from typing import Any

from slimrag.config import GenerationConfig
from slimrag.llm.base import Delta
from slimrag.llm.kv.config import CacheConfig
from slimrag.llm.local import LocalGenerator
from slimrag.prompt import Prompt, Segment
from slimrag.types import Usage


class _Engine(LocalGenerator):
    """The embedded engine, noting each request's own usage (engine TTFT) and each keep's cost."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.last: Usage | None = None
        self.keep_s, self.kept = 0.0, 0

    def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
        self.last = None
        for delta in super().stream(prompt, config):
            if delta.usage is not None:
                self.last = delta.usage
            yield delta

    def keep(self, segments: Sequence[Segment]) -> int:
        t = time.perf_counter()
        self.kept = super().keep(segments)
        self.keep_s = time.perf_counter() - t
        return self.kept


def conversations(n: int, turns: int, seed: int = 0) -> list[list[tuple[str, str]]]:
    """``n`` conversations of ``turns`` (question, gold answer) pairs, each about one passage."""
    from bench.qa_workload import passages_and_questions

    _, by_passage = passages_and_questions()
    rng = random.Random(seed)
    eligible = sorted(pid for pid, qs in by_passage.items() if len(qs) >= turns)
    return [[(qa.question, qa.answer) for qa in rng.sample(by_passage[pid], turns)]
            for pid in rng.sample(eligible, n)]


def run(args: argparse.Namespace, model: Any, checkpoint: Any) -> dict[str, Any]:
    """Serve the conversations in every mode (see the module header)."""
    from bench.qa_workload import f1, flat_index
    from slimrag.rag.guards import Guards
    from slimrag.rag.pipeline import RAG

    cache = CacheConfig(device=str(model.model.device), device_bytes=args.device_mib << 20,
                        host_bytes=args.host_mib << 20, disk_bytes=args.disk_mib << 20)
    specs = {"a": ("no reuse", None, True), "d": ("exact tree + turn replay", cache, True),
             "q": ("exact tree, no replay", cache, False)}
    modes = list(args.chat_modes)
    engines = {m: _Engine(loaded=model, cache=specs[m][1]) for m in modes}
    cfg = GenerationConfig(max_new_tokens=args.chat_new_tokens)
    idx = flat_index()
    convs = conversations(args.conversations, args.turns, args.seed)
    rows: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    t_start = time.perf_counter()
    engines[modes[0]].generate(Prompt("warm up"), cfg)  # page the weights in for nobody's TTFT
    for c, conv in enumerate(convs):
        chats = {}
        for m in modes:
            rag = RAG(idx, engines[m], generation=cfg, guards=Guards(floor=None, stop_loops=False))
            chats[m] = rag.chat()
            chats[m].replay = specs[m][2]
        for t, (question, gold) in enumerate(conv):
            order = modes[(c + t) % len(modes):] + modes[: (c + t) % len(modes)]
            for m in order:
                answer = chats[m].ask(question, k=args.k)
                u = engines[m].last
                assert u is not None, "the engine's last delta carries usage"
                rows[m].append({"conv": c, "turn": t + 1, "ttft_s": u.ttft_s, "prompt": u.prompt_tokens,
                                "cached": u.cached_tokens, "keep_s": engines[m].keep_s,
                                "kept": engines[m].kept, "answer": answer.text, "f1": f1(answer.text, gold)})
                engines[m].keep_s, engines[m].kept = 0.0, 0
        print(f"  multiturn: {c + 1}/{len(convs)} conversations, {time.perf_counter() - t_start:.0f} s", flush=True)
        result = summary(modes, specs, rows, args.turns, time.perf_counter() - t_start, c + 1, len(convs))
        checkpoint(result)
    for gen in engines.values():
        gen.close()
    return result


def summary(modes: list[str], specs: dict[str, Any], rows: dict[str, list[dict[str, Any]]], turns: int,
            wall_s: float, done: int, of: int) -> dict[str, Any]:
    """Per mode and turn: means of TTFT, prompt, computed tokens and keep cost; answers equal to a's."""
    reference = {(r["conv"], r["turn"]): r["answer"] for r in rows.get("a", [])}
    answers = {m: {(r["conv"], r["turn"]): r["answer"].strip() for r in rows[m]} for m in modes}
    out: dict[str, Any] = {"conversations": done, "of": of, "wall_s": wall_s, "modes": {}}
    for m in modes:
        per_turn = {}
        for t in range(1, turns + 1):
            rs = [r for r in rows[m] if r["turn"] == t]
            per_turn[str(t)] = {
                "ttft_mean_s": statistics.mean(r["ttft_s"] for r in rs),
                "prompt": statistics.mean(r["prompt"] for r in rs),
                "computed": statistics.mean(r["prompt"] - r["cached"] for r in rs),
                "keep_s": statistics.mean(r["keep_s"] for r in rs),
                "kept": statistics.mean(r["kept"] for r in rs),
                "same_as_a": 100 * statistics.mean(r["answer"] == reference[(r["conv"], r["turn"])] for r in rs)
                if reference else None,
                "f1": 100 * statistics.mean(r["f1"] for r in rs),
                "repeat": 100 * statistics.mean(r["answer"].strip() == answers[m][(r["conv"], t - 1)] for r in rs)
                if t > 1 else None,
            }
        out["modes"][m] = {"label": specs[m][0], "turns": per_turn, "rows": rows[m]}
    return out


def table(res: dict[str, Any]) -> str:
    """The result as a text table: one line per mode and turn."""
    lines = [f"multiturn ({res['conversations']} of {res['of']} conversations, {res['wall_s']:.0f} s)",
             f"{'mode':<30}{'turn':>5}{'TTFT mean':>10}{'vs a':>7}{'prompt':>8}{'computed':>9}"
             f"{'keep':>7}{'kept':>6}{'same':>7}{'F1':>6}{'repeat':>8}"]
    base = res["modes"].get("a", {}).get("turns", {})
    for m, mode in res["modes"].items():
        for t, row in mode["turns"].items():
            ratio = f"{base[t]['ttft_mean_s'] / row['ttft_mean_s']:.2f}x" if t in base else "-"
            same = f"{row['same_as_a']:.0f}%" if row["same_as_a"] is not None else "-"
            repeat = f"{row['repeat']:.0f}%" if row.get("repeat") is not None else "-"
            lines.append(f"{m} {mode['label']:<28}{t:>5}{row['ttft_mean_s']:>9.2f}s{ratio:>7}{row['prompt']:>8.0f}"
                         f"{row['computed']:>9.0f}{row['keep_s']:>6.2f}s{row['kept']:>6.0f}{same:>7}{row['f1']:>6.1f}"
                         f"{repeat:>8}")
    return "\n".join(lines)


def add_args(ap: argparse.ArgumentParser) -> None:
    """The multi-turn workload's options."""
    ap.add_argument("--conversations", type=int, default=6, help="multiturn: conversations")
    ap.add_argument("--turns", type=int, default=3, help="multiturn: questions per conversation")
    ap.add_argument("--chat-modes", default="ad", help="multiturn: a no reuse, d exact + replay, q exact, no replay")
    ap.add_argument("--chat-new-tokens", type=int, default=24, help="multiturn: longest answer, in tokens")
