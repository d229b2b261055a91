"""Verbs that read an index: search, ask, chat."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from typing import Any

import click

from slimrag.cli.base import GENERATION, SEARCH, cli, open_index
from slimrag.config import SEARCH_MODES


@cli.command()
@click.argument("index", type=click.Path(exists=True))
@click.argument("query")
@click.option("-k", default=SEARCH["k"], show_default=True)
@click.option("--mode", type=click.Choice(SEARCH_MODES), default=SEARCH["mode"],
              show_default=True)
@click.option("--source", help="Only sources matching this glob, e.g. 'docs/*.md'.")
@click.option("--json", "as_json", is_flag=True)
def search(index: str, query: str, k: int, mode: str, source: str | None, as_json: bool) -> None:
    """Search an index."""
    with open_index(index) as idx:
        hits = idx.search(query, k=k, mode=mode, source=source)
    if as_json:
        click.echo(json.dumps([asdict(h) for h in hits]))
        return
    for i, h in enumerate(hits, 1):
        head = h.metadata.get("heading") or ""
        click.echo(click.style(f"{i}. {h.source}#{h.metadata.get('ordinal', 0)}  {h.score:.3f}  {head}", bold=True))
        click.echo("   " + " ".join(h.text.split())[:300])


def print_sources(answer: Any) -> None:
    click.echo("\nSources:")
    for h in answer.sources:
        click.echo(f"  [{h.source}#{h.metadata.get('ordinal', 0)}] score {h.score:.3f}")
    u = answer.usage
    click.echo(click.style(f"  ({u.prompt_tokens} prompt tokens, {u.cached_tokens} cached, "
                           f"{u.completion_tokens} generated; first token {u.ttft_s:.2f}s, "
                           f"total {u.total_s:.2f}s)", dim=True))


def rag_for(idx: Any, llm: str | None, max_tokens: int) -> Any:
    from slimrag.rag.pipeline import RAG

    rag = RAG(idx, llm)
    rag.generation = replace(rag.generation, max_new_tokens=max_tokens)
    return rag


@cli.command()
@click.argument("index", type=click.Path(exists=True))
@click.argument("question")
@click.option("-k", default=4, show_default=True)
@click.option("--llm", help="OpenAI-compatible base URL (http://host:port/v1); default: embedded SmolLM2.")
@click.option("--max-tokens", default=GENERATION["max_new_tokens"], show_default=True)
@click.option("--json", "as_json", is_flag=True)
def ask(index: str, question: str, k: int, llm: str | None, max_tokens: int, as_json: bool) -> None:
    """Answer a question from the index, streaming, then list the sources."""
    with open_index(index) as idx:
        rag = rag_for(idx, llm, max_tokens)
        for piece in rag.stream_answer(question, k):
            if isinstance(piece, str):
                if not as_json:
                    click.echo(piece, nl=False)
            elif as_json:
                click.echo(json.dumps(asdict(piece)))
            else:
                print_sources(piece)


@cli.command()
@click.argument("index", type=click.Path(exists=True))
@click.option("-k", default=4, show_default=True)
@click.option("--llm", help="OpenAI-compatible base URL; default: embedded SmolLM2.")
@click.option("--max-tokens", default=GENERATION["max_new_tokens"], show_default=True)
def chat(index: str, k: int, llm: str | None, max_tokens: int) -> None:
    """Multi-turn chat over an index (empty line or Ctrl-D to quit)."""
    with open_index(index) as idx:
        conv = rag_for(idx, llm, max_tokens).chat()
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
                    print_sources(piece)

