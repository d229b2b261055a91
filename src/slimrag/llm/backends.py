"""Generator backends by kind: a registry from a spec to the `Generator` that serves it.

A spec is what `RAG(index, llm=...)` and ``--llm`` accept:

- ``None``: the ``"local"`` backend, the embedded SmolLM2 engine with its KV tree, whose disk
  tier persists in ``$SLIMRAG_HOME/kv`` (``slimrag.llm.kv.config.PERSISTENT``);
- a string ``SCHEME://...``: the backend registered under ``SCHEME`` (``"http"`` and ``"https"``:
  any OpenAI-compatible endpoint, `RemoteGenerator`); a string without ``://`` names a kind
  itself (``"local"``);
- a `Generator`: used as it is.

Options: ``model`` (the served model's name), ``api_key``, ``cache`` (a
`slimrag.llm.kv.config.CacheConfig`: how the embedded engine reuses passage KV) and ``batch`` (a
`slimrag.llm.engine.batcher.BatchConfig`: how it shares decode steps across requests), when given, go to
the factory as keyword arguments (``factory(spec, model=..., api_key=...)``; without them it is
called as ``factory(spec)``); a backend refuses an option it does not take (the local one: model
and key; the remote one: cache and batch) with a `RequestError` rather than ignoring it.

A new backend registers a factory with :func:`register_backend` instead of growing an if/elif
chain. Factories import their module when called, so naming a remote model never imports torch.

Deferred builds: a backend may also declare its generators' capabilities (`DECLARED`, a
`slimrag.llm.declared.Declared`; the local one: `slimrag.llm.declared.LOCAL`), which lets
:func:`make_deferred` hand a caller a `slimrag.llm.deferred.Deferred` at once and build (import
torch, map the GGUF) on a background thread: what a one-shot ``slimrag ask`` does, whose grounded
evidence lead needs no model. A backend that declares nothing is built at once.

A spec that names no registered backend (``"notaurl"``) is a `RequestError` (a `ValueError` too),
which the CLI reports as one line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from slimrag.errors import RequestError
from slimrag.llm.base import Generator
from slimrag.llm.declared import LOCAL, Declared
from slimrag.llm.deferred import Deferred

if TYPE_CHECKING:
    from slimrag.llm.engine.batcher import BatchConfig
    from slimrag.llm.kv.config import CacheConfig

#: Builds a generator from its spec (None for the default local model); ``model=`` and ``api_key=``
#: keywords when the caller gives them (see the module header).
BackendFactory = Callable[..., Generator]


def _local(spec: str | None, model: str | None = None, api_key: str | None = None,
           cache: CacheConfig | None = None, batch: BatchConfig | None = None,
           bf16_prefill: bool | None = None) -> Generator:
    if model is not None or api_key is not None:
        raise RequestError("a model name and an API key apply to a remote model only; give its "
                           "OpenAI-compatible URL as the llm (e.g. http://127.0.0.1:11434/v1)")
    from slimrag.llm.kv.config import PERSISTENT
    from slimrag.llm.local import LocalGenerator

    # no config: the knowledge tree with a persistent disk tier, so a one-shot process reuses what
    # earlier ones computed (``LocalGenerator(cache=None)`` would mean no reuse)
    return LocalGenerator(cache=PERSISTENT if cache is None else cache, batch=batch, bf16_prefill=bf16_prefill)


def _openai(spec: str | None, model: str | None = None, api_key: str | None = None,
            cache: CacheConfig | None = None, batch: BatchConfig | None = None) -> Generator:
    from slimrag.llm.remote import RemoteGenerator

    if cache is not None or batch is not None:
        raise RequestError(f"KV cache and decode batching settings apply to the embedded model only; {spec} "
                           "manages its own")

    assert spec is not None, "the http(s) backends are only looked up for a URL"
    return RemoteGenerator(spec, model=model, api_key=api_key)


#: kind (a URL scheme, or a bare name) -> factory.
BACKENDS: dict[str, BackendFactory] = {"local": _local, "http": _openai, "https": _openai}
#: kind -> what its generators declare before one is built (module header, "Deferred builds").
DECLARED: dict[str, Declared] = {"local": LOCAL}


def register_backend(kind: str, factory: BackendFactory, declared: Declared | None = None) -> None:
    """Make ``kind://...`` specs (and the bare ``kind``) build their generator with ``factory``;
    ``declared``: what its generators declare, for deferred builds (None: built at once)."""
    if not kind or "://" in kind:
        raise ValueError(f"a backend kind is a scheme such as 'http', got {kind!r}")
    BACKENDS[kind] = factory
    if declared is None:
        DECLARED.pop(kind, None)
    else:
        DECLARED[kind] = declared


def backend_kind(spec: str) -> str:
    """The registry key of a string spec: its URL scheme, or the whole string when it has none."""
    scheme, sep, _ = spec.partition("://")
    return scheme if sep else spec


def make_generator(llm: Generator | str | None, *, model: str | None = None,
                   api_key: str | None = None, cache: CacheConfig | None = None,
                   batch: BatchConfig | None = None, bf16_prefill: bool | None = None) -> Generator:
    """The generator for a spec, with the served ``model``'s name and an ``api_key`` for a remote
    one, or the ``cache``, ``batch`` and ``bf16_prefill`` settings of the embedded one (see the
    module header and `slimrag.llm.local.LocalGenerator`)."""
    if isinstance(llm, Generator):
        if any(v is not None for v in (model, api_key, cache, batch, bf16_prefill)):
            raise RequestError("model, api_key, cache, batch and bf16_prefill configure a generator built "
                               "from a spec; pass them to the Generator itself")
        return llm
    given = (("model", model), ("api_key", api_key), ("cache", cache), ("batch", batch),
             ("bf16_prefill", bf16_prefill))
    options: dict[str, object] = {k: v for k, v in given if v is not None}
    if llm is None:
        return BACKENDS["local"](None, **options)
    factory = BACKENDS.get(backend_kind(llm)) if isinstance(llm, str) else None
    if factory is None:
        raise RequestError(f"llm must be None, a Generator or a spec of a registered backend "
                           f"({', '.join(sorted(BACKENDS))}; e.g. 'http://127.0.0.1:8000/v1'), got {llm!r}")
    return factory(llm, **options)


def declared_for(llm: str | None) -> Declared | None:
    """What the backend of a spec declares (None: the embedded model's), or None where it declares
    nothing (module header, "Deferred builds")."""
    kind = "local" if llm is None else backend_kind(llm)
    return DECLARED.get(kind) if kind in BACKENDS else None


def make_deferred(llm: str | None, **options: Any) -> Generator:
    """The generator of a spec, as :func:`make_generator` makes it with ``options``, but built on a
    background thread (a `Deferred`, returned at once) where its backend declares its capabilities
    and takes every option given; otherwise built here, so an unknown spec or option raises now."""
    declared = declared_for(llm)
    given = {name for name, value in options.items() if value is not None}  # None: not given
    if declared is None or not given <= declared.options:
        return make_generator(llm, **options)
    return Deferred(lambda: make_generator(llm, **options), declared, name="local" if llm is None else backend_kind(llm))
