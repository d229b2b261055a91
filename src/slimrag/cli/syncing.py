"""Verbs that keep an index equal to a folder: ``sync`` (once) and ``watch`` (live).

``slimrag sync DIR INDEX`` is `Index.sync`: new and changed files added, deleted and renamed ones
removed, unchanged ones not read; documents from other folders are left alone. ``add`` keeps its
meaning (add or update, never delete). ``slimrag watch DIR INDEX`` is `slimrag.index.watch.watch`:
a full sync, then one sync per batch of file events, one summary line per batch on stdout
(``--json``: one JSON object per line), until Ctrl-C.

JSON reports name the files that changed (added, updated, removed, skipped) and count the
unchanged ones (``unchanged``); their names come with ``--verbose``: a folder of 1,000 files
synced after one edit is one name, not 1,000.

Stopping ``watch`` (Ctrl-C, SIGINT or SIGTERM) takes under a second whatever it is doing. The
watcher runs on a worker thread that opens the index itself, and the main thread only waits for
it, so a signal is handled at once even while a sync sits in a long C call (a model's forward
pass, a SQLite statement), where Python would handle it only after the call returned. On a
signal, the worker is asked to stop and given `STOP_GRACE_S`; a worker still busy after that (a
sync in progress) is abandoned with the process, as a crash would abandon it: the sync's
transaction never commits, and the next sync redoes its work (`slimrag.index.sync` converges
after a kill). SIGINT stops ``watch`` even when it was started with SIGINT ignored, which a
shell does to a background job (``slimrag watch ... &`` in a script, ``make test &``): a
watcher has no other way to stop, and the test of Ctrl-C once hung for that reason.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import click

from slimrag.cli.base import cli, open_index, print_report
from slimrag.cli.options import config_error
from slimrag.cli.progress import show_progress
from slimrag.index.watch import Batch, WatchConfig
from slimrag.ingest.outcome import UNCHANGED

WATCH = {f.name: f.default for f in fields(WatchConfig)}
#: WatchConfig field -> the flag that sets it (for error messages)
WATCH_FLAGS = {"quiet_ms": "--quiet-ms", "max_batch_ms": "--max-batch-ms", "full_sync_paths": "--full-sync-paths"}
#: Seconds a stopping watcher gets to end cleanly (between syncs it notices ``stop`` within
#: ``rust_timeout_ms``, 500 ms) before the process leaves a sync in progress behind.
STOP_GRACE_S = 0.6

_FOLDER = click.Path(exists=True, file_okay=False)


def _existing_index(index: str, folder: str) -> None:
    """Refuse an INDEX that is not there, saying how to make it (sync never creates one, so a
    typo in INDEX cannot start a second index of the folder)."""
    path = Path(index)
    if not (path / "manifest.json").is_file():
        what = "does not exist" if not path.exists() else "is not a slimrag index"
        raise click.BadParameter(f"{index} {what}; create it with `slimrag build {folder} -o {index}`, "
                                 "then sync keeps it in step", param_hint="INDEX")


def report_json(rep: Any, verbose: bool) -> dict[str, Any]:
    """A sync report as JSON: the changed files by name, the unchanged ones as a count (their
    names too with ``verbose``)."""
    data = rep.to_dict()
    if not verbose:
        data["files"].pop(UNCHANGED, None)  # ``unchanged`` holds their count
    return dict(data)


@cli.command()
@click.argument("folder", type=_FOLDER)
@click.argument("index", type=click.Path())
@click.option("--json", "as_json", is_flag=True,
              help="Print the report as one JSON object: changed files by name, unchanged ones counted.")
@click.option("-v", "--verbose", is_flag=True, help="List the files behind each count, unchanged ones included.")
def sync(folder: str, index: str, as_json: bool, verbose: bool) -> None:
    """Make INDEX hold exactly the readable files of FOLDER: add new and changed files, remove
    deleted and renamed ones; unchanged files (same mtime and size) are not read. Documents added
    from other folders are kept."""
    _existing_index(index, folder)
    verbose = verbose or _group_verbose()
    with open_index(index) as idx, show_progress():  # on stderr: a bar on a terminal, log lines otherwise
        rep = idx.sync(folder)
    if as_json:
        click.echo(json.dumps(report_json(rep, verbose)))
    else:
        print_report(rep, False, verbose)


def _group_verbose() -> bool:
    """Whether the command group got ``-v`` (``slimrag -v sync ...``)."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.find_root().params.get("verbose"))


@cli.command()
@click.argument("folder", type=_FOLDER)
@click.argument("index", type=click.Path())
@click.option("--quiet-ms", type=int, default=WATCH["quiet_ms"], show_default=True,
              help="A batch of changes is synced after this long without a new one.")
@click.option("--max-batch-ms", type=int, default=WATCH["max_batch_ms"], show_default=True,
              help="...or at the latest this long after its first change.")
@click.option("--full-sync-paths", type=int, default=WATCH["full_sync_paths"], show_default=True,
              help="A batch touching more paths syncs the whole folder.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per batch: changed files by name, unchanged ones counted.")
@click.option("-v", "--verbose", is_flag=True, help="With --json, name the unchanged files too.")
def watch(folder: str, index: str, quiet_ms: int, max_batch_ms: int, full_sync_paths: int, as_json: bool,
          verbose: bool) -> None:
    """Keep INDEX in sync with FOLDER as files change: a full sync, then one sync per batch of
    changes, one line each. Ctrl-C stops."""
    from slimrag.index.watch import watch as watch_folder

    try:
        config = WatchConfig(quiet_ms=quiet_ms, max_batch_ms=max_batch_ms, full_sync_paths=full_sync_paths)
    except ValueError as e:
        raise config_error(e, WATCH_FLAGS) from e
    _existing_index(index, folder)
    verbose = verbose or _group_verbose()  # here: the click context is this thread's only

    def show(batch: Batch) -> None:
        if as_json:
            click.echo(json.dumps({"time": time.time(), "paths": batch.paths, **report_json(batch.report, verbose)}))
        else:
            click.echo(f"{time.strftime('%H:%M:%S')} {batch.summary()}")

    stop, done = threading.Event(), threading.Event()
    result: dict[str, Any] = {}

    def work() -> None:
        try:
            with open_index(index) as idx:
                result["syncs"] = watch_folder(idx, folder, config=config, on_batch=show, stop=stop)
        except BaseException as exc:  # handed to the main thread, which reports it
            result["error"] = exc
        finally:
            done.set()

    click.echo(f"watching {folder} for {index} (Ctrl-C stops)", err=True)
    worker = threading.Thread(target=work, name="slimrag-watch", daemon=True)
    with _stopping_signals():
        worker.start()
        try:
            # An Event, not Thread.join: a join that a signal interrupts leaves is_alive() False
            # while the thread still runs (CPython's bpo-45274 handling), so it could not tell a
            # sync in progress from a finished one.
            while not done.wait(0.25):  # a signal interrupts the wait at once
                pass
        except KeyboardInterrupt:
            stop.set()
            if done.wait(STOP_GRACE_S):
                click.echo("stopped", err=True)
            else:  # a sync in progress: leave it behind, as a crash would
                click.echo("stopped (the sync in progress was left unfinished; the next sync redoes it)", err=True)
            # Out at once: the index is closed or abandoned, and the interpreter's own teardown
            # (modules, the watcher's thread) costs up to a second on a loaded machine.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
    if "error" in result:
        raise result["error"]
    click.echo(f"stopped after {result['syncs']} syncs", err=True)


class _stopping_signals:  # noqa: N801 (used as a context manager, named for the with statement)
    """SIGINT (even when inherited as ignored) and SIGTERM raise KeyboardInterrupt in the main
    thread while the block runs; the previous handlers come back after it."""

    def __enter__(self) -> None:
        self.saved: list[tuple[int, Any]] = []
        if threading.current_thread() is not threading.main_thread():
            return  # signals can only be handled in the main thread (e.g. a CLI test runner's)
        handlers: list[tuple[int, Callable[..., Any]]] = [(signal.SIGINT, signal.default_int_handler),
                                                          (signal.SIGTERM, _interrupt)]
        for signum, handler in handlers:
            self.saved.append((signum, signal.signal(signum, handler)))

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self.saved:
            signal.signal(signum, handler)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
