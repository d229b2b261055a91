"""Verbs that keep an index equal to a folder: ``sync`` (once) and ``watch`` (live).

``slimrag sync DIR INDEX`` is `Index.sync`: new and changed files added, deleted and renamed ones
removed, unchanged ones not read; documents from other folders are left alone. ``add`` keeps its
meaning (add or update, never delete). ``slimrag watch DIR INDEX`` is `slimrag.index.watch.watch`:
a full sync, then one sync per batch of file events, one summary line per batch on stdout
(``--json``: one JSON object per line), until Ctrl-C.
"""

from __future__ import annotations

import json
import time
from dataclasses import fields
from pathlib import Path

import click

from slimrag.cli.base import cli, open_index, print_report
from slimrag.cli.options import config_error
from slimrag.cli.progress import show_progress
from slimrag.index.watch import Batch, WatchConfig

WATCH = {f.name: f.default for f in fields(WatchConfig)}
#: WatchConfig field -> the flag that sets it (for error messages)
WATCH_FLAGS = {"quiet_ms": "--quiet-ms", "max_batch_ms": "--max-batch-ms", "full_sync_paths": "--full-sync-paths"}

_FOLDER = click.Path(exists=True, file_okay=False)


def _existing_index(index: str, folder: str) -> None:
    """Refuse an INDEX that is not there, saying how to make it (sync never creates one, so a
    typo in INDEX cannot start a second index of the folder)."""
    path = Path(index)
    if not (path / "manifest.json").is_file():
        what = "does not exist" if not path.exists() else "is not a slimrag index"
        raise click.BadParameter(f"{index} {what}; create it with `slimrag build {folder} -o {index}`, "
                                 "then sync keeps it in step", param_hint="INDEX")


@cli.command()
@click.argument("folder", type=_FOLDER)
@click.argument("index", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
def sync(folder: str, index: str, as_json: bool) -> None:
    """Make INDEX hold exactly the readable files of FOLDER: add new and changed files, remove
    deleted and renamed ones; unchanged files (same mtime and size) are not read. Documents added
    from other folders are kept."""
    _existing_index(index, folder)
    with open_index(index) as idx, show_progress():  # on stderr: a bar on a terminal, log lines otherwise
        rep = idx.sync(folder)
    print_report(rep, as_json)


@cli.command()
@click.argument("folder", type=_FOLDER)
@click.argument("index", type=click.Path())
@click.option("--quiet-ms", type=int, default=WATCH["quiet_ms"], show_default=True,
              help="A batch of changes is synced after this long without a new one.")
@click.option("--max-batch-ms", type=int, default=WATCH["max_batch_ms"], show_default=True,
              help="...or at the latest this long after its first change.")
@click.option("--full-sync-paths", type=int, default=WATCH["full_sync_paths"], show_default=True,
              help="A batch touching more paths syncs the whole folder.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per batch.")
def watch(folder: str, index: str, quiet_ms: int, max_batch_ms: int, full_sync_paths: int, as_json: bool) -> None:
    """Keep INDEX in sync with FOLDER as files change: a full sync, then one sync per batch of
    changes, one line each. Ctrl-C stops."""
    from slimrag.index.watch import watch as watch_folder

    try:
        config = WatchConfig(quiet_ms=quiet_ms, max_batch_ms=max_batch_ms, full_sync_paths=full_sync_paths)
    except ValueError as e:
        raise config_error(e, WATCH_FLAGS) from e
    _existing_index(index, folder)

    def show(batch: Batch) -> None:
        if as_json:
            click.echo(json.dumps({"time": time.time(), "paths": batch.paths, **batch.report.to_dict()}))
        else:
            click.echo(f"{time.strftime('%H:%M:%S')} {batch.summary()}")

    with open_index(index) as idx:
        click.echo(f"watching {folder} for {index} (Ctrl-C stops)", err=True)
        try:
            syncs = watch_folder(idx, folder, config=config, on_batch=show)
        except KeyboardInterrupt:
            click.echo("stopped", err=True)
            return
    click.echo(f"stopped after {syncs} syncs", err=True)
