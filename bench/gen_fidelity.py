"""Fidelity of blend reuse against exact reuse on the same prompt (``bench.generation`` mode e).

For a prompt served in blend mode, the reference is the same prompt prefilled exactly (no reuse;
exact reuse gives the same tokens, see ``tests/test_warm.py``), decoded greedily as the
benchmark's ``GenerationConfig`` does (stop at the first newline or ``max_new`` tokens or EOS).
Three measures per request:

- identical: the blend answer's first line equals the exact one's;
- KL: the mean over the exact answer's tokens of KL(exact || blend) of the next-token
  distributions, the blend side teacher-forced over the exact answer (so one early flip does not
  make every later step incomparable);
- F1 of the exact answer against gold (the "F1 of exact" the blend F1 is compared with).

Both passes go through the strategies' own prefill (``Lease.prefill``) and the engine's model
call, never a copy of the engine loop. Reference runs are cached by prompt: the blend modes of
one run share one tree and usually plan the same prompt, so each prompt is prefilled exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slimrag.llm.kv.payload import cache_layers
from slimrag.llm.local import LocalGenerator
from slimrag.prompt import Prompt


@dataclass(frozen=True)
class Reference:
    """The exact answer of one prompt: its first line, its token ids and their log-probabilities."""

    text: str
    ids: list[int]
    logprobs: Any  # torch.Tensor [len(ids), vocab]


def eos_ids(gen: LocalGenerator) -> frozenset[int]:
    """The ids that end a turn (the tokenizer's EOS and ChatML's end tokens)."""
    tok = gen.load().tokenizer
    vocab = tok.get_vocab()
    ids = {vocab[t] for t in ("<|im_end|>", "<|endoftext|>") if t in vocab}
    if tok.eos_token_id is not None:
        ids.add(int(tok.eos_token_id))
    return frozenset(ids)


def prompt_logprobs(gen: LocalGenerator, prompt: Prompt, forced: list[int] | None, max_new: int
                    ) -> tuple[list[int], Any]:
    """Prefill ``prompt`` through ``gen``'s reuse strategy, then either decode greedily (``forced``
    None: until EOS, a newline in the text, or ``max_new`` tokens) or teacher-force ``forced``;
    returns the ids and the next-token log-probabilities before each of them."""
    import torch

    segments = prompt.segments()
    seg_ids = gen.encode_texts([s.text for s in segments])
    root, path = gen.cache_path(segments)
    with gen.reuse.lease(root, path) as lease:
        cache, logits = lease.prefill(gen.runner, seg_ids)
    lease.store(cache_layers(cache), [len(s) for s in seg_ids[:-1]])
    pos = sum(len(s) for s in seg_ids)
    rows = [torch.log_softmax(logits, dim=-1)]
    if forced is not None:
        if len(forced) > 1:
            model = gen.runner.model
            with torch.inference_mode():
                out = model.forward(torch.tensor(forced[:-1]), torch.arange(pos, pos + len(forced) - 1), cache,
                                    logits="all")
            rows.extend(torch.log_softmax(out, dim=-1))
        return list(forced), torch.stack(rows)
    eos, ids = eos_ids(gen), []
    while True:
        ids.append(int(torch.argmax(rows[-1]).item()))
        if ids[-1] in eos or len(ids) >= max_new or "\n" in gen.decode(ids):
            return ids, torch.stack(rows)
        out = gen.runner.forward(torch.tensor([ids[-1]]), torch.tensor([pos]), cache)
        rows.append(torch.log_softmax(out, dim=-1))
        pos += 1


class Fidelity:
    """Exact references (cached by prompt) and the per-request comparison for blend modes."""

    def __init__(self, model: Any, max_new: int) -> None:
        self.exact = LocalGenerator(loaded=model, cache=None)
        self.max_new = max_new
        self._refs: dict[tuple[str, ...], Reference] = {}

    def reference(self, prompt: Prompt) -> Reference:
        key = tuple(s.text for s in prompt.segments())
        if key not in self._refs:
            ids, logprobs = prompt_logprobs(self.exact, prompt, None, self.max_new)
            text = self.exact.decode(ids).strip().split("\n")[0]
            self._refs[key] = Reference(text, ids, logprobs)
        return self._refs[key]

    def compare(self, gen: LocalGenerator, prompt: Prompt, answer: str) -> dict[str, Any]:
        """``identical`` (0/1), ``kl`` (nats per token) and the exact ``reference`` text of a blend
        answer ``answer`` produced by ``gen`` for ``prompt``."""
        ref = self.reference(prompt)
        _, got = prompt_logprobs(gen, prompt, ref.ids, self.max_new)
        kl = (ref.logprobs.exp() * (ref.logprobs - got)).sum(dim=-1).mean().item()
        return {"identical": float(answer == ref.text), "kl": max(0.0, kl), "reference": ref.text}
