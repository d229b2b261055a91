"""The command group every verb hangs on, the defaults read from the config classes, and the
helpers the verbs share (opening an index, printing an add report)."""

from __future__ import annotations

import json
import logging
import sqlite3
import sys
from dataclasses import fields
from typing import IO, Any

import click

from slimrag.cli.quiet import quiet_dependencies
from slimrag.config import GenerationConfig, IndexConfig, RayIngestConfig, SearchConfig
from slimrag.errors import SlimragError
from slimrag.route.policy import RouterConfig

IDX = {f.name: f.default for f in fields(IndexConfig)}
SEARCH = {f.name: f.default for f in fields(SearchConfig)}
ROUTE = {f.name: f.default for f in fields(RouterConfig)}
RAY = {f.name: f.default for f in fields(RayIngestConfig)}
GENERATION = {f.name: f.default for f in fields(GenerationConfig)}


class _CurrentStderr(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler that writes to whatever ``sys.stderr`` is when a record is emitted.

    Why: ``basicConfig(stream=sys.stderr)`` binds the stream of the moment. A verb run inside a
    captured stream (click's ``CliRunner``, a test, an embedding program) would leave the root
    logger writing to that stream after it is closed, and the first library to log at interpreter
    exit (torch does) printed ``--- Logging error ---`` tracebacks."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:  # StreamHandler.__init__ and setStream assign it
        pass


def _setup_logging(verbose: bool) -> None:
    handler = _CurrentStderr()
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler])
    logging.getLogger("httpx").setLevel(logging.WARNING)


class Failed(click.ClickException):
    """A failure as the CLI reports it: one ``error:`` line on stderr, exit code 1 (a
    `SlimragError`) or the one given (2 for a port that cannot be bound, as for bad usage)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


class _Group(click.Group):
    """The command group: a `SlimragError` from any command ends it as :class:`Failed` (no
    traceback: the message says what to do next), and so does an index catalog this slimrag
    cannot read (`_unreadable_catalog`), whichever verb opened it."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SlimragError as e:
            raise Failed(str(e)) from e
        except sqlite3.DatabaseError as e:
            message = _unreadable_catalog(e)
            if message is None:
                raise
            raise Failed(message) from e


def _unreadable_catalog(exc: sqlite3.DatabaseError) -> str | None:
    """The CLI's line for a catalog whose bytes this slimrag cannot read, or None for any other
    SQLite failure. Only the base class itself means that: slimrag's own refusal of an unknown
    catalog format (`slimrag.catalog.schema.layout_of`, whose message says what to do) and
    SQLite's "file is not a database" or "database disk image is malformed". Its subclasses
    (`OperationalError`: locked, I/O, a bad statement; `IntegrityError`, ...) are faults of the
    moment or bugs, and keep their traceback. The catalog is slimrag's only SQLite file."""
    if type(exc) is not sqlite3.DatabaseError:
        return None
    if getattr(exc, "sqlite_errorname", None) is None:  # raised by slimrag, not by SQLite
        return f"cannot read the index: {exc}"
    return f"cannot read the index: its catalog.sqlite is damaged ({exc}); rebuild the index"


@click.group(cls=_Group)
@click.option("-v", "--verbose", is_flag=True, help="Log progress.")
@click.version_option(package_name="slimrag")
def cli(verbose: bool) -> None:
    """slimrag: ask questions about your own files, offline."""
    _setup_logging(verbose)
    quiet_dependencies(verbose)  # before any verb imports torch, transformers, uvicorn or Ray


def open_index(path: str) -> Any:
    from slimrag.index.core import Index

    return Index.open(path)


def _verbose() -> bool:
    """True when the group was run with ``-v/--verbose`` (``slimrag -v build ...``)."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.find_root().params.get("verbose"))


def print_report(rep: Any, as_json: bool, verbose: bool | None = None) -> None:
    """Print an `AddReport`: one summary line counting every input by outcome (skips by reason);
    with ``verbose`` (default: the group's ``-v``), the files behind each count; with ``--json``,
    all of it as one JSON object."""
    if as_json:
        click.echo(json.dumps(rep.to_dict()))
        return
    click.echo(rep.summary())
    if verbose or (verbose is None and _verbose()):
        for what, sources in rep.listing().items():
            click.echo(f"  {what} ({len(sources)}):")
            for source in sources:
                click.echo(f"    {source}")



def main() -> None:
    """Entry point: run the CLI offline (slimrag errors end as one line and exit code 1, see `_Group`)."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    cli(standalone_mode=True)
