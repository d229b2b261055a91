"""What `ask` and `chat` show while they wait and after an answer.

Status line: until the first token, one line on stderr names the stage the command is in
(``loading the models...`` while the index, the embedder and the LLM load, then ``retrieving
passages...`` and ``prefilling the prompt...`` from `RAG.progress`). The line is rewritten in place (carriage return, erase line) and
erased when the answer starts, so nothing of it is left in the scrollback. It is drawn only when
stderr is a terminal: piped or captured output stays exactly the answer.

After the answer: a notice when it was cut at the token limit or stopped in a loop
(`Answer.notice`), a warning naming citations the model invented, the evidence (the passage
sentences that best answer the question, each with its label: what a reader checks the answer
against), the answer sentences no passage backs (with the numbers and names found in no passage),
then the sources by relevance with their scores, split into "used" (backing an answer sentence)
and "also retrieved" once attribution has run, and the usage line. An evidence-only answer
(``ask --no-llm``) is its evidence, so the evidence is not repeated and there is no usage line.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import IO, Any

import click

#: stage name (`RAG.progress`, or "loading") -> what the status line says.
STAGES: dict[str, str] = {
    "loading": "loading the models",
    "retrieving": "retrieving passages",
    "prefilling": "prefilling the prompt",
}

_ERASE = "\r\033[K"


class StatusLine:
    """One self-erasing line on ``stream`` (stderr by default); drawn only when ``enabled``
    (default: the stream is a terminal). Not thread-safe: one per command."""

    def __init__(self, stream: IO[str] | None = None, enabled: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.shown = False

    def show(self, stage: str) -> None:
        """Replace the line with ``stage``'s text (`STAGES`; an unknown stage is shown as named)."""
        if not self.enabled:
            return
        self.stream.write(f"{_ERASE}{STAGES.get(stage, stage)}...")
        self.stream.flush()
        self.shown = True

    def clear(self) -> None:
        """Erase the line, if one is shown."""
        if self.shown:
            self.stream.write(_ERASE)
            self.stream.flush()
            self.shown = False


def until_first_piece(pieces: Iterable[Any], status: StatusLine) -> Iterator[Any]:
    """``pieces`` unchanged, erasing the status line before the first one is passed on (and when
    the stream ends or fails before any)."""
    try:
        for piece in pieces:
            status.clear()
            yield piece
    finally:
        status.clear()


def print_evidence(answer: Any) -> None:
    """The answer's evidence sentences ("Evidence:"), each with its passage label."""
    if not answer.evidence:
        return
    click.echo("\nEvidence:")
    for e in answer.evidence:
        click.echo(f'  {e.lead}"{e.line}" [{e.label}]')  # as `Evidence.quoted`, the sentence in quotes


def print_unsupported(answer: Any) -> None:
    """The answer sentences no passage backs, and the numbers and names found in no passage."""
    for s in answer.support:
        if s.supported:
            continue
        why = f" ({', '.join(s.unknown_terms)}: in no passage)" if s.unknown_terms else ""
        click.echo(click.style(f"unsupported: \"{s.sentence}\"{why}", fg="yellow"))


def _source_lines(hits: Any) -> None:
    for h in hits:
        page = f" p. {h.page}" if h.page is not None else ""
        click.echo(f"  [{h.label}]{page} score {h.score:.3f}")


def print_answer_end(answer: Any, *, evidence_only: bool = False) -> None:
    """After a streamed answer: its notice, any invented citations, evidence, unsupported
    sentences, its sources (used, then also retrieved) and usage (module header)."""
    click.echo()
    if answer.notice:
        click.echo(click.style(answer.notice, fg="yellow"))
    if answer.unknown_citations:
        click.echo(click.style("warning: the answer cites passages it was not given: "
                               + ", ".join(answer.unknown_citations), fg="yellow"))
    if not answer.sources:
        click.echo(click.style("Sources: none (nothing in the index is close enough to the question)", dim=True))
        return
    if not evidence_only:
        print_evidence(answer)
        print_unsupported(answer)
    if answer.support or evidence_only:
        used = [h for h in answer.sources if h.label in answer.used]
        click.echo("\nSources used:" if used else "\nSources used: none (no answer sentence matches a passage)")
        _source_lines(used)
        if answer.also_retrieved:
            click.echo("Also retrieved:")
            _source_lines(answer.also_retrieved)
    else:
        click.echo("\nSources:")
        _source_lines(answer.sources)
    u = answer.usage
    if evidence_only:
        click.echo(click.style(f"  (evidence only, no model; {u.total_s:.2f}s)", dim=True))
        return
    click.echo(click.style(f"  ({u.prompt_tokens} prompt tokens, {u.cached_tokens} cached, "
                           f"{u.completion_tokens} generated; first token {u.ttft_s:.2f}s, "
                           f"total {u.total_s:.2f}s)", dim=True))
