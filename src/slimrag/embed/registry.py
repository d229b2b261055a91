"""Embedder factories by ``kind``: how an index rebuilds the embedder its manifest recorded.

`Embedder.record` writes ``{"kind": ..., "id": ..., "dim": ..., ...}`` into the manifest;
`from_record` looks ``kind`` up in `FACTORIES` and calls the factory with the whole record. The
built-in kinds are "local" (`LocalEmbedder`; ``runtime``, absent in records written before it
existed and then "torch", what built them; ``model_dir`` when not the packaged MiniLM),
"remote" (`RemoteEmbedder`; ``base_url``, ``model``, ``dim``) and "synthetic" (`SyntheticEmbedder`,
the model-free stand-in of the scale benchmarks; ``topics``, ``rank``, ``seed``, ``topic_from``).
A record without ``kind`` (written before the key existed) is "local". Another embedder either
registers its kind with `register` or is passed to `Index.open` each time ("custom", the base
class's kind, has no factory).

Factories import their module lazily, so reading a manifest loads neither torch nor an HTTP client.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from slimrag.embed.base import Embedder
from slimrag.errors import IndexFormatError

Factory = Callable[[dict[str, Any]], Embedder]


def _local(rec: dict[str, Any]) -> Embedder:
    from slimrag.embed.local import LocalEmbedder

    return LocalEmbedder(rec.get("model_dir"), runtime=rec.get("runtime", "torch"))


def _remote(rec: dict[str, Any]) -> Embedder:
    from slimrag.embed.remote import RemoteEmbedder

    return RemoteEmbedder(rec["base_url"], rec["model"], dim=rec.get("dim"))


def _synthetic(rec: dict[str, Any]) -> Embedder:
    from slimrag.embed.synthetic import SyntheticEmbedder

    return SyntheticEmbedder.from_record(rec)


#: kind -> factory that rebuilds an embedder from its record
FACTORIES: dict[str, Factory] = {"local": _local, "remote": _remote, "synthetic": _synthetic}


def register(kind: str, factory: Factory) -> None:
    """Let indexes built with embedders of ``kind`` open without passing the embedder."""
    FACTORIES[kind] = factory


def default_embedder() -> Embedder:
    """The embedder of a new index when none is given: the packaged MiniLM, on the runtime that
    `LocalEmbedder`'s "auto" picks for this machine (recorded in the new index's manifest)."""
    from slimrag.embed.local import LocalEmbedder

    return LocalEmbedder()


def from_record(rec: dict[str, Any]) -> Embedder:
    """The embedder a manifest's record describes. Raises IndexFormatError for a kind with no
    factory (say what to do: pass the embedder, or register its kind)."""
    kind = rec.get("kind", "local")
    factory = FACTORIES.get(kind)
    if factory is None:
        raise IndexFormatError(
            f"the index was built with embedder {rec.get('id')!r} of kind {kind!r}, which slimrag cannot "
            f"rebuild (known kinds: {sorted(FACTORIES)}); open it with that embedder "
            "(Index.open(path, embedder=...)) or register its kind with slimrag.embed.registry.register")
    return factory(rec)
