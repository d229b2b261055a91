"""`KVView`: what one replica's knowledge tree holds, exactly, as its KV events told it.

The router keeps one per replica that publishes events (`slimrag.route.events` feeds it; the
events and their hashes are defined in `slimrag.llm.kv.events`). Where the approximate
`slimrag.route.prefix_tree.PrefixTree` guesses from the text sent to a replica, this view holds the
replica's own segments: every block hash it stored and has not removed, with its parent's hash,
its token count and the media (tiers) it lives in. A segment in any medium counts as held (a disk
hit still saves its prefill; it costs a read).

Planning against it
    The replica orders a request's passages by walking its tree (`slimrag.rag.plan`): the
    longest cached continuation first, the rest by relevance. `KVView.plan` runs that same planner
    over the view, so the router predicts the replica's order and the tokens it will reuse
    (``Plan.cached_tokens``: the system segment and the cached passages). A passage's block hash
    under a node is ``chain_hash(node, key)``, so the walk costs one 16-byte BLAKE2b per candidate
    per level (a few microseconds for 4 passages).

Blend reuse
    A replica serving with ``--reuse blend`` places a passage's entry (its segment right under a
    system segment) wherever the passage stands, so what it saves for a request is every entry it
    holds of the request's passages, in any order (`KVView.reusable`; its ``/healthz`` says which
    reuse it runs).

Memory: about 200 bytes per held segment (a dict entry, a record, a set of media).
Not thread-safe: the router's event loop owns it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from slimrag.llm.kv.config import BLEND, EXACT
from slimrag.llm.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, chain_hash
from slimrag.prompt import CachedSegment
from slimrag.rag.plan import Plan, plan_passages

BlockHash = bytes | int


@dataclass(slots=True)
class Block:
    """One held segment: its parent's hash (None: a root), its tokens and where it lives."""

    parent: BlockHash | None
    tokens: int
    media: set[str] = field(default_factory=set)


class _Children(Mapping[str, CachedSegment]):
    """The children of one view node among a request's candidate keys (what the planner reads)."""

    def __init__(self, found: dict[str, Block]) -> None:
        self._found = found

    def __getitem__(self, key: str) -> Block:
        return self._found[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._found)

    def __len__(self) -> int:
        return len(self._found)


class KVView:
    """The segments one replica holds (module header). ``blocks``: hash -> `Block`; read-only."""

    def __init__(self) -> None:
        self.blocks: dict[BlockHash, Block] = {}
        self.roots: set[BlockHash] = set()

    def __len__(self) -> int:
        return len(self.blocks)

    def clear(self) -> None:
        """Forget everything (a new stream, ``AllBlocksCleared``, or a replica found down)."""
        self.blocks.clear()
        self.roots.clear()

    def apply(self, event: KVEvent) -> None:
        """Apply one event: a store adds the medium (and the segment when new), a removal takes the
        medium away (every medium when it names none) and drops a segment left in none."""
        if isinstance(event, AllBlocksCleared):
            self.clear()
        elif isinstance(event, BlockStored):
            medium = event.medium or ""
            for h in event.block_hashes:
                block = self.blocks.get(h)
                if block is None:
                    block = self.blocks[h] = Block(event.parent_block_hash, event.block_size)
                block.parent, block.tokens = event.parent_block_hash, event.block_size
                block.media.add(medium)
                if block.parent is None:
                    self.roots.add(h)
        elif isinstance(event, BlockRemoved):
            for h in event.block_hashes:
                block = self.blocks.get(h)
                if block is None:
                    continue
                if event.medium is None:
                    block.media.clear()
                else:
                    block.media.discard(event.medium)
                if not block.media:
                    del self.blocks[h]
                    self.roots.discard(h)

    def held(self) -> dict[BlockHash, tuple[BlockHash | None, int]]:
        """hash -> (parent hash, tokens) for every held segment (to compare with a replica's tree)."""
        return {h: (b.parent, b.tokens) for h, b in self.blocks.items()}

    def walk(self, root: BlockHash, keys: Sequence[str], choose: Callable[[Mapping[str, CachedSegment]], str | None],
             ) -> tuple[list[str], int]:
        """`slimrag.prompt.PrefixCache.walk` over the view from the root hashed ``root``, offering
        the children among ``keys`` at each step; (chosen keys, cached tokens with the root's)."""
        block = self.blocks.get(root)
        if block is None:
            return [], 0
        node, tokens, path = root, block.tokens, []
        while True:
            found = {k: b for k in keys if (b := self.blocks.get(chain_hash(_as_bytes(node), k))) is not None}
            key = choose(_Children(found))
            if key is None:
                return path, tokens
            node = chain_hash(_as_bytes(node), key)
            path.append(key)
            tokens += found[key].tokens

    def plan(self, keys: Sequence[str]) -> Plan:
        """The replica's plan for passage ``keys`` (relevance order) as its planner would make it on
        this view, from the root that reuses most (a replica has one root per system prompt)."""
        best: Plan | None = None
        for root in self.roots:
            plan = plan_passages(keys, _RootWalk(self, root, keys), "")
            if best is None or plan.cached_tokens > best.cached_tokens:
                best = plan
        return best or plan_passages(keys, None)


    def reusable(self, keys: Sequence[str], reuse: str = EXACT) -> int:
        """The prompt tokens the replica serves from its cache for passage ``keys`` (relevance
        order): under ``exact`` reuse what its plan reuses (`plan`: the system segment and the
        longest cached path); under ``blend`` (`slimrag.llm.kv.blend`) the system segment and the
        entry of every passage it holds one of, the segment right under that root, which it places
        wherever the passage stands. The replica's recompute policy computes some placed tokens
        again; counted here in full, as a router cannot tell which, alike for every replica."""
        if reuse != BLEND:
            return self.plan(keys).cached_tokens
        best = 0
        for root in self.roots:
            node = _as_bytes(root)
            entries = (self.blocks.get(chain_hash(node, k)) for k in dict.fromkeys(keys))
            best = max(best, self.blocks[root].tokens + sum(b.tokens for b in entries if b is not None))
        return best


def _as_bytes(h: BlockHash) -> bytes:
    return h if isinstance(h, bytes) else h.to_bytes(16, "big", signed=h < 0)


@dataclass(frozen=True, slots=True)
class _RootWalk:
    """The view as the planner's `PrefixCache`, pinned to one root and one request's keys."""

    view: KVView
    root: BlockHash
    keys: Sequence[str]

    def walk(self, root_key: str, choose: Callable[[Mapping[str, CachedSegment]], str | None],
             ) -> tuple[list[str], int]:
        return self.view.walk(self.root, self.keys, choose)
