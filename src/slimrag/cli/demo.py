"""`slimrag demo`: index the stdlib docs once and answer a few questions."""

from __future__ import annotations

import time

import click

from slimrag.cli.asking import answer_option, print_sources, rag_for
from slimrag.cli.base import cli, print_report


@cli.command()
@click.option("--llm", help="OpenAI-compatible base URL; default: embedded SmolLM2.")
@click.option("--rebuild", is_flag=True, help="Rebuild the demo index.")
@answer_option
def demo(llm: str | None, rebuild: bool, answer: str | None) -> None:
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
        print_report(idx.last_report, False)
    else:
        idx = Index.open(path)
        click.echo(f"Reusing the index at {path}")
    with idx:
        rag = rag_for(idx, llm, 96, answer=answer)
        t1 = time.perf_counter()
        loaded = rag.llm.load()  # before the questions, so their timings are the answers' own
        if loaded is not None:
            click.echo(f"LLM loaded in {time.perf_counter() - t1:.1f}s")
        for q in QUESTIONS:
            click.echo(click.style(f"\nQ: {q}", bold=True))
            click.echo("A: ", nl=False)
            stream = rag.respond(q, 4)
            for piece in stream:
                click.echo(piece, nl=False)
            print_sources(stream.answer)
    click.echo(f"\ndemo finished in {time.perf_counter() - t0:.1f}s")

