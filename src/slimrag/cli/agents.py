"""Verbs for agents: ``slimrag mcp INDEX``, the index as Model Context Protocol tools.

By default it speaks MCP over stdio, which is how Claude Code (``claude mcp add slimrag --
slimrag mcp /path/to/index``) and Claude Desktop start a server; ``--http`` serves streamable
HTTP at ``http://HOST:PORT/mcp`` instead (127.0.0.1 by default, with the Host and Origin checks
of ``slimrag serve``: ``--allow-host``, ``--allow-origin``). The ``ask`` tool generates with
the same flags as ``slimrag ask`` (``--llm``, ``--llm-model``, ``--api-key``, ``--max-tokens``);
the model is loaded on the first ``ask`` only. See `slimrag.mcp.server` for the tools.

What a client may do is set here, by the person starting the server, never by the client:

- ``--allow-add PATH`` (repeatable): a folder ``add_paths`` may read besides the index's indexed
  folder (`slimrag.ingest.confine`); without it, only the indexed folder;
- ``--key KEY`` (or ``SLIMRAG_MCP_KEY``; ``--api-key`` stays the LLM's): with ``--http``, every
  request must send ``Authorization: Bearer KEY``. Without a key the server refuses to bind
  beyond loopback (exit status 2); on loopback any local user can connect (`slimrag.mcp.http`);
- ``--max-sessions N``, ``--session-idle SECONDS``: the HTTP session bounds (defaults and
  trade-offs: `slimrag.mcp.http`).

The SDK is imported inside the verb, so other verbs never pay for it. On stdio, stdout belongs to
the protocol: nothing here prints to it (logs go to stderr, as everywhere in the CLI).
"""

from __future__ import annotations

import click

from slimrag.cli.base import Failed, cli
from slimrag.cli.options import bind_port, host_options, host_rule, llm_options, llm_spec

#: The HTTP bounds' defaults, whose home is `slimrag.mcp.http.HttpLimits`: repeated here because
#: click needs them at import time and that module imports Starlette; tests/test_mcp_security.py
#: fails when the two differ.
_MAX_SESSIONS, _SESSION_IDLE_S = 32, 300.0
#: Flags that mean something only with --http.
_HTTP_ONLY = ("host", "port", "allow_host", "allow_origin", "key", "max_sessions", "session_idle")


@cli.command()
@click.argument("index", type=click.Path(exists=True, file_okay=False))
@click.option("--http", "http", is_flag=True,
              help="Serve streamable HTTP at http://HOST:PORT/mcp instead of stdio.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind with --http.")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="Port to bind with --http.")
@click.option("--allow-add", "allow_add", multiple=True, metavar="PATH",
              type=click.Path(exists=True, file_okay=False),
              help="Also let add_paths read files in this folder (repeatable). By default it reads only the "
                   "index's indexed folder; hidden files and folders are never read.")
@click.option("--key", envvar="SLIMRAG_MCP_KEY", metavar="KEY",
              help="With --http: require 'Authorization: Bearer KEY' on every request (env SLIMRAG_MCP_KEY). "
                   "Needed to bind beyond loopback. Not the LLM's key (that is --api-key).")
@click.option("--max-sessions", type=click.IntRange(1, 10_000), default=_MAX_SESSIONS, show_default=True,
              help="With --http: the most MCP sessions open at once (more get 503).")
@click.option("--session-idle", type=click.FloatRange(0, None, min_open=True), default=_SESSION_IDLE_S,
              show_default=True, metavar="SECONDS",
              help="With --http: close a session idle this long (the client then initializes again).")
@host_options
@llm_options
def mcp(index: str, http: bool, host: str, port: int, allow_add: tuple[str, ...], key: str | None,
        max_sessions: int, session_idle: float, allow_host: tuple[str, ...], allow_origin: tuple[str, ...],
        llm: str | None, llm_model: str | None, api_key: str | None, max_tokens: int) -> None:
    """Serve an index to agents over MCP (stdio by default).

    Tools: search, ask, list_documents, get_passage, add_paths (only inside the index's folder and
    --allow-add folders). Add it to Claude Code with
    `claude mcp add slimrag -- slimrag mcp /path/to/index`.
    """
    ctx = click.get_current_context()
    given = [f"--{p.replace('_', '-')}" for p in _HTTP_ONLY
             if ctx.get_parameter_source(p) == click.core.ParameterSource.COMMANDLINE]
    if given and not http:
        raise click.UsageError(f"{' and '.join(given)} {'apply' if len(given) > 1 else 'applies'} only with "
                               "--http (they set up the HTTP listener; stdio has none)")
    limits = None
    if http:
        from slimrag.api.gate import check_api_key
        from slimrag.mcp.http import HttpLimits, is_loopback, needs_key

        if key is not None:
            try:
                check_api_key(key)
            except ValueError as e:
                raise click.BadParameter(str(e), param_hint="--key") from e
        if (why := needs_key(host, key)) is not None:
            raise Failed(why, exit_code=2)
        if not is_loopback(host):
            click.echo(f"warning: the MCP server listens on {host}, beyond this machine, over plain HTTP: the key "
                       "travels unencrypted; put a TLS proxy in front or reach it through an SSH tunnel.", err=True)
        limits = HttpLimits(max_sessions=max_sessions, session_idle_s=session_idle)
    hosts = host_rule(host, allow_host, allow_origin) if http else None
    sock = bind_port(host, port) if http else None  # before the index opens: a busy port is one line
    from slimrag.mcp.server import serve

    try:
        serve(index, llm=llm_spec(llm, llm_model, api_key), max_tokens=max_tokens,
              transport="streamable-http" if http else "stdio", host=host, sock=sock, hosts=hosts,
              allow_add=allow_add, key=key if http else None, limits=limits)
    finally:
        if sock is not None:
            sock.close()
