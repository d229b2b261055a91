"""What `ask` and `chat` show while they wait and after an answer.

Status line: until the first token, one line on stderr names the stage the command is in
(``loading the models...`` while the index, the embedder and the LLM load, then ``retrieving
passages...`` and ``prefilling the prompt...`` from `RAG.progress`). The line is rewritten in place (carriage return, erase line) and
erased when the answer starts, so nothing of it is left in the scrollback. It is drawn only when
stderr is a terminal: piped or captured output stays exactly the answer.

After the answer: a notice when it was cut at the token limit or stopped in a loop
(`Answer.notice`), a warning naming citations the model invented, then the sources by relevance
with their scores and the usage line.
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


def print_answer_end(answer: Any) -> None:
    """After a streamed answer: its notice, any invented citations, its sources and usage."""
    click.echo()
    if answer.notice:
        click.echo(click.style(answer.notice, fg="yellow"))
    if answer.unknown_citations:
        click.echo(click.style("warning: the answer cites passages it was not given: "
                               + ", ".join(answer.unknown_citations), fg="yellow"))
    if not answer.sources:
        click.echo(click.style("Sources: none (nothing in the index is close enough to the question)", dim=True))
        return
    click.echo("\nSources:")
    for h in answer.sources:
        page = f" p. {h.page}" if h.page is not None else ""
        click.echo(f"  [{h.label}]{page} score {h.score:.3f}")
    u = answer.usage
    click.echo(click.style(f"  ({u.prompt_tokens} prompt tokens, {u.cached_tokens} cached, "
                           f"{u.completion_tokens} generated; first token {u.ttft_s:.2f}s, "
                           f"total {u.total_s:.2f}s)", dim=True))
