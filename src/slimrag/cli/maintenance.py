"""Verbs that keep an index sound: check (and repair), compact.

Both take the index's writer lock; ``--wait SECONDS`` says how long to wait for another writer
(default: ``$SLIMRAG_WAIT`` or `slimrag.index.store.lock.DEFAULT_WAIT_S`) before failing with one
``error:`` line naming the holder and exit code 1.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from slimrag.cli.base import cli
from slimrag.ingest.outcome import counted

_WAIT_HELP = "Seconds to wait for another writer of the index before giving up  [default: $SLIMRAG_WAIT or 300]"


@cli.command()
@click.argument("index", type=click.Path(exists=True, file_okay=False))
@click.option("--repair", is_flag=True, help="Embed chunks awaiting vectors, drop vectors without a chunk.")
@click.option("--wait", type=click.FloatRange(min=0), default=None, help=_WAIT_HELP)
@click.option("--json", "as_json", is_flag=True)
def check(index: str, repair: bool, wait: float | None, as_json: bool) -> None:
    """Check that no live chunk has two vectors and every vector its chunk, and SQLite's integrity;
    count the chunks awaiting vectors (stored, searchable by keyword, not yet embedded: a build in
    progress or an interrupted one), which is not a problem. Exits 1 when a problem is left (after
    --repair: when it could not be repaired)."""
    from slimrag.index.core import Index

    with Index.open(index, wait=wait) as idx:
        rep = idx.check(repair=repair)
    final = rep.repair.after if rep.repair is not None and rep.repair.after is not None else rep
    if as_json:
        click.echo(json.dumps({**asdict(rep), "ok": rep.ok, "ok_after": final.ok, "awaiting": rep.awaiting,
                               "awaiting_after": final.awaiting}))
    else:
        for name in rep.rolled_back:
            click.echo(f"recovered: rolled back {name}, written by an interrupted add")
        click.echo(f"{index}: {counted(rep.chunks, 'chunk')}, {counted(rep.vector_rows, 'vector row')}"
                   + (f" ({rep.tombstoned} of removed chunks, dropped at the next compaction)"
                      if rep.tombstoned else ""))
        if rep.awaiting:
            click.echo(f"  {rep.awaiting} chunk(s) awaiting vectors: found by keyword search, embedded by "
                       f"`slimrag build --resume`, `add`, `sync` or `check --repair`")
        for line in rep.problems():
            click.echo(f"  problem: {line}")
        if rep.repair is not None:
            r = rep.repair
            click.echo(f"repaired: {len(r.dropped_parts)} part(s) dropped, {r.reembedded} chunk(s) embedded"
                       f"{', compacted' if r.compacted else ''}"
                       f"{', keyword index rebuilt' if r.rebuilt_keyword_index else ''}")
        if final.ok:
            click.echo("ok")
        else:
            click.echo("NOT OK" + ("" if repair else ": run `slimrag check --repair`")
                       + ("; SQLite damage cannot be repaired: rebuild the index" if final.sqlite_errors else ""))
    if not final.ok:
        raise SystemExit(1)


@cli.command()
@click.argument("index", type=click.Path(exists=True, file_okay=False))
@click.option("--wait", type=click.FloatRange(min=0), default=None, help=_WAIT_HELP)
@click.option("--rebuild", is_flag=True,
              help="Slim: build a fresh graph and codebooks, re-embedding every row (default: update incrementally).")
def compact(index: str, wait: float | None, rebuild: bool) -> None:
    """Write a new generation of the live vectors only (drops removed chunks' vectors, merges the
    delta parts; a slim index updates its graph in place of rebuilding it, unless --rebuild)."""
    from slimrag.index.core import Index

    with Index.open(index, wait=wait) as idx:
        idx.compact(rebuild=rebuild)
        s = idx.stats()
        click.echo(f"{index}: generation {s['generation']} ({s['gen_kind']}), {s['counts']['live_vectors']} vectors")
