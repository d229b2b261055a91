"""Verbs that read an index: search, ask, chat.

One-shot cost: these commands import only what they run. ``search`` never imports the LLM stack
(torch, transformers), and a keyword search not even the embedder's runtime; `slimrag.rag` is
imported inside the verbs that generate. ``ask`` and ``chat`` start making and loading the LLM
(importing torch, mapping the GGUF: most of a cold start) on a background thread before they open
the index and load the embedder (`slimrag.llm.backends.make_deferred`: the embedded model's
generator is a `slimrag.llm.deferred.Deferred`), and the answer starts without waiting for it:
retrieval and a grounded answer's evidence sentences need only the index and the embedder, so they
stream while the model loads, and the first call into the model waits for it. On an index whose
embedder runs on ONNX Runtime the main thread never imports torch. A build or load that failed on
the thread fails again, with its message, where the answer first needs the model.

CPU threads of the embedded LLM: `free_cores` at start (cores minus the 1-minute load average,
at least 1) unless ``OMP_NUM_THREADS`` is set. Measured on this 2-core machine at load average
~6 from other work, cold ask phase profile: first token 24.7 s and 28.0 s with torch's default
2 threads, 4.4 s and 3.9 s with 1 (runs alternated), because each of the thousands of small
parallel regions of a prefill waits for a thread the OS has descheduled. Idle, every core is used.

User-facing behaviour (issue 13): the flags shared with other verbs come from `slimrag.cli.options`
(``--llm`` checked as a URL where it is parsed, ``--llm-model``, ``--api-key`` or
``OPENAI_API_KEY``, ``--max-tokens`` and ``-k`` at least 1, ``--source`` as a stored name, folder
or glob); until the first token a status line on stderr says what is happening
(`slimrag.cli.feedback`: loading, retrieving, prefilling; only on a terminal); after the answer,
its notice (cut at the token limit, stopped in a loop), any invented citations, and the sources
by relevance.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import click

from slimrag.cli.base import SEARCH, cli, open_index
from slimrag.cli.feedback import StatusLine, print_answer_end, until_first_piece
from slimrag.cli.options import llm_options, llm_spec, non_blank, source_filter
from slimrag.config import ANSWER_MODES, SEARCH_MODES

SOURCE_HELP = "Only sources under this stored name, folder (e.g. 'guide') or glob ('docs/*.md')."


@cli.command()
@click.argument("index", type=click.Path(exists=True))
@click.argument("query", callback=non_blank)
@click.option("-k", type=click.IntRange(min=1), default=SEARCH["k"], show_default=True)
@click.option("--mode", type=click.Choice(SEARCH_MODES), default=SEARCH["mode"],
              show_default=True)
@click.option("--source", help=SOURCE_HELP)
@click.option("--json", "as_json", is_flag=True)
def search(index: str, query: str, k: int, mode: str, source: str | None, as_json: bool) -> None:
    """Search an index. On an index whose vectors are still filling in, a vector or hybrid search
    says on stderr what the vectors covered (JSON with --json) and that keyword search covered
    the rest."""
    with open_index(index) as idx:
        hits = idx.search(query, k=k, mode=mode, source=source_filter(idx, source))
        cov = idx.last_coverage
    if cov is not None and not cov.complete and mode != "keyword":
        # on stderr, so that --json's stdout keeps its shape (a list of hits)
        click.echo(json.dumps({"coverage": cov.to_dict()}) if as_json else
                   f"vectors cover {cov.embedded:,} of {cov.chunks:,} chunks ({cov.share:.0%}; {cov.filled} more "
                   f"embedded for this query); keyword search covered the {cov.awaiting:,} awaiting vectors",
                   err=True)
    if as_json:
        from slimrag.rag.wire import hit_json

        click.echo(json.dumps([hit_json(h) for h in hits]))
        return
    for i, h in enumerate(hits, 1):
        head = h.metadata.get("heading") or ""
        click.echo(click.style(f"{i}. {h.where}  {h.score:.3f}  {head}", bold=True))
        click.echo("   " + " ".join(h.text.split())[:300])


ANSWER_HELP = ("How the answer is made: 'grounded' streams the passages' best sentences with their labels, "
               "then the model's one short sentence over them; 'free' lets the model write over the passages. "
               "Either is checked against the passages. Default: the model's own (embedded SmolLM2: grounded; "
               "a remote --llm: free).")


def answer_option(func: Any) -> Any:
    """``--answer free|grounded`` (`slimrag.config.ANSWER_MODES`), received as ``answer``; None
    when not given, which leaves the choice to the generator's ``default_answer_mode``."""
    return click.option("--answer", "answer", type=click.Choice(ANSWER_MODES), default=None,
                        help=ANSWER_HELP)(func)


def print_verdict(answer: Any) -> None:
    """After a streamed answer, what the check decided (`slimrag.rag.verdict`), so the last thing the
    reader is left with is never an unmarked unsupported claim: for a free answer no passage backs,
    that it is not the answer and what the passages say, cited; for a grounded one, that the model's
    sentence (already marked where it stands) is not backed and the sentences above it are the
    passages' own. Nothing for a backed answer: its unsupported sentences are listed by
    `print_answer_end`."""
    if answer.verdict != "not_backed":
        return
    click.echo()
    if answer.mode == "grounded":
        from slimrag.rag.verdict import off_question

        said = ("repeats the passages but does not answer the question" if off_question(answer.support, answer.verdict)
                else "is not backed by the passages")
        click.echo(click.style(f"The model's sentence {said}; the sentences above, "
                               "with their labels, are what the passages say.", fg="yellow"))
        return
    click.echo(click.style(answer.shown, fg="yellow"))


def print_sources(answer: Any) -> None:
    """The end of an answer: its verdict, notice, invented citations, evidence, sources and usage
    (`slimrag demo` uses it). A grounded answer streamed its evidence already, so it is not
    listed twice."""
    print_verdict(answer)
    print_answer_end(replace(answer, evidence=()) if answer.mode == "grounded" else answer)


def free_cores() -> int:
    """Cores of this process's CPU set that the 1-minute load average leaves free, at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, round(cores - os.getloadavg()[0])))


def make_spec_generator(spec: dict[str, Any]) -> Any:
    """The generator ``spec`` names (`slimrag.cli.options.llm_spec`: ``llm`` and, for a remote one,
    ``model`` and ``api_key``; see `slimrag.llm.backends`), its build and load under way on a
    background thread where its backend allows (the embedded model; module header)."""
    from slimrag.llm.backends import make_deferred

    options = dict(spec)
    return make_deferred(options.pop("llm"), **options)


def open_for_answers(index: str, spec: dict[str, Any]) -> tuple[Any, Any]:
    """Open ``index`` and load its embedder while the generator is made and loaded on another
    thread (module header); the generator is returned at once, its build under way."""
    os.environ.setdefault("OMP_NUM_THREADS", str(free_cores()))  # read by torch when it is imported
    gen = make_spec_generator(spec)
    idx = open_index(index)
    try:
        idx.load_embedder()
    except BaseException:
        idx.close()
        raise
    return idx, gen


def rag_for(idx: Any, llm: Any, max_tokens: int, mode: str | None = None, answer: str | None = None,
            progress: Callable[[str], None] | None = None) -> Any:
    """A `RAG` over ``idx`` with ``llm`` (a generator, or its spec), ``max_tokens`` per answer,
    retrieval ``mode``, ``answer`` mode (None: the generator's default) and ``progress`` (told
    each stage until the first token)."""
    from slimrag.llm.backends import make_generator
    from slimrag.rag.pipeline import RAG, default_generation

    gen = make_generator(llm)
    return RAG(idx, gen, mode=mode, answer=answer, generation=default_generation(gen, max_tokens), progress=progress)


@contextmanager
def answering(index: str, spec: dict[str, Any], max_tokens: int, mode: str | None,
              answer: str | None = None) -> Iterator[tuple[Any, StatusLine]]:
    """What `ask` and `chat` share: a status line from the start ("loading", then the RAG's stages
    until the first token), the index and the generator loaded side by side, and the `RAG` of a
    `Session` over them (`slimrag.rag.session`, as ``serve`` and ``mcp`` hold one) that does not
    wait for the generator's load (module header); the index and the generator are closed and the
    status line cleared however the command ends (a remote generator's HTTP connections with it; a
    `slimrag.llm.deferred.Deferred` whose load still runs on its thread leaves the close to that
    thread and returns at once, the exit capping the wait as before)."""
    from slimrag.rag.session import Session

    status = StatusLine()
    status.show("loading")
    try:
        idx, generator = open_for_answers(index, spec)
        session = Session(idx, generator,
                          lambda i, gen: rag_for(i, gen, max_tokens, mode, answer, progress=status.show))
        try:
            yield session.rag(), status
        finally:
            session.close()
            generator.close()
    finally:
        status.clear()


@cli.command()
@click.argument("index", type=click.Path(exists=True))
@click.argument("question", callback=non_blank)
@click.option("-k", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--source", help=SOURCE_HELP)
@click.option("--mode", type=click.Choice(SEARCH_MODES), default=SEARCH["mode"], show_default=True,
              help="How passages are retrieved for the answer.")
@llm_options
@answer_option
@click.option("--no-llm", "no_llm", is_flag=True,
              help="Answer with the evidence alone (the passage sentences that best answer the question), "
                   "without loading or calling a model.")
@click.option("--json", "as_json", is_flag=True)
def ask(index: str, question: str, k: int, source: str | None, mode: str, llm: str | None, llm_model: str | None,
        api_key: str | None, max_tokens: int, answer: str | None, no_llm: bool, as_json: bool) -> None:
    """Answer a question from the index, streaming, then the check's verdict, the evidence and the sources."""
    if no_llm:
        evidence_only(index, question, k, source, mode, as_json)
        return
    from slimrag.llm.backends import declared_for
    from slimrag.rag.wire import answer_json

    spec = llm_spec(llm, llm_model, api_key)
    declared = declared_for(spec["llm"])
    if declared is not None and "bf16_prefill" in declared.options:
        spec["bf16_prefill"] = False  # one answer, then exit: the bf16 prefill's copy would cost more than it saves
    with answering(index, spec, max_tokens, mode, answer) as (rag, status):
        stream = rag.respond(question, k, source=source_filter(rag.index, source))
        for piece in until_first_piece(stream, status):
            if not as_json:
                click.echo(piece, nl=False)
        if as_json:
            click.echo(json.dumps(answer_json(stream.answer)))
        else:
            print_sources(stream.answer)


def evidence_only(index: str, question: str, k: int, source: str | None, mode: str, as_json: bool) -> None:
    """``ask --no-llm``: the evidence-only answer (`slimrag.rag.evidence.evidence_answer`); the LLM
    stack is never imported."""
    from slimrag.rag.evidence import evidence_answer
    from slimrag.rag.wire import answer_json

    with open_index(index) as idx:
        answer = evidence_answer(idx, question, k, mode=mode, source=source_filter(idx, source))
    if as_json:
        click.echo(json.dumps(answer_json(answer)))
        return
    click.echo(answer.text, nl=False)
    print_answer_end(answer, evidence_only=True)


@cli.command()
@click.argument("index", type=click.Path(exists=True))
@click.option("-k", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--mode", type=click.Choice(SEARCH_MODES), default=SEARCH["mode"], show_default=True,
              help="How passages are retrieved for the answer.")
@click.option("--replay", is_flag=True,
              help="Show the model its earlier answers too, as a chat transcript: follow-ups reuse the whole "
                   "previous turn's KV (faster), but a small model tends to repeat its last answer.")
@llm_options
@answer_option
def chat(index: str, k: int, mode: str, replay: bool, llm: str | None, llm_model: str | None, api_key: str | None,
         max_tokens: int, answer: str | None) -> None:
    """Multi-turn chat over an index (empty line or Ctrl-D to quit)."""
    with answering(index, llm_spec(llm, llm_model, api_key), max_tokens, mode, answer) as (rag, status):
        conv = rag.chat(replay=replay)
        status.clear()
        while True:
            try:
                q = click.prompt("you", default="", show_default=False)
            except (EOFError, click.exceptions.Abort):
                break
            if not q.strip():
                break
            stream = conv.respond(q, k)
            for piece in until_first_piece(stream, status):
                click.echo(piece, nl=False)
            print_sources(stream.answer)
