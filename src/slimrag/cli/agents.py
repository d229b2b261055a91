"""Verbs for agents: ``slimrag mcp INDEX``, the index as Model Context Protocol tools.

By default it speaks MCP over stdio, which is how Claude Code (``claude mcp add slimrag --
slimrag mcp /path/to/index``) and Claude Desktop start a server; ``--http`` serves streamable
HTTP at ``http://HOST:PORT/mcp`` instead (127.0.0.1 by default, with the Host and Origin checks
of ``slimrag serve``: ``--allow-host``, ``--allow-origin``). The ``ask`` tool generates with
the same flags as ``slimrag ask`` (``--llm``, ``--llm-model``, ``--api-key``, ``--max-tokens``);
the model is loaded on the first ``ask`` only. See `slimrag.mcp.server` for the tools.

The SDK is imported inside the verb, so other verbs never pay for it. On stdio, stdout belongs to
the protocol: nothing here prints to it (logs go to stderr, as everywhere in the CLI).
"""

from __future__ import annotations

import ipaddress

import click

from slimrag.cli.base import cli
from slimrag.cli.options import bind_port, host_options, host_rule, llm_options, llm_spec


@cli.command()
@click.argument("index", type=click.Path(exists=True, file_okay=False))
@click.option("--http", "http", is_flag=True,
              help="Serve streamable HTTP at http://HOST:PORT/mcp instead of stdio.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind with --http.")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="Port to bind with --http.")
@host_options
@llm_options
def mcp(index: str, http: bool, host: str, port: int, allow_host: tuple[str, ...], allow_origin: tuple[str, ...],
        llm: str | None, llm_model: str | None, api_key: str | None, max_tokens: int) -> None:
    """Serve an index to agents over MCP (stdio by default).

    Tools: search, ask, list_documents, get_passage, add_paths. Add it to Claude Code with
    `claude mcp add slimrag -- slimrag mcp /path/to/index`.
    """
    ctx = click.get_current_context()
    given = [f"--{p.replace('_', '-')}" for p in ("host", "port", "allow_host", "allow_origin")
             if ctx.get_parameter_source(p) == click.core.ParameterSource.COMMANDLINE]
    if given and not http:
        raise click.UsageError(f"{' and '.join(given)} {'apply' if len(given) > 1 else 'applies'} only with "
                               "--http (stdio needs no address)")
    hosts = host_rule(host, allow_host, allow_origin) if http else None
    sock = bind_port(host, port) if http else None  # before the index opens: a busy port is one line
    if http and not _loopback(host):
        click.echo(f"warning: the MCP server listens on {host}, beyond this machine, with no authentication: "
                   "anyone who can reach the port can read the index and add files to it. Bind 127.0.0.1.",
                   err=True)
    from slimrag.mcp.server import serve

    try:
        serve(index, llm=llm_spec(llm, llm_model, api_key), max_tokens=max_tokens,
              transport="streamable-http" if http else "stdio", host=host, sock=sock, hosts=hosts)
    finally:
        if sock is not None:
            sock.close()


def _loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only (a host name other than localhost may
    resolve beyond it, so it is not)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
