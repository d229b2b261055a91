"""The `slimrag` command: one thin subcommand per verb over the library API.

One module per group of verbs (`indexing`, `asking`, `serving`, `demo`); each registers its commands
on the group in `base` when imported, which this package does.

Defaults come from the config dataclasses so the CLI and the library never disagree.
``--json`` prints machine-readable output where a script may read it.
"""

from __future__ import annotations

from slimrag.cli import agents, asking, demo, indexing, maintenance, serving, syncing  # noqa: F401  (importing registers the verbs)
from slimrag.cli.base import cli, main

__all__ = ["cli", "main"]
