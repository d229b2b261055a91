"""The `slimrag` command: one thin subcommand per verb over the library API.

Defaults come from the config dataclasses so the CLI and the library never disagree.
``--json`` prints machine-readable output where a script may read it.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import asdict, fields, replace
from typing import IO, Any

import click

from slimrag.config import IndexConfig, RayIngestConfig, SearchConfig
from slimrag.errors import SlimragError
from slimrag.route.policy import RouterConfig

_IDX = {f.name: f.default for f in fields(IndexConfig)}
_SEARCH = {f.name: f.default for f in fields(SearchConfig)}
_ROUTE = {f.name: f.default for f in fields(RouterConfig)}
_RAY = {f.name: f.default for f in fields(RayIngestConfig)}


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)


class _Failed(click.ClickException):
    """A `SlimragError` as the CLI reports it: one ``error:`` line on stderr, exit code 1."""

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


class _Group(click.Group):
    """The command group: a `SlimragError` from any command ends it as :class:`_Failed` (no
    traceback: the message says what to do next)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SlimragError as e:
            raise _Failed(str(e)) from e


@click.group(cls=_Group)
@click.option("-v", "--verbose", is_flag=True, help="Log progress.")
@click.version_option(package_name="slimrag")
def cli(verbose: bool) -> None:
    """slimrag: ask questions about your own files, offline."""
    _setup_logging(verbose)


def _open(path: str) -> Any:
    from slimrag.index.core import Index

    return Index.open(path)


def _report(rep: Any, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({**asdict(rep), "skipped": [asdict(s) for s in rep.skipped]}))
    else:
        click.echo(f"{rep.added} added, {rep.updated} updated, {rep.unchanged} unchanged, "
                   f"{rep.chunks} chunks, {len(rep.skipped)} skipped in {rep.seconds:.1f}s")


@cli.command()
@click.argument("source", type=click.Path(exists=True))
@click.option("-o", "--out", required=True, type=click.Path(), help="Index folder to create.")
@click.option("--storage", type=click.Choice(["flat", "slim", "auto"]), default=_IDX["storage"], show_default=True,
              help="flat: exact vectors; slim: graph + PQ codes, embeddings recomputed per query (~19x "
                   "smaller, slower); auto: slim from IndexConfig.auto_slim_chunks chunks on.")
@click.option("--chunk-tokens", default=_IDX["chunk_tokens"], show_default=True)
@click.option("--chunk-overlap", default=_IDX["chunk_overlap"], show_default=True)
@click.option("--dtype", type=click.Choice(["float32", "float16"]), default=_IDX["dtype"], show_default=True)
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
    _report(idx.last_report, as_json)


@cli.command()
@click.argument("index", type=click.Path(exists=True))
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--ray", "use_ray", is_flag=True,
              help="Parse and embed on Ray (pip install 'slimrag[ray]'); the index is written here.")
@click.option("--ray-address", help="Ray cluster to use (host:6379, ray://host:10001, auto); implies --ray. "
                                    "Default: a local Ray on this machine's CPUs.")
@click.option("--embed-actors", type=click.IntRange(min=1), default=_RAY["num_embed_actors"],
              help="Embedding actors with --ray  [default: half the cluster's CPUs]")
@click.option("--json", "as_json", is_flag=True)
def add(index: str, paths: tuple[str, ...], use_ray: bool, ray_address: str | None, embed_actors: int | None,
        as_json: bool) -> None:
    """Add or update files or folders in an index."""
    with _open(index) as idx:
        if use_ray or ray_address:
            from slimrag.index.distributed import ray_ingest

            try:
                rep = ray_ingest(idx, list(paths), address=ray_address, num_embed_actors=embed_actors)
            except ValueError as e:
                raise click.UsageError(str(e)) from e
        else:
            rep = idx.add(list(paths))
        _report(rep, as_json)


@cli.command()
@click.argument("index", type=click.Path(exists=True))
@click.argument("sources", nargs=-1, required=True)
def remove(index: str, sources: tuple[str, ...]) -> None:
    """Remove documents by their stored source path (see `slimrag info --docs`)."""
    with _open(index) as idx:
        click.echo(f"removed {idx.remove(list(sources))} chunks")


@cli.command()
@click.argument("index", type=click.Path(exists=True))
@click.argument("query")
@click.option("-k", default=_SEARCH["k"], show_default=True)
@click.option("--mode", type=click.Choice(["vector", "keyword", "hybrid"]), default=_SEARCH["mode"],
              show_default=True)
@click.option("--source", help="Only sources matching this glob, e.g. 'docs/*.md'.")
@click.option("--json", "as_json", is_flag=True)
def search(index: str, query: str, k: int, mode: str, source: str | None, as_json: bool) -> None:
    """Search an index."""
    with _open(index) as idx:
        hits = idx.search(query, k=k, mode=mode, source=source)
    if as_json:
        click.echo(json.dumps([asdict(h) for h in hits]))
        return
    for i, h in enumerate(hits, 1):
        head = h.metadata.get("heading") or ""
        click.echo(click.style(f"{i}. {h.source}#{h.metadata.get('ordinal', 0)}  {h.score:.3f}  {head}", bold=True))
        click.echo("   " + " ".join(h.text.split())[:300])


def _print_sources(answer: Any) -> None:
    click.echo("\nSources:")
    for h in answer.sources:
        click.echo(f"  [{h.source}#{h.metadata.get('ordinal', 0)}] score {h.score:.3f}")
    u = answer.usage
    click.echo(click.style(f"  ({u.prompt_tokens} prompt tokens, {u.cached_tokens} cached, "
                           f"{u.completion_tokens} generated; first token {u.ttft_s:.2f}s, "
                           f"total {u.total_s:.2f}s)", dim=True))


def _rag(idx: Any, llm: str | None, max_tokens: int) -> Any:
    from slimrag.rag.pipeline import RAG

    rag = RAG(idx, llm)
    rag.generation = replace(rag.generation, max_new_tokens=max_tokens)
    return rag


@cli.command()
@click.argument("index", type=click.Path(exists=True))
@click.argument("question")
@click.option("-k", default=4, show_default=True)
@click.option("--llm", help="OpenAI-compatible base URL (http://host:port/v1); default: embedded SmolLM2.")
@click.option("--max-tokens", default=256, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def ask(index: str, question: str, k: int, llm: str | None, max_tokens: int, as_json: bool) -> None:
    """Answer a question from the index, streaming, then list the sources."""
    with _open(index) as idx:
        rag = _rag(idx, llm, max_tokens)
        for piece in rag.stream_answer(question, k):
            if isinstance(piece, str):
                if not as_json:
                    click.echo(piece, nl=False)
            elif as_json:
                click.echo(json.dumps(asdict(piece)))
            else:
                _print_sources(piece)


@cli.command()
@click.argument("index", type=click.Path(exists=True))
@click.option("-k", default=4, show_default=True)
@click.option("--llm", help="OpenAI-compatible base URL; default: embedded SmolLM2.")
@click.option("--max-tokens", default=256, show_default=True)
def chat(index: str, k: int, llm: str | None, max_tokens: int) -> None:
    """Multi-turn chat over an index (empty line or Ctrl-D to quit)."""
    with _open(index) as idx:
        conv = _rag(idx, llm, max_tokens).chat()
        while True:
            try:
                q = click.prompt("you", default="", show_default=False)
            except (EOFError, click.exceptions.Abort):
                break
            if not q.strip():
                break
            for piece in conv.stream(q, k):
                if isinstance(piece, str):
                    click.echo(piece, nl=False)
                else:
                    _print_sources(piece)


@cli.command()
@click.argument("index", type=click.Path(exists=True))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; 0.0.0.0 exposes the server to the network (set an API key).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="0 picks a free port.")
@click.option("--api-key", envvar="SLIMRAG_API_KEY",
              help="Require 'Authorization: Bearer KEY' on /v1/ routes [env: SLIMRAG_API_KEY].")
@click.option("--llm", help="OpenAI-compatible base URL; default: embedded SmolLM2.")
def serve(index: str, host: str, port: int, api_key: str | None, llm: str | None) -> None:
    """Serve an index over HTTP: OpenAI-compatible chat completions (RAG) and embeddings, search, metrics."""
    import uvicorn

    from slimrag.rag.pipeline import RAG
    from slimrag.serve.app import create_app, warm_up

    with _open(index) as idx:
        rag = RAG(idx, llm)
        warm_up(rag)  # here, so a missing model is one error line rather than a failed startup
        if not api_key and host not in ("127.0.0.1", "localhost", "::1"):
            click.echo(f"warning: serving on {host} without an API key", err=True)
        uvicorn.run(create_app(rag, api_key=api_key, warm=False), host=host, port=port, log_level="info")


@cli.command()
@click.option("--replica", "replicas", multiple=True, required=True,
              help="A replica's URL, e.g. http://127.0.0.1:8001 (repeatable; a `slimrag serve` each).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; 0.0.0.0 exposes the router to the network.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535), help="0 picks a free port.")
@click.option("--cache-threshold", default=_ROUTE["cache_threshold"], show_default=True,
              help="Prefix match ratio from which a conversation goes back to the replica that has it.")
@click.option("--balance-abs-threshold", default=_ROUTE["balance_abs_threshold"], show_default=True,
              help="Load is imbalanced when max - min in-flight requests exceeds this ...")
@click.option("--balance-rel-threshold", default=_ROUTE["balance_rel_threshold"], show_default=True,
              help="... and max exceeds this times min; then the least-loaded replica answers.")
@click.option("--cooldown", default=_ROUTE["cooldown_s"], show_default=True,
              help="Seconds a failed replica is left out.")
def route(replicas: tuple[str, ...], host: str, port: int, cache_threshold: float, balance_abs_threshold: int,
          balance_rel_threshold: float, cooldown: float) -> None:
    """Route OpenAI-compatible requests over several `slimrag serve` replicas (cache-aware, with failover)."""
    import uvicorn

    from slimrag.route.app import create_router_app

    try:
        config = RouterConfig(cache_threshold=cache_threshold, balance_abs_threshold=balance_abs_threshold,
                              balance_rel_threshold=balance_rel_threshold, cooldown_s=cooldown)
        app = create_router_app(list(replicas), config)
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    uvicorn.run(app, host=host, port=port, log_level="info")


@cli.command()
@click.argument("index", type=click.Path(exists=True), required=False)
@click.option("--docs", is_flag=True, help="List stored documents.")
@click.option("--llm", "show_llm", is_flag=True, help="Load the embedded LLM and report its load time.")
@click.option("--json", "as_json", is_flag=True)
def info(index: str | None, docs: bool, show_llm: bool, as_json: bool) -> None:
    """Show an index's counts, bytes on disk and config; with --llm, time the model load."""
    out: dict[str, Any] = {}
    if index:
        with _open(index) as idx:
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


@cli.command()
@click.option("--llm", help="OpenAI-compatible base URL; default: embedded SmolLM2.")
@click.option("--rebuild", is_flag=True, help="Rebuild the demo index.")
def demo(llm: str | None, rebuild: bool) -> None:
    """Index the standard library's documentation and answer two questions with sources."""
    from slimrag.demo import QUESTIONS, home, write_corpus
    from slimrag.index.core import Index

    t0 = time.perf_counter()
    base = home() / "demo"
    corpus, path = base / "stdlib-docs", base / "stdlib.slimrag"
    if rebuild or not (path / "manifest.json").is_file():
        n = write_corpus(corpus)
        click.echo(f"Indexing the documentation of {n} standard-library modules (first run only)...")
        idx = Index.build(corpus, path, overwrite=True)
        _report(idx.last_report, False)
    else:
        idx = Index.open(path)
        click.echo(f"Reusing the index at {path}")
    with idx:
        rag = _rag(idx, llm, 96)
        t1 = time.perf_counter()
        loaded = rag.llm.load()  # before the questions, so their timings are the answers' own
        if loaded is not None:
            how = "cached safetensors" if loaded.from_cache else "converted from GGUF, once"
            click.echo(f"LLM loaded in {time.perf_counter() - t1:.1f}s ({how})")
        for q in QUESTIONS:
            click.echo(click.style(f"\nQ: {q}", bold=True))
            click.echo("A: ", nl=False)
            for piece in rag.stream_answer(q, 4):
                if isinstance(piece, str):
                    click.echo(piece, nl=False)
                else:
                    _print_sources(piece)
    click.echo(f"\ndemo finished in {time.perf_counter() - t0:.1f}s")


def main() -> None:
    """Entry point: run the CLI offline (slimrag errors end as one line and exit code 1, see `_Group`)."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    cli(standalone_mode=True)
