"""`Turn`: one question ready to answer, what `RAG.turn` makes and `RAG.answer` streams.

Its own module so that `slimrag.rag.chat` names it without importing the pipeline (which builds
a `Chat` in `RAG.chat`: the two would import each other).
"""

from __future__ import annotations

from dataclasses import dataclass

from slimrag.prompt import Prompt
from slimrag.types import Hit


@dataclass
class Turn:
    """One question ready to answer: its prompt (None when it is below the relevance floor and
    gets the fixed reply), the hits behind its passages, and when it started."""

    prompt: Prompt | None
    hits: list[Hit]
    t0: float
    #: what evidence is ranked against: the question as asked (a follow-up's passages already
    #: carry the subject; its condensed query's extra words would outweigh what it asks)
    question: str = ""
