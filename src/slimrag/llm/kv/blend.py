"""Blend reuse: a passage's KV reused wherever it stands in the prompt (EPIC, CacheBlend).

Exact reuse (:mod:`slimrag.llm.kv.reuse`) serves a passage only behind the very passages it was
computed behind, which caps the cached share of a RAG prompt near 45% (``bench.gen_bound``).
Blend reuse goes past that ceiling by giving up bitwise exactness, with fidelity measured
(``docs/bench_generation.md``); exact reuse stays the default.

Entries. A passage's *position-independent entry* is its KV computed right after the system
segment, at positions ``[len(system), len(system) + n)``. That is exactly the knowledge tree's
node ``root → passage`` (depth 1), so entries are tree nodes: one byte budget, one set of tiers,
one eviction policy for exact paths and entries alike; nothing is stored twice.

A request ``[system][p1]...[pn][question]`` in blend mode (:meth:`_BlendLease.prefill`):

1. The exact prefix comes from the tree (``KVTree.match``), as in exact mode; a missing system
   segment is computed first.
2. Every later passage with an entry is *placed*: its entry's V as is, its K re-rotated by the
   offset ``Δ = start - len(system)`` (RoPE rotations compose, ``R(p + Δ) = R(Δ) R(p)``; the
   rotation is the engine's own RoPE (:meth:`slimrag.llm.model.Rope.shift`) at Δ, so this step
   is exact to float rounding). A passage *without* an entry is not placed: all its tokens join the tokens
   computed in full context in step 4 (exact, like a prefill), and its entry (one forward over
   its tokens after the system segment only) is computed when the lease stores, after the
   first token. An unseen passage thus costs one in-context forward on the first-token path,
   not an entry forward plus a recompute (as it did before; the entry is paid off that path).
3. The recompute policy (:mod:`slimrag.llm.kv.recompute`) picks placed tokens whose K/V are
   computed again in full context; a passage placed at Δ = 0 is exact and never recomputed.
   ``deviation`` first runs every token after the exact prefix through the first layers to
   score each placed token's K/V deviation.
4. The recomputed tokens and the question are prefilled on top of the placed K/V with the
   model's own layers: their true positions, and an attention mask by position (a query at
   position q sees every key at a position ≤ q), in one forward. Only the limiting policy
   (``all``, ``RecomputePolicy.exact``) runs one forward per segment as exact mode does, so its
   tokens stay bitwise exact; for the others the schedule changes nothing but float rounding,
   and each forward saved is a pass over the weights (on this CPU ~0.5 s a forward under load:
   ``boundary:8`` over three placed passages took 3.8 s with four forwards).
   Key order in the cache does not matter to attention under an explicit mask, so the cache is
   sorted into position order afterwards and decoding proceeds as usual.

Limiting case: with every placed token recomputed (``recompute="all"``) the cache holds what an
exact prefill computes, segment by segment, and the tokens equal exact mode's (tested on SmolLM2
and on a Qwen2 config); every cheaper policy trades only fidelity.

Every RoPE variant the engine runs (``default``, ``linear``, ``llama3``, ``yarn``) has a
rotation linear in the position, so keys can always be re-rotated. Blend never inserts deeper exact paths: the KV of a passage placed
behind others is approximate, so only system segments and entries are stored.

Usage: ``Lease.tokens`` (``Usage.cached_tokens``) counts prompt tokens served from the cache and
not recomputed; ``Lease.recomputed`` (``Usage.recomputed_tokens``) the tokens served from the
cache and computed again anyway. A passage that had no entry counts in neither: it was computed
in context like any uncached token.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from slimrag.llm.kv.payload import SegmentKV, assemble_kv
from slimrag.llm.kv.recompute import DEVIATION_LAYER, RecomputePolicy, Span, parse_recompute
from slimrag.llm.kv.reuse import Layers, Lease, PrefillEngine, TreeReuse
from slimrag.llm.kv.tree import KVTree, Match

if TYPE_CHECKING:
    import torch

    from slimrag.llm.model import Decoder, KVCache


class Rotary:
    """Re-rotates RoPE keys by a position offset with the decoder's own RoPE (``model.rope``)."""

    def __init__(self, model: Decoder) -> None:
        self.rope = model.rope

    def shift(self, k: torch.Tensor, deltas: torch.Tensor) -> torch.Tensor:
        """``k`` (``[1, heads, n, head_dim]``) with token i rotated further by ``deltas[i]``
        positions (a long tensor of n offsets), computed in float32."""
        return self.rope.shift(k, deltas)


class _BlendLease(Lease):
    reuse = "blend"

    def __init__(self, tree: KVTree, match: Match, entries: Match, policy: RecomputePolicy,
                 device: str | None) -> None:
        self.tree, self.match, self.entries, self.policy, self.device = tree, match, entries, policy, device
        self.segments, self.tokens = len(match.nodes), match.tokens
        self._pending: list[tuple[list[str], SegmentKV]] = []  # (path, payload) to insert in store()
        # what store() needs to compute the entries of passages seen for the first time
        self._unseen: list[tuple[str, list[int]]] = []  # (key, token ids)
        self._engine: PrefillEngine | None = None
        self._system: tuple[list[int], Layers] = ([], [])  # the system segment's ids and K/V

    def store(self, layers: Layers, lengths: Sequence[int]) -> int:
        """Insert the system segment and the entries of the passages this request saw first,
        computed now (after the first token) one forward each after the system segment. The
        prompt's own KV past the exact prefix is approximate and never stored."""
        system_ids, system = self._system
        for key, ids in self._unseen:
            assert self._engine is not None
            n = len(system_ids)
            cache = self._engine.new_cache(system)
            self._engine.prefill_segments([system_ids, ids], cache, 1)
            self._pending.append(([key], SegmentKV.from_layers(
                [(k[:, :, n:].clone(), v[:, :, n:].clone()) for k, v in cache.layers()])))
        self._unseen, self._engine, self._system = [], None, ([], [])
        added = 0
        for path, payload in self._pending:
            added += self.tree.insert(self.match.root_key, path, [payload])
        self._pending = []
        return added

    def prefill(self, engine: PrefillEngine, seg_ids: list[list[int]]) -> tuple[KVCache, torch.Tensor]:
        import torch

        rotary = Rotary(engine.model)
        lengths = [len(s) for s in seg_ids]
        starts = list(itertools.accumulate(lengths, initial=0))
        sys_len, ask = lengths[0], starts[-2]  # ask: where the question starts
        path = self.match.path
        # 1. the exact prefix; a missing system segment is computed (and stored) first
        if self.match.nodes:
            prefix = assemble_kv(self.match.payloads, self.device)
        else:
            cache = engine.new_cache()
            engine.prefill_segments(seg_ids[:1], cache, 0)
            prefix = [(k.clone(), v.clone()) for k, v in cache.layers()]
            self._pending.append(([], SegmentKV.from_layers(prefix)))
            self.segments = 1  # computed, not served: ``tokens`` stays 0
        m = self.segments
        found = dict(zip(self.entries.path, self.entries.nodes, strict=True))
        system = [(k[:, :, :sys_len], v[:, :, :sys_len]) for k, v in prefix]
        # 2. place every later passage that has an entry; the others are computed in context (4.)
        # and get their entry in store(). ``pieces``: per segment after the exact prefix, its
        # placed K/V, or None for a slot to fill with zeros (never read: computed, so masked out)
        pieces: list[Layers | None] = []
        spans: list[Span] = []
        unseen: list[int] = []  # positions of passages without an entry
        served: set[int] = set()  # placed positions whose K/V came from the cache
        for i in range(m, len(seg_ids) - 1):
            if not lengths[i]:
                continue
            node = found.get(path[i - 1])
            if node is None:
                self._unseen.append((path[i - 1], seg_ids[i]))
                unseen.extend(range(starts[i], starts[i + 1]))
                pieces.append(None)
                continue
            kv = node.kv.to(self.device) if self.device else node.kv
            self.tokens += lengths[i]
            served.update(range(starts[i], starts[i + 1]))
            pieces.append(list(kv.layers))
            if starts[i] > sys_len:  # at Δ = 0 the entry is exact: nothing to recompute
                spans.append(Span(starts[i], lengths[i]))
        if self._unseen:
            self._engine, self._system = engine, (seg_ids[0], system)
        device = prefix[0][0].device
        sizes = [n for _, n in _placed_segments(m, lengths)]
        deltas = torch.cat([torch.full((n,), starts[i] - sys_len, dtype=torch.long, device=device)
                            for i, n in _placed_segments(m, lengths)]) if pieces else None
        context = []
        for layer, (pk, pv) in enumerate(prefix):
            if pieces:
                blank = pk.new_zeros(pk.shape[:-2] + (1, pk.shape[-1]))
                ks = [p[layer][0] if p is not None else blank.expand(*blank.shape[:-2], n, -1)
                      for p, n in zip(pieces, sizes, strict=True)]
                vs = [p[layer][1] if p is not None else blank.expand(*blank.shape[:-2], n, -1)
                      for p, n in zip(pieces, sizes, strict=True)]
                k = rotary.shift(torch.cat(ks, dim=-2), deltas)
                pk, pv = torch.cat([pk, k], dim=-2), torch.cat([pv, torch.cat(vs, dim=-2)], dim=-2)
            context.append((pk, pv))
        # 3. the recompute set, plus every token of an unseen passage
        deviation = None
        if self.policy.needs_deviation and spans:
            deviation = _deviation(engine, prefix, context, seg_ids, starts[m], spans)
        recompute = sorted(self.policy.select(spans, deviation) | set(unseen))
        self.recomputed = sum(p in served for p in recompute)  # fresh entries' tokens are not "re"-computed
        self.tokens -= self.recomputed
        # 4. prefill the recompute set and the question over the placed K/V
        keep = torch.ones(ask, dtype=torch.bool, device=device)
        if recompute:
            keep[torch.tensor(recompute, device=device)] = False
        cache = engine.new_cache([(k[:, :, keep], v[:, :, keep]) for k, v in context])
        kpos = torch.arange(ask, device=device)[keep]
        flat = [t for s in seg_ids for t in s]
        question = list(range(ask, starts[-1]))
        if self.policy.exact:  # the limiting case: one forward per segment, as an exact prefill
            groups = [[p for p in recompute if starts[i] <= p < starts[i + 1]] for i in range(len(seg_ids) - 1)]
            groups.append(question)
        else:  # approximate anyway: one forward saves a pass over the weights per segment
            groups = [recompute + question]
        logits = None
        for group in (g for g in groups if g):
            qpos = torch.tensor(group, device=device)
            kpos = torch.cat([kpos, qpos])
            seen = kpos.view(1, -1) <= qpos.view(-1, 1)  # keys in cache order, seen by position
            logits = engine.forward(torch.tensor([flat[p] for p in group], device=device), qpos, cache, mask=seen)
        order = torch.argsort(kpos)
        sorted_cache = engine.new_cache([(k[:, :, order], v[:, :, order]) for k, v in cache.layers()])
        assert logits is not None, "the question group is never empty"
        return sorted_cache, logits


def _placed_segments(m: int, lengths: Sequence[int]) -> Iterator[tuple[int, int]]:
    """(segment index, tokens) of the placed passages: non-empty segments after the exact prefix."""
    return ((i, lengths[i]) for i in range(m, len(lengths) - 1) if lengths[i])


def _deviation(engine: PrefillEngine, prefix: Layers, context: Layers, seg_ids: list[list[int]], start: int,
               spans: Sequence[Span]) -> list[float]:
    """Per placed token (spans in order), the squared distance between its placed K/V and the K/V
    a full prefill gives at layer :data:`DEVIATION_LAYER`: the tokens after the exact prefix
    (``start``) run through the first layers only, on the exact prefix."""
    import torch

    flat = [t for s in seg_ids for t in s]
    device = prefix[0][0].device
    cache = engine.new_cache(prefix)
    engine.forward(torch.tensor(flat[start:], device=device), torch.arange(start, len(flat), device=device),
                   cache, stop_after=DEVIATION_LAYER)  # only the first layers: their K/V are in the cache
    true_k, true_v = cache.layers()[DEVIATION_LAYER]
    have_k, have_v = context[DEVIATION_LAYER]
    idx = torch.tensor([s.start + i for s in spans for i in range(s.tokens)], device=device)
    dk = (true_k[:, :, idx] - have_k[:, :, idx]).float().pow(2).sum(dim=(0, 1, 3))
    dv = (true_v[:, :, idx] - have_v[:, :, idx]).float().pow(2).sum(dim=(0, 1, 3))
    return (dk + dv).tolist()


class BlendReuse(TreeReuse):
    """Exact prefixes from the knowledge tree, then every later passage placed from its entry
    (see the module header). ``recompute``: the policy spec, default the tree config's."""

    def __init__(self, tree: KVTree, device: str | None = None, recompute: str | None = None) -> None:
        super().__init__(tree, device)
        self.recompute = recompute or tree.config.recompute
        self.policy = parse_recompute(self.recompute)

    @contextmanager
    def lease(self, root_key: str, path: Sequence[str]) -> Iterator[Lease]:
        match = self.tree.match(root_key, path)
        try:
            entries = self.tree.entries(root_key, path[max(0, len(match.nodes) - 1):])
            try:
                yield _BlendLease(self.tree, match, entries, self.policy, self.device)
            finally:
                self.tree.release(entries)
        finally:
            self.tree.release(match)

    @property
    def keeps_paths(self) -> bool:
        return False  # only system segments and entries are stored (see the module header)

    def cached_tokens(self, root_key: str, path: Sequence[str]) -> int:
        """The scheduler's score: the exact prefix, or the system segment plus every passage with
        an entry, whichever is larger (no side effects)."""
        exact = super().cached_tokens(root_key, path)
        wanted = set(path)
        held: dict[str, int] = {}

        def peek(children: Any) -> None:
            held.update({k: children[k].tokens for k in wanted if k in children})
            return None

        _, system = self.tree.walk(root_key, peek)
        return max(exact, system + sum(held.values()))
