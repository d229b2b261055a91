"""Which reuse strategy an engine runs: the registry of strategies by `CacheConfig.reuse`, and
`make_reuse`, which builds one from what the engine was given.

Its own module because it names both strategies: `TreeReuse` (`slimrag.llm.kv.reuse`, exact) and
`BlendReuse` (`slimrag.llm.kv.blend`, which builds on `TreeReuse`); in either of their modules it
made the two import each other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from slimrag.llm.kv.blend import BlendReuse
from slimrag.llm.kv.config import CacheConfig
from slimrag.llm.kv.reuse import KVReuse, NoReuse, TreeReuse
from slimrag.llm.kv.tree import KVTree

#: ``CacheConfig.reuse`` -> the strategy over a tree (`tree_reuse` builds one from a config).
REUSE_STRATEGIES: dict[str, Callable[[KVTree, str | None], TreeReuse]] = {
    "exact": TreeReuse,
    "blend": BlendReuse,
}


def tree_reuse(config: CacheConfig, device: str | None = None,
               namespace: Callable[[], str] | None = None) -> TreeReuse:
    """A fresh tree with real tensors and the given budgets, behind the strategy that
    ``config.reuse`` names (`REUSE_STRATEGIES`). ``namespace``: what the engine's numbers depend
    on (called only for ``config.persist``, whose files it keys; :mod:`slimrag.llm.kv.persist`)."""
    storage = None
    if config.persist:
        from slimrag.llm.kv.persist import PersistentStorage

        if namespace is None:
            raise ValueError("a persistent KV tier needs the engine's namespace")
        storage = PersistentStorage(config, namespace())
    return REUSE_STRATEGIES[config.reuse](KVTree(config, storage), device)


def make_reuse(spec: CacheConfig | KVTree | KVReuse | None, device: str,
               namespace: Callable[[], str] | None = None) -> KVReuse:
    """The strategy for what an engine on ``device`` was given: None → :class:`NoReuse`; a
    strategy as is; a tree or a :class:`CacheConfig` behind the strategy its ``reuse`` names
    (a config's device tier is moved to ``device``, wherever the model runs; ``namespace`` keys
    a persistent disk tier, see `tree_reuse`)."""
    if spec is None:
        return NoReuse()
    if isinstance(spec, KVReuse):
        return spec
    if isinstance(spec, KVTree):
        return REUSE_STRATEGIES[spec.config.reuse](spec, device)
    if spec.device != device:
        spec = dataclasses.replace(spec, device=device)
    return tree_reuse(spec, device, namespace)
