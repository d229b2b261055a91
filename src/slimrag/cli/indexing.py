"""Verbs that write or inspect an index: build, add, remove, info.

Threads: build sets ``OMP_NUM_THREADS`` (unless set) to the cores the load leaves free before the
embedder loads torch, as ``ask`` does for its LLM.

Progress: build and add show one display for the whole run on stderr (`slimrag.cli.progress`:
a bar on a terminal, periodic log lines otherwise), then print the report.

User errors end as one line that names the flag (see `slimrag.cli.options`): a config value out
of range ("--chunk-overlap must be ..."), an ``--out`` that already exists ("pass --force"), a
``--embedder-url`` that is not a URL. ``remove`` takes paths as the user types them (see
`slimrag.cli.sources`) and exits 1, after removing whatever did match, when an argument matched
nothing (as ``rm`` does for a missing file), so a script notices a typo.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from slimrag.cli.base import IDX, RAY, cli, open_index, print_report
from slimrag.cli.options import config_error, url_option_check
from slimrag.cli.progress import show_progress
from slimrag.cli.sources import example_names
from slimrag.config import DTYPES, STORAGES, IndexConfig
from slimrag.ingest.outcome import counted

#: IndexConfig field -> the build flag that sets it (for error messages).
BUILD_FLAGS = {"storage": "--storage", "chunk_tokens": "--chunk-tokens", "chunk_overlap": "--chunk-overlap",
               "dtype": "--dtype", "ignore": "--ignore", "max_file_bytes": "--max-file-mb"}
#: Bytes in the MiB of ``--max-file-mb``.
MIB = 1 << 20


def check_out(out: str, source: str, force: bool) -> None:
    """Refuse an ``--out`` that exists, in the CLI's words (the library says ``overwrite=True``).
    An index is recognised by its manifest parsing as one (format and required fields), not by a
    file named ``manifest.json``: ``--force`` never deletes a folder that is not an index."""
    from slimrag.errors import IndexFormatError
    from slimrag.index.store import manifest as manifest_file

    path = Path(out)
    if not path.exists():
        return
    if not path.is_dir():
        raise click.BadParameter(f"{out} is a file; give a folder for the index", param_hint="--out")
    has_manifest = (path / manifest_file.MANIFEST).is_file()
    if has_manifest:
        try:
            manifest_file.read(path)
        except (IndexFormatError, TypeError, ValueError, OSError) as e:
            raise click.BadParameter(
                f"{out} holds a {manifest_file.MANIFEST} that is not a slimrag index's ({e}); choose another "
                "folder (--force never deletes a folder that is not an index)", param_hint="--out") from None
    elif any(path.iterdir()):
        raise click.BadParameter(f"{out} is a folder that is not an index and not empty; choose another "
                                 "folder (--force never deletes a folder that is not an index)", param_hint="--out")
    if not force:
        hint = f"; or update it with `slimrag add {out} {source}`" if has_manifest else ""
        raise click.BadParameter(f"{out} already exists; pass --force to replace it{hint}", param_hint="--out")


@cli.command()
@click.argument("source", type=click.Path(exists=True))
@click.option("-o", "--out", required=True, type=click.Path(), help="Index folder to create.")
@click.option("--storage", type=click.Choice(STORAGES), default=IDX["storage"], show_default=True,
              help="flat: exact vectors; slim: graph + PQ codes, embeddings recomputed per query (slower). "
                   "Whole index folder, measured: slim 0.99x the text its documents yield (disfl_qa, 1.5k chunks), "
                   "0.70x (the Python docs, 497 files), 1.57x (43k one-paragraph documents: names and hashes "
                   "weigh); flat adds 1.5 KB a chunk (disfl_qa 3.1x). "
                   "auto: slim from "
                   "IndexConfig.auto_slim_chunks chunks on.")
@click.option("--chunk-tokens", default=IDX["chunk_tokens"], show_default=True)
@click.option("--chunk-overlap", default=IDX["chunk_overlap"], show_default=True)
@click.option("--dtype", type=click.Choice(DTYPES), default=IDX["dtype"], show_default=True)
@click.option("--ignore", multiple=True, help="Extra gitignore-style pattern (repeatable).")
@click.option("--max-file-mb", type=click.IntRange(min=1), default=IDX["max_file_bytes"] // MIB, show_default=True,
              help="Files larger than this (MiB; decompressed, for .gz) are skipped with a warning; the index "
                   "keeps the limit for add, sync and watch.")
@click.option("--embedder-url", callback=url_option_check,
              help="Use a remote OpenAI-compatible /v1/embeddings endpoint.")
@click.option("--embedder-model", help="Model name for --embedder-url.")
@click.option("--force", is_flag=True, help="Replace an existing index at --out (only a slimrag index, recognised by its manifest; the new one is built beside it and swapped in when done).")
@click.option("--ray", "use_ray", is_flag=True,
              help="Build the slim graph's partitions as Ray tasks (pip install 'slimrag[ray]'); reading, "
                   "embedding and the write stay here. Partitions exist past 125,000 chunks.")
@click.option("--ray-address", help="Ray cluster for --ray (host:6379, ray://host:10001, auto); implies --ray. "
                                    "Default: a local Ray on this machine's CPUs.")
@click.option("--resume", is_flag=True,
              help="Finish an interrupted build of --out (Ctrl-C, a crash): files already stored are skipped "
                   "unread, chunks awaiting vectors embedded; the index keeps its own settings.")
@click.option("--json", "as_json", is_flag=True)
def build(source: str, out: str, storage: str, chunk_tokens: int, chunk_overlap: int, dtype: str,
          ignore: tuple[str, ...], max_file_mb: int, embedder_url: str | None, embedder_model: str | None, force: bool,
          use_ray: bool, ray_address: str | None, resume: bool, as_json: bool) -> None:
    """Build an index from a folder or file.

    Stored names (cited in answers, matched by remove, sync and --source): a file of the folder is
    named by its path relative to the folder (guide/cats.md); a file from anywhere else, added
    later, by its absolute path. An index built from a single file has no indexed folder and
    names every file by its absolute path."""
    from slimrag.cli.asking import free_cores
    from slimrag.index.core import Index
    from slimrag.index.store.layout import MANIFEST

    # torch's threads for the bfloat16 embedder, as for ask's LLM (slimrag.cli.asking): on a busy
    # machine one thread embeds faster than two that wait on each other (docs/benchmarks.md)
    os.environ.setdefault("OMP_NUM_THREADS", str(free_cores()))

    try:
        cfg = IndexConfig(storage=storage, chunk_tokens=chunk_tokens, chunk_overlap=chunk_overlap, dtype=dtype,
                          ignore=ignore, max_file_bytes=max_file_mb * MIB)
    except ValueError as e:
        raise config_error(e, BUILD_FLAGS) from e
    if embedder_model and not embedder_url:
        raise click.UsageError("--embedder-model names a model of the --embedder-url server: give --embedder-url too")
    if (use_ray or ray_address) and storage == "flat":
        raise click.UsageError("--ray builds a slim graph's partitions on Ray: use it with --storage slim or auto")
    if not (resume and (Path(out) / MANIFEST).is_file()):
        check_out(out, source, force)
    embedder = None
    if embedder_url:
        from slimrag.embed.remote import RemoteEmbedder

        embedder = RemoteEmbedder(embedder_url, embedder_model or "default")
    on_ray: contextlib.AbstractContextManager = contextlib.nullcontext()
    if use_ray or ray_address:
        from slimrag.index.store.slim.ray_build import ray_partitions

        on_ray = ray_partitions(ray_address)
    replacing = force and Path(out).exists() and not resume  # an interrupted replacement is deleted
    try:
        with show_progress(), on_ray:
            idx = Index.build(source, out, config=cfg, embedder=embedder, overwrite=force, resume=resume)
    except KeyboardInterrupt:  # the text stored so far answers; the rest waits for --resume
        if not replacing and (Path(out) / MANIFEST).is_file():
            click.echo(f"interrupted: {out} answers from what it stored (chunks awaiting vectors are found by "
                       f"keyword search); `slimrag build {source} -o {out} --resume` finishes it", err=True)
        raise SystemExit(130) from None
    print_report(idx.last_report, as_json)


@cli.command()
@click.argument("index", type=click.Path(exists=True))
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--ray", "use_ray", is_flag=True,
              help="Parse and embed on Ray (pip install 'slimrag[ray]'); the index is written here.")
@click.option("--ray-address", help="Ray cluster to use (host:6379, ray://host:10001, auto); implies --ray. "
                                    "Default: a local Ray on this machine's CPUs.")
@click.option("--embed-actors", type=click.IntRange(min=1), default=RAY["num_embed_actors"],
              help="Embedding actors with --ray  [default: half the cluster's CPUs]")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def add(ctx: click.Context, index: str, paths: tuple[str, ...], use_ray: bool, ray_address: str | None,
        embed_actors: int | None, as_json: bool) -> None:
    """Add or update files or folders in an index. Exits 1 when every file it met was skipped
    (binary, unreadable, too large: the warnings say which), as `remove` does for a path that
    matched nothing, so a script notices.

    Stored names: a file inside the folder the index was built from is named by its path relative
    to that folder (guide/cats.md); any other file, from another folder, drive or mount, by its
    absolute path (/home/me/notes/dogs.md), which stays right if the indexed folder moves. An
    unchanged file added again is recognised by that name and not read twice."""
    with open_index(index) as idx:
        with show_progress():  # its last line before the report
            if use_ray or ray_address:
                from slimrag.index.distributed import ray_ingest

                try:
                    rep = ray_ingest(idx, list(paths), address=ray_address, num_embed_actors=embed_actors)
                except ValueError as e:
                    raise click.UsageError(str(e)) from e
            else:
                rep = idx.add(list(paths))
        print_report(rep, as_json)
    if rep.skipped and not (rep.added or rep.updated or rep.unchanged):
        if not as_json:
            click.echo(f"warning: nothing was added: {counted(len(rep.skipped), 'file')} met, every one skipped", err=True)
        ctx.exit(1)


@cli.command()
@click.argument("index", type=click.Path(exists=True))
@click.argument("paths", nargs=-1, required=True)
@click.pass_context
def remove(ctx: click.Context, index: str, paths: tuple[str, ...]) -> None:
    """Remove documents: PATHS as you would type them (relative to here or to the indexed folder,
    or absolute), folders, or quoted globs ('notes/*.txt'); `slimrag info INDEX --docs` lists the
    stored names. Exits 1 when a path matched nothing (after removing what did match)."""
    with open_index(index) as idx:
        removal = idx.remove_matching(paths, warn=False)  # names matched under the writer lock
        names = [d.source for d in idx.documents()] if removal.nothing else []
    for arg in removal.nothing:
        click.echo(f"warning: nothing in {index} matches {arg!r}; stored names look like "
                   f"{example_names(names)} (see `slimrag info {index} --docs`)", err=True)
    click.echo(f"removed {counted(len(removal.sources), 'document')} ({counted(removal.chunks, 'chunk')})")
    if removal.nothing:
        ctx.exit(1)



def text_report(idx: Any, folder: dict[str, Any]) -> dict[str, Any]:
    """What `info` says about the text store: the bytes of text the documents yielded, the
    catalog's bytes by part (`Index.text_bytes`), and the whole folder's size over the text
    (`Index.stats` leaves out SQLite's transient ``-shm`` file)."""
    store = idx.text_bytes()
    return {**store, "catalog_bytes": folder["catalog"], "folder_bytes": folder["total"],
            "ratio": folder["total"] / store["bytes"] if store["bytes"] else 0.0}


@cli.command()
@click.argument("index", type=click.Path(exists=True), required=False)
@click.option("--docs", is_flag=True, help="List stored documents.")
@click.option("--llm", "show_llm", is_flag=True, help="Load the embedded LLM and report its load time.")
@click.option("--json", "as_json", is_flag=True)
def info(index: str | None, docs: bool, show_llm: bool, as_json: bool) -> None:
    """Show an index's counts, bytes on disk and config (INDEX); with --llm, time the model load."""
    if docs and not index:
        raise click.UsageError("--docs lists an index's documents: give the INDEX folder too")
    if not index and not show_llm:
        raise click.UsageError("tell me what to describe: an INDEX folder (`slimrag info docs.slimrag`, "
                               "add --docs to list its documents) and/or --llm to time loading the "
                               "embedded model")
    out: dict[str, Any] = {}
    if index:
        with open_index(index) as idx:
            out["index"] = idx.stats()
            out["index"]["text"] = text_report(idx, out["index"]["bytes"])
            if docs:
                out["documents"] = [asdict(d) for d in idx.documents()]
    if show_llm:
        from slimrag.llm.weights import load_model

        t0 = time.perf_counter()
        loaded = load_model()
        out["llm"] = {"path": str(loaded.path), "load_s": round(time.perf_counter() - t0, 3)}
    if as_json:
        click.echo(json.dumps(out, indent=2, default=str))
        return
    if "index" in out:
        s = out["index"]
        c, b = s["counts"], s["bytes"]
        click.echo(f"{s['path']}: {s['gen_kind']} (storage={s['storage']}), generation {s['generation']}, "
                   f"embedder {s['embedder']['id']}")
        if s.get("slim_bytes"):
            click.echo(f"  slim: {s['slim_bytes']['per_vector']:.1f} B/vector + "
                       f"{s['slim_bytes']['fixed']:,.0f} B fixed (codebooks)")
        cov = s["coverage"]
        click.echo(f"  {counted(c['documents'], 'document')}, {counted(c['chunks'], 'chunk')}, "
                   f"{counted(c['live_vectors'], 'live vector')}, "
                   f"{cov['share']:.0%} embedded" + (f" ({cov['awaiting']:,} awaiting vectors: "
                                                     "`slimrag build --resume` or `add` embeds them)"
                                                     if cov["awaiting"] else ""))
        t = s["text"]
        cp = t["catalog_parts"]
        click.echo(f"  bytes: catalog {t['catalog_bytes']:,} (text {cp['text']:,}, keyword index {cp['keyword']:,}, "
                   f"documents {cp['documents']:,}, other {cp['other'] + cp['free']:,}), vectors {b['generation']:,}, "
                   f"delta {b['delta']:,}, total {t['folder_bytes']:,}")
        click.echo(f"  text: {t['bytes']:,} bytes from the documents; the index folder is {t['ratio']:.2f}x that"
                   + ("" if t["compact"] else " (catalog built before the compact text store: `slimrag compact` "
                      "converts it)"))
        for d in out.get("documents", []):
            click.echo(f"  {d['source']}  {d['size']:,} B  {d['doc_id'][:12]}")
    if "llm" in out:
        m = out["llm"]
        click.echo(f"llm: {m['path']} loaded in {m['load_s']:.2f}s (read in place)")

