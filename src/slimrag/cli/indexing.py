"""Verbs that write or inspect an index: build, add, remove, info."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Any

import click

from slimrag.cli.base import IDX, RAY, cli, open_index, print_report
from slimrag.config import DTYPES, STORAGES, IndexConfig


@cli.command()
@click.argument("source", type=click.Path(exists=True))
@click.option("-o", "--out", required=True, type=click.Path(), help="Index folder to create.")
@click.option("--storage", type=click.Choice(STORAGES), default=IDX["storage"], show_default=True,
              help="flat: exact vectors; slim: graph + PQ codes, embeddings recomputed per query (~19x "
                   "smaller, slower); auto: slim from IndexConfig.auto_slim_chunks chunks on.")
@click.option("--chunk-tokens", default=IDX["chunk_tokens"], show_default=True)
@click.option("--chunk-overlap", default=IDX["chunk_overlap"], show_default=True)
@click.option("--dtype", type=click.Choice(DTYPES), default=IDX["dtype"], show_default=True)
@click.option("--ignore", multiple=True, help="Extra gitignore-style pattern (repeatable).")
@click.option("--embedder-url", help="Use a remote OpenAI-compatible /v1/embeddings endpoint.")
@click.option("--embedder-model", help="Model name for --embedder-url.")
@click.option("--force", is_flag=True, help="Replace an existing index at --out.")
@click.option("--json", "as_json", is_flag=True)
def build(source: str, out: str, storage: str, chunk_tokens: int, chunk_overlap: int, dtype: str,
          ignore: tuple[str, ...], embedder_url: str | None, embedder_model: str | None, force: bool,
          as_json: bool) -> None:
    """Build an index from a folder or file."""
    from slimrag.index.core import Index

    embedder = None
    if embedder_url:
        from slimrag.embed.remote import RemoteEmbedder

        embedder = RemoteEmbedder(embedder_url, embedder_model or "default")
    cfg = IndexConfig(storage=storage, chunk_tokens=chunk_tokens, chunk_overlap=chunk_overlap, dtype=dtype,
                      ignore=ignore)
    idx = Index.build(source, out, config=cfg, embedder=embedder, overwrite=force)
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
def add(index: str, paths: tuple[str, ...], use_ray: bool, ray_address: str | None, embed_actors: int | None,
        as_json: bool) -> None:
    """Add or update files or folders in an index."""
    with open_index(index) as idx:
        if use_ray or ray_address:
            from slimrag.index.distributed import ray_ingest

            try:
                rep = ray_ingest(idx, list(paths), address=ray_address, num_embed_actors=embed_actors)
            except ValueError as e:
                raise click.UsageError(str(e)) from e
        else:
            rep = idx.add(list(paths))
        print_report(rep, as_json)


@cli.command()
@click.argument("index", type=click.Path(exists=True))
@click.argument("sources", nargs=-1, required=True)
def remove(index: str, sources: tuple[str, ...]) -> None:
    """Remove documents by their stored source path (see `slimrag info --docs`)."""
    with open_index(index) as idx:
        click.echo(f"removed {idx.remove(list(sources))} chunks")



@cli.command()
@click.argument("index", type=click.Path(exists=True), required=False)
@click.option("--docs", is_flag=True, help="List stored documents.")
@click.option("--llm", "show_llm", is_flag=True, help="Load the embedded LLM and report its load time.")
@click.option("--json", "as_json", is_flag=True)
def info(index: str | None, docs: bool, show_llm: bool, as_json: bool) -> None:
    """Show an index's counts, bytes on disk and config; with --llm, time the model load."""
    out: dict[str, Any] = {}
    if index:
        with open_index(index) as idx:
            out["index"] = idx.stats()
            if docs:
                out["documents"] = [asdict(d) for d in idx.documents()]
    if show_llm:
        from slimrag.llm.weights import load_model

        t0 = time.perf_counter()
        loaded = load_model()
        out["llm"] = {"path": str(loaded.path), "from_cache": loaded.from_cache,
                      "load_s": round(time.perf_counter() - t0, 3)}
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
        click.echo(f"  {c['documents']} documents, {c['chunks']} chunks, {c['live_vectors']} live vectors")
        click.echo(f"  bytes: catalog {b['catalog']:,}, vectors {b['generation']:,}, delta {b['delta']:,}, "
                   f"total {b['total']:,}")
        for d in out.get("documents", []):
            click.echo(f"  {d['source']}  {d['size']:,} B  {d['doc_id'][:12]}")
    if "llm" in out:
        m = out["llm"]
        click.echo(f"llm: {m['path']} loaded in {m['load_s']:.2f}s ({'cached safetensors' if m['from_cache'] else 'converted from GGUF'})")

