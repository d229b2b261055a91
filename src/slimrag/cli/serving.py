"""Verbs that run servers: serve (one replica), route (the cache-aware router).

Both bind their port first (one line and exit status 2 when it is taken, before any model
loads) and answer only the Host and Origin values of `slimrag.api.hosts` (``--allow-host``,
``--allow-origin``). Both take the same bounds (`limit_options`): ``--max-connections``,
``--header-timeout`` and ``--max-body-bytes`` (see `slimrag.api.connections`)."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any, TypeVar

import click

from slimrag.api.limits import ConnectionLimits
from slimrag.cli.asking import ANSWER_HELP
from slimrag.cli.base import ROUTE, cli, open_index
from slimrag.cli.options import bind_port, cache_config, host_options, host_rule, reuse_options
from slimrag.config import ANSWER_MODES
from slimrag.errors import SlimragError
from slimrag.route.policy import RouterConfig

F = TypeVar("F", bound=Callable[..., Any])


def limit_options(func: F) -> F:
    """Add ``--max-connections``, ``--header-timeout`` and ``--max-body-bytes`` (serve and route;
    defaults and trade-offs in `slimrag.api.connections` and `slimrag.api.gate`); read the first
    two with :func:`connection_limits`."""
    options = [
        click.option("--max-connections", type=click.IntRange(1, 1_000_000), metavar="N",
                     help="Connections held at once; at the cap the one idle longest gives way to a new one "
                          "[default: half the open-files limit (ulimit -n), at most 4096]."),
        click.option("--header-timeout", type=click.FloatRange(0.1, 3600), default=ConnectionLimits().header_timeout_s,
                     show_default=True, metavar="SECONDS",
                     help="Close a connection whose request line and headers have not all arrived within this "
                          "(idle and slowloris sockets); a body gets 30 s more."),
        click.option("--max-body-bytes", type=click.IntRange(1, 1 << 30), default=1 << 20, show_default=True,
                     metavar="BYTES", help="Larger request bodies are refused with 413."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def connection_limits(max_connections: int | None, header_timeout: float) -> ConnectionLimits:
    """The `ConnectionLimits` of :func:`limit_options`' flags."""
    return ConnectionLimits(header_timeout_s=header_timeout, max_connections=max_connections)


def bind_warning(host: str, api_key: str | None, what: str = "server") -> str | None:
    """The warning to print when ``host`` is reachable from other machines and no key guards it
    (None for loopback addresses and ``localhost``, or with a key)."""
    if api_key:
        return None
    if host == "localhost":
        return None
    try:
        if ipaddress.ip_address(host.strip("[]")).is_loopback:
            return None
    except ValueError:  # a host name: it may resolve beyond loopback
        pass
    return (f"warning: the {what} listens on {host}, beyond this machine, and no --api-key guards it: "
            "anyone who can reach the port can read the index. Set --api-key or bind 127.0.0.1.")


@cli.command()
@click.argument("index", type=click.Path(exists=True))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; 0.0.0.0 exposes the server to the network (set an API key).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="0 picks a free port.")
@click.option("--api-key", envvar="SLIMRAG_API_KEY",
              help="Require 'Authorization: Bearer KEY' on every route but /healthz [env: SLIMRAG_API_KEY].")
@click.option("--llm", help="OpenAI-compatible base URL; default: embedded SmolLM2.")
@click.option("--workers", default=8, show_default=True, type=click.IntRange(1, 256),
              help="Threads answering chats (generation), so as many answers can share a decode step "
                   "(--decode-width); searches and embeddings have their own.")
@click.option("--search-workers", default=2, show_default=True, type=click.IntRange(1, 256),
              help="Threads answering searches, so a search never waits behind a generation.")
@click.option("--decode-width", type=click.IntRange(1, 64), metavar="ROWS",
              help="Embedded model: most concurrent answers sharing one decode step (default 8; 1 turns "
                   "batching off). An answer does not depend on the others served with it.")
@click.option("--kv-events", metavar="ENDPOINT",
              help="Publish the KV cache's changes as vLLM KV events on this ZMQ address, e.g. "
                   "tcp://127.0.0.1:5557 (replays on the next port); off by default. See docs/kv-events.md.")
@click.option("--answer", "answer", type=click.Choice(ANSWER_MODES), default=None,
              help=ANSWER_HELP + " The server's default: a request's own 'answer' field overrides it.")
@click.option("--kv-budget", type=click.IntRange(1), metavar="MIB",
              help="Embedded model: keep at most MIB mebibytes of passage KV, in memory only (no disk "
                   "tier); default 1 GiB in memory and 2 GiB on disk. Bounds what one replica caches.")
@limit_options
@host_options
@reuse_options
def serve(index: str, host: str, port: int, api_key: str | None, llm: str | None, workers: int,
          search_workers: int, decode_width: int | None, kv_events: str | None, answer: str | None,
          kv_budget: int | None, max_connections: int | None,
          header_timeout: float, max_body_bytes: int, allow_host: tuple[str, ...],
          allow_origin: tuple[str, ...]) -> None:
    """Serve an index over HTTP: OpenAI-compatible chat completions (RAG) and embeddings, search, metrics."""
    from slimrag.api.gate import check_api_key
    from slimrag.api.listen import listen, run

    if api_key is not None:
        try:  # before any model loads: a key no client can send is a usage error
            check_api_key(api_key)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--api-key") from e
    cache = cache_config(llm)
    if kv_budget is not None:
        if llm is not None:
            raise click.UsageError("--kv-budget bounds the embedded model's KV cache; an --llm server keeps its own")
        from dataclasses import replace

        from slimrag.llm.kv.config import CacheConfig

        cache = replace(cache or CacheConfig(), host_bytes=kv_budget << 20, disk_bytes=0, persist=False)
    hosts = host_rule(host, allow_host, allow_origin)
    events = _events_config(kv_events, llm, cache.reuse if cache is not None else "exact")
    sock = bind_port(host, port)  # before any model loads: a busy port is one line, at once
    if warning := bind_warning(host, api_key):
        click.echo(warning, err=True)
    try:
        from slimrag.llm.backends import make_generator  # imports torch: after the port is ours
        from slimrag.llm.engine.batcher import BatchConfig
        from slimrag.rag.pipeline import RAG
        from slimrag.serve.app import create_app, warm_up

        with open_index(index) as idx:
            batch = None if decode_width is None else BatchConfig(width=decode_width)
            rag = RAG(idx, make_generator(llm, cache=cache, batch=batch), answer=answer)
            warm_up(rag)  # here, so a missing model is one error line rather than a failed startup
            try:
                app = create_app(rag, api_key=api_key, workers=workers, search_workers=search_workers, warm=False,
                                 hosts=hosts, max_body_bytes=max_body_bytes, kv_events=events)
            except (OSError, ValueError) as e:  # the event ports are taken, or no KV tree to publish
                raise click.ClickException(str(e)) from e
            click.echo(f"slimrag: the web page is at {_url(host, listen(sock))}; the OpenAI-compatible API "
                       "under /v1", err=True)
            run(app, sock, host, limits=connection_limits(max_connections, header_timeout))
    finally:
        sock.close()


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
              help="Seconds a failed replica is left out (a passing health check ends it sooner).")
@click.option("--health-interval", default=ROUTE["health_interval_s"], show_default=True,
              help="Seconds between health checks of each replica (GET /healthz); 0 turns them off.")
@click.option("--index", "plan_index", type=click.Path(exists=True, file_okay=False), metavar="INDEX",
              help="The replicas' index: retrieve each chat's passages here and route it by the KV they save "
                   "on replicas that publish events (serve --kv-events); the replica then does not search.")
@click.option("--api-key", envvar="SLIMRAG_API_KEY",
              help="Require 'Authorization: Bearer KEY' on every route but the page and /healthz, which then "
                   "names no replica without it; passed on, so give the replicas' key [env: SLIMRAG_API_KEY].")
@limit_options
@host_options
def route(replicas: tuple[str, ...], host: str, port: int, cache_threshold: float, balance_abs_threshold: int,
          balance_rel_threshold: float, cooldown: float, health_interval: float, plan_index: str | None,
          api_key: str | None,
          max_connections: int | None, header_timeout: float, max_body_bytes: int,
          allow_host: tuple[str, ...], allow_origin: tuple[str, ...]) -> None:
    """Route OpenAI-compatible requests over several `slimrag serve` replicas (cache-aware, with failover)."""
    from slimrag.api.gate import check_api_key
    from slimrag.api.listen import listen, run
    from slimrag.route.app import create_router_app

    if api_key is not None:
        try:
            check_api_key(api_key)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--api-key") from e
    hosts = host_rule(host, allow_host, allow_origin)
    if warning := bind_warning(host, api_key, "router"):
        click.echo(warning, err=True)
    try:
        config = RouterConfig(cache_threshold=cache_threshold, balance_abs_threshold=balance_abs_threshold,
                              balance_rel_threshold=balance_rel_threshold, cooldown_s=cooldown,
                              health_interval_s=health_interval, max_body_bytes=max_body_bytes)
        app = create_router_app(list(replicas), config, hosts=hosts, api_key=api_key, index=plan_index)
    except (ValueError, SlimragError) as e:  # a bad setting, or an index folder that does not open
        raise click.UsageError(str(e)) from e
    sock = bind_port(host, port)
    click.echo(f"slimrag: the router and its web page are at {_url(host, listen(sock))}", err=True)
    run(app, sock, host, limits=connection_limits(max_connections, header_timeout))


def _events_config(endpoint: str | None, llm: str | None, reuse: str = "exact") -> Any:
    """The `EventsConfig` of ``--kv-events`` (None without it), naming the ``--reuse`` mode its
    events are read by; usage errors for a bad address, an ``--llm`` server (which keeps its own
    cache) or a missing ``route`` extra."""
    if endpoint is None:
        return None
    if llm is not None:
        raise click.UsageError("--kv-events publishes the embedded model's KV cache; an --llm server keeps its own")
    try:
        from slimrag.llm.kv.publish import EventsConfig
    except ImportError as e:
        raise click.UsageError(f"--kv-events needs pyzmq and msgpack: pip install 'slimrag[route]' ({e})") from e
    try:
        config = EventsConfig(endpoint, reuse=reuse)
        config.replay()
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--kv-events") from e
    return config


def _url(host: str, port: int) -> str:
    """The server's root URL (an IPv6 address in brackets)."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}/"

