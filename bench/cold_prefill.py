"""Cold prefill of one ~1,300-token RAG prompt, run under whichever source tree is on ``PYTHONPATH``.

Why a separate script: issue 28 asks for the prefill of a 1,000-token RAG prompt against the engine
before it, *in the same run*. The engine before lives in another commit, so each tree runs this file
in its own process, alternately (a worktree of the old commit, ``PYTHONPATH=WT/src``), and the table
is the printed JSON lines side by side. It uses only the API both trees have (``weights.load_model``,
``slimrag.llm.reference.greedy_ids``, the ``LocalGenerator.greedy_ids`` method before it, ``Prompt``/``Passage``).

What it times: ``greedy_ids(gen, prompt, 1)`` with no KV reuse (``cache=None``) on one torch thread:
tokenization, the prefill forward(s) and the first token; one warm-up, then the median of
``REPEAT``. ``--threads N`` runs on N torch threads instead. The prompt: the system segment, four passages of 160 words cut from the words file
(``--words``, e.g. ``docs/architecture.md``), and a question. ``DENSE_ROWS=N`` in the environment
loads the model with ``dense_rows=N`` (long forwards through a float32 copy).

Run: ``flock /tmp/slimrag-timing.lock python bench/cold_prefill.py --repeat 3 --label after``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--label", default="tree")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--words", type=Path, default=Path(__file__).resolve().parent.parent / "docs" / "architecture.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from slimrag.llm import weights
    from slimrag.llm.local import LocalGenerator
    try:
        from slimrag.llm.reference import greedy_ids
    except ImportError:  # a source tree from before slimrag.llm.reference (the old engine this bench compares)
        def greedy_ids(gen: LocalGenerator, prompt: Prompt, n: int) -> tuple[list[int], int]:
            return gen.greedy_ids(prompt, n)  # type: ignore[attr-defined, no-any-return]
    from slimrag.prompt import Passage, Prompt

    words = args.words.read_text().split()
    passages = tuple(Passage(f"p{i}", f"docs/part{i}.md#0", " ".join(words[i * 160:(i + 1) * 160]))
                     for i in range(4))
    prompt = Prompt("What does the engine compute decode on, and why?", passages)
    dense = int(os.environ["DENSE_ROWS"]) if os.environ.get("DENSE_ROWS") else None
    loaded = weights.load_model(device="cpu", **({"dense_rows": dense} if dense else {}))
    gen = LocalGenerator(loaded=loaded, cache=None)
    n = sum(len(s) for s in gen.encode_segments(prompt))
    greedy_ids(gen, prompt, 1)  # warm-up
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        greedy_ids(gen, prompt, 1)
        times.append(time.perf_counter() - t)
    med = statistics.median(times)
    print(json.dumps({"tree": args.label, "dense_rows": dense, "threads": args.threads, "prompt_tokens": n,
                      "median_s": round(med, 3),
                      "tok_per_s": round(n / med, 1), "times": [round(x, 3) for x in times],
                      "loadavg_1m": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
