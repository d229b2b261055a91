"""Generator backends by kind: a registry from a spec to the `Generator` that serves it.

A spec is what `RAG(index, llm=...)` and ``--llm`` accept:

- ``None``: the ``"local"`` backend, the embedded SmolLM2 engine with its KV tree;
- a string ``SCHEME://...``: the backend registered under ``SCHEME`` (``"http"`` and ``"https"``:
  any OpenAI-compatible endpoint, `RemoteGenerator`); a string without ``://`` names a kind
  itself (``"local"``);
- a `Generator`: used as it is.

A new backend registers a factory with :func:`register_backend` instead of growing an if/elif
chain. Factories import their module when called, so naming a remote model never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable

from slimrag.llm.base import Generator

#: Builds a generator from its spec (None for the default local model).
BackendFactory = Callable[[str | None], Generator]


def _local(spec: str | None) -> Generator:
    from slimrag.llm.local import LocalGenerator

    return LocalGenerator()


def _openai(spec: str | None) -> Generator:
    from slimrag.llm.remote import RemoteGenerator

    assert spec is not None, "the http(s) backends are only looked up for a URL"
    return RemoteGenerator(spec)


#: kind (a URL scheme, or a bare name) -> factory.
BACKENDS: dict[str, BackendFactory] = {"local": _local, "http": _openai, "https": _openai}


def register_backend(kind: str, factory: BackendFactory) -> None:
    """Make ``kind://...`` specs (and the bare ``kind``) build their generator with ``factory``."""
    if not kind or "://" in kind:
        raise ValueError(f"a backend kind is a scheme such as 'http', got {kind!r}")
    BACKENDS[kind] = factory


def backend_kind(spec: str) -> str:
    """The registry key of a string spec: its URL scheme, or the whole string when it has none."""
    scheme, sep, _ = spec.partition("://")
    return scheme if sep else spec


def make_generator(llm: Generator | str | None) -> Generator:
    """The generator for a spec (see the module header)."""
    if isinstance(llm, Generator):
        return llm
    if llm is None:
        return BACKENDS["local"](None)
    factory = BACKENDS.get(backend_kind(llm)) if isinstance(llm, str) else None
    if factory is None:
        raise ValueError(f"llm must be None, a Generator or a spec of a registered backend "
                         f"({', '.join(sorted(BACKENDS))}; e.g. 'http://127.0.0.1:8000/v1'), got {llm!r}")
    return factory(llm)
