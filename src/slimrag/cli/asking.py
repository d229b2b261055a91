"""Verbs that read an index: search, ask, chat.

One-shot cost: these commands import only what they run. ``search`` never imports the LLM stack
(torch, transformers), and a keyword search not even the embedder's runtime; `slimrag.rag` is
imported inside the verbs that generate. ``ask`` and ``chat`` start loading the LLM (importing
torch and transformers, reading the cached weights: most of a cold start) on a background thread
before they open the index and load the embedder, so the two loads overlap; the answer then waits
only for whichever is longer.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any, Generic, TypeVar

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


T = TypeVar("T")


class Background(Generic[T]):
    """``fn()`` run on a daemon thread (a failed command exits at once, not after the load);
    `result` waits for it and re-raises its exception in the caller."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), name="slimrag-preload", daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], T]) -> None:
        try:
            self._value = fn()
        except BaseException as e:  # handed to the caller by result()
            self._error = e

    def result(self) -> T:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


def load_generator(llm: str | None) -> Any:
    """The generator ``llm`` names (see `slimrag.llm.backends`), loaded (idempotent)."""
    from slimrag.llm.backends import make_generator

    gen = make_generator(llm)
    gen.load()
    return gen


def open_for_answers(index: str, llm: str | None) -> tuple[Any, Background[Any]]:
    """Open ``index`` and load its embedder while the generator loads on another thread."""
    pending = Background(lambda: load_generator(llm))
    idx = open_index(index)
    try:
        idx.embedder.load()
    except BaseException:
        idx.close()
        raise
    return idx, pending


def rag_for(idx: Any, llm: Any, max_tokens: int) -> Any:
    """A `RAG` over ``idx`` with ``llm`` (a generator, or its spec) and ``max_tokens`` per answer."""
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
    idx, generator = open_for_answers(index, llm)
    with idx:
        rag = rag_for(idx, generator.result(), max_tokens)
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
    idx, generator = open_for_answers(index, llm)
    with idx:
        conv = rag_for(idx, generator.result(), max_tokens).chat()
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

