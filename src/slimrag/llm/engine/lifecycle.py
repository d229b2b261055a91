"""A request's life in the embedded engine: admitted, prefilled on its cached prefix, decoded, stored.

The steps, each on one :class:`~slimrag.llm.engine.request.Request`:

1. :func:`prefill`: wait for the prefill gate (:mod:`slimrag.llm.engine.scheduler`: one prefill at a
   time, longest cached prefix first, with an age bound), then lease the cached prefix from the
   KV reuse strategy (:mod:`slimrag.llm.kv.reuse`; the knowledge tree by default) and let the
   lease prefill the rest through the model runner (:mod:`slimrag.llm.engine.runner`). The match is
   taken once the scheduler admits the request, so a request that waited sees what earlier ones
   stored meanwhile; its nodes are pinned only during the prefill (decode never holds pins).
2. :func:`tokens`: decode (:class:`slimrag.llm.engine.batcher.DecodeLoop`): a token is chosen, yielded,
   and fed back only when the next one is asked for, so a caller that stops (EOS, limit, stop
   string) never pays for a forward it does not use.
3. :meth:`Request.store`: the segments this request computed go into the tree once the first
   token is out, before the second token's forward grows the cache past the prompt (and any
   demotion to disk it causes stays off the first token's path).
4. :func:`stream` turns the tokens into text pieces (stop strings, streaming detokenization,
   :mod:`slimrag.llm.engine.decoding`) and ends with the usage delta; :func:`greedy` collects greedy
   ids (what the exactness tests and benchmarks compare).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from collections.abc import Generator as Gen
from contextlib import contextmanager

from slimrag.llm.base import Delta
from slimrag.llm.engine.batcher import DecodeLoop
from slimrag.llm.engine.decoding import find_stop, safe_len
from slimrag.llm.engine.request import Request
from slimrag.llm.engine.scheduler import PrefillScheduler
from slimrag.llm.kv.reuse import KVReuse, Lease, PrefillEngine


@contextmanager
def admitted(scheduler: PrefillScheduler, reuse: KVReuse, root: str, path: Sequence[str]) -> Iterator[Lease]:
    """The prefill gate's turn for tree path ``[root, *path]`` (longest cached prefix first), and
    the lease of that prefix, both held for the ``with`` block: what a request's prefill and
    `LocalGenerator.keep` run inside."""
    with scheduler.turn(lambda: reuse.cached_tokens(root, path)), reuse.lease(root, path) as lease:
        yield lease


def prefill(request: Request, scheduler: PrefillScheduler, reuse: KVReuse, engine: PrefillEngine) -> None:
    """Step 1: admit ``request`` through ``scheduler`` and prefill it on ``reuse``'s cached prefix
    of its tree path; sets its ``lease``, ``cache`` and ``logits``."""
    with admitted(scheduler, reuse, request.root, request.path) as lease:
        request.cache, request.logits = lease.prefill(engine, request.seg_ids)
    request.lease = lease


def tokens(request: Request, decoding: DecodeLoop) -> Gen[int, None, None]:
    """Step 2: the request's tokens from its prefill logits on (close the iterator when done)."""
    return decoding.tokens(request.logits, request.cache, request.prompt_tokens, request.choose)


def stream(request: Request, decoding: DecodeLoop, eos: frozenset[int],
           detokenize: Callable[[list[int]], str]) -> Iterator[Delta]:
    """Steps 2-4 for a prefilled ``request``: text pieces of the answer, the last delta carrying
    usage and finish reason. ``eos``: the ids that end it; ``detokenize``: ids to text."""
    steps = tokens(request, decoding)
    try:
        first = next(steps)
        request.ttft_s = time.perf_counter() - request.t0
        yield from _emit(request, itertools.chain([first], _after(request.store, steps)), eos, detokenize)
        request.store()  # generation ended at the first token (EOS, stop string, max_new_tokens=1)
    finally:
        steps.close()  # leave the decode batcher now, not when the generator is collected


def greedy(request: Request, decoding: DecodeLoop, eos: frozenset[int]) -> list[int]:
    """Steps 2-3 for a prefilled ``request`` whose ``choose`` is greedy: its ids up to
    ``max_new`` or the EOS id, which ends the list."""
    steps = tokens(request, decoding)
    try:
        out = [next(steps)]
        request.store()
        while out[-1] not in eos and len(out) < request.max_new:
            out.append(next(steps))
    finally:
        steps.close()
    return out


def _emit(request: Request, steps: Iterator[int], eos: frozenset[int],
          detokenize: Callable[[list[int]], str]) -> Iterator[Delta]:
    """The text of ``steps`` (the first token included): stop handling, streaming detokenization
    and the final usage delta."""
    stops = request.config.stop
    out: list[int] = []
    emitted = ""
    reason = "length"
    stop_string = False
    for token in steps:
        out.append(token)
        if token in eos:
            reason = "stop"
            break
        text = detokenize(out)
        cut = find_stop(text, stops)
        if cut is not None:
            if cut > len(emitted):
                yield Delta(text[len(emitted) : cut])
            emitted = text[:cut]
            reason, stop_string = "stop", True
            break
        safe = safe_len(text, stops)
        if safe > len(emitted):
            yield Delta(text[len(emitted) : safe])
            emitted = text[:safe]
        if len(out) >= request.max_new:
            break
    if not stop_string:
        # Flush what was held back: a stop-string prefix that never completed, or a trailing
        # partial character. ``detokenize`` drops the EOS token.
        tail = detokenize(out)
        if len(tail) > len(emitted) and tail.startswith(emitted):
            yield Delta(tail[len(emitted) :])
    yield Delta("", usage=request.usage(len(out)), finish_reason=reason)


def _after(first: Callable[[], None], steps: Iterator[int]) -> Iterator[int]:
    """``steps``, calling ``first()`` just before the first item is asked for."""
    first()
    yield from steps
