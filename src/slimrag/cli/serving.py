"""Verbs that run servers: serve (one replica), route (the cache-aware router)."""

from __future__ import annotations

import click

from slimrag.cli.base import ROUTE, cli, open_index
from slimrag.route.policy import RouterConfig


@cli.command()
@click.argument("index", type=click.Path(exists=True))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; 0.0.0.0 exposes the server to the network (set an API key).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="0 picks a free port.")
@click.option("--api-key", envvar="SLIMRAG_API_KEY",
              help="Require 'Authorization: Bearer KEY' on /v1/ routes [env: SLIMRAG_API_KEY].")
@click.option("--llm", help="OpenAI-compatible base URL; default: embedded SmolLM2.")
def serve(index: str, host: str, port: int, api_key: str | None, llm: str | None) -> None:
    """Serve an index over HTTP: OpenAI-compatible chat completions (RAG) and embeddings, search, metrics."""
    import uvicorn

    from slimrag.rag.pipeline import RAG
    from slimrag.serve.app import create_app, warm_up

    with open_index(index) as idx:
        rag = RAG(idx, llm)
        warm_up(rag)  # here, so a missing model is one error line rather than a failed startup
        if not api_key and host not in ("127.0.0.1", "localhost", "::1"):
            click.echo(f"warning: serving on {host} without an API key", err=True)
        uvicorn.run(create_app(rag, api_key=api_key, warm=False), host=host, port=port, log_level="info")


@cli.command()
@click.option("--replica", "replicas", multiple=True, required=True,
              help="A replica's URL, e.g. http://127.0.0.1:8001 (repeatable; a `slimrag serve` each).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; 0.0.0.0 exposes the router to the network.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535), help="0 picks a free port.")
@click.option("--cache-threshold", default=ROUTE["cache_threshold"], show_default=True,
              help="Prefix match ratio from which a conversation goes back to the replica that has it.")
@click.option("--balance-abs-threshold", default=ROUTE["balance_abs_threshold"], show_default=True,
              help="Load is imbalanced when max - min in-flight requests exceeds this ...")
@click.option("--balance-rel-threshold", default=ROUTE["balance_rel_threshold"], show_default=True,
              help="... and max exceeds this times min; then the least-loaded replica answers.")
@click.option("--cooldown", default=ROUTE["cooldown_s"], show_default=True,
              help="Seconds a failed replica is left out.")
def route(replicas: tuple[str, ...], host: str, port: int, cache_threshold: float, balance_abs_threshold: int,
          balance_rel_threshold: float, cooldown: float) -> None:
    """Route OpenAI-compatible requests over several `slimrag serve` replicas (cache-aware, with failover)."""
    import uvicorn

    from slimrag.route.app import create_router_app

    try:
        config = RouterConfig(cache_threshold=cache_threshold, balance_abs_threshold=balance_abs_threshold,
                              balance_rel_threshold=balance_rel_threshold, cooldown_s=cooldown)
        app = create_router_app(list(replicas), config)
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    uvicorn.run(app, host=host, port=port, log_level="info")

