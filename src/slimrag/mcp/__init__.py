"""The MCP server: slimrag's index as tools for agents (Claude Code, Claude Desktop, any MCP client).

- `server`: the tools (search, ask, list_documents, get_passage, add_paths), `create_server`, `serve`;
- `worker`: `IndexWorker`, the one thread that holds the open index and the RAG;
- `http`: the ``--http`` app: its key (`BearerKey`), Host/Origin rule and bounds (`HttpLimits`);
- `results`: the dataclasses the tools return (structured results).

Imported only by ``slimrag mcp``: it needs the ``mcp`` SDK, which nothing else loads. The package is
``slimrag.mcp``; the SDK stays ``mcp`` because every import is absolute.
"""

from __future__ import annotations

from slimrag.mcp.server import SlimragTools, create_server, serve
from slimrag.mcp.worker import IndexWorker

__all__ = ["IndexWorker", "SlimragTools", "create_server", "serve"]
