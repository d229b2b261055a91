"""The MCP server: slimrag's index as tools for agents (Claude Code, Claude Desktop, any MCP client).

- `server`: the tools (search, ask, list_documents, get_passage, add_paths), `create_server`, `serve`;
- `worker`: `IndexWorker`, the one thread that holds the open index and the RAG;
- `http`: the ``--http`` app: its key (`BearerKey`), Host/Origin rule and bounds (`HttpLimits`);
- `results`: the dataclasses the tools return (structured results).

Imported only by ``slimrag mcp``: it needs the ``mcp`` SDK, which nothing else loads. The package is
``slimrag.mcp``; the SDK stays ``mcp`` because every import is absolute. The public names below are
loaded on first use (PEP 562), so ``slimrag mcp --http`` can check its key and bind its port with
`slimrag.mcp.http` before the SDK (and the index) load: a refusal or a busy port costs no import.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slimrag.mcp.server import SlimragTools, create_server, serve
    from slimrag.mcp.worker import IndexWorker

#: public name -> the module that defines it
_HOMES = {"SlimragTools": "slimrag.mcp.server", "create_server": "slimrag.mcp.server",
          "serve": "slimrag.mcp.server", "IndexWorker": "slimrag.mcp.worker"}

__all__ = ["IndexWorker", "SlimragTools", "create_server", "serve"]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'slimrag.mcp' has no attribute {name!r}")
    return getattr(import_module(_HOMES[name]), name)
