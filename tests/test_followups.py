"""Follow-ups that keep the subject (`slimrag.rag.condense`): the condensed query, the model's
rewrite, and the turn-2 passages of a real chat over a real index with and without condensing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import write_tree

from slimrag.config import GenerationConfig
from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.llm.base import Delta, Generator
from slimrag.prompt import Prompt
from slimrag.rag.condense import REWRITE_SYSTEM, alone, rewrite, with_words
from slimrag.rag.pipeline import RAG
from slimrag.types import Usage

CORPUS = {
    "db/autovacuum.md": "# Autovacuum\n\nThe autovacuum daemon automates VACUUM and ANALYZE. Its naptime "
                        "setting, autovacuum_naptime, defaults to one minute.",
    "db/defaults.md": "# Column defaults\n\nA column can be assigned a default value. When a new row is created "
                      "and no value is given for the column, it is filled with the column's default value.",
    "db/buffers.md": "# Shared buffers\n\nshared_buffers sets the memory the server uses for shared buffers. "
                     "The default is typically 128 megabytes.",
}


class Scripted(Generator):
    """Replies ``reply`` to every prompt and keeps the prompts: a real `Generator`, no model."""

    def __init__(self, reply: str) -> None:
        self.reply = reply
        self.prompts: list[Prompt] = []

    def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
        self.prompts.append(prompt)
        yield Delta(self.reply)
        yield Delta("", usage=Usage(prompt_tokens=1, completion_tokens=1), finish_reason="stop")


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Index]:
    root = tmp_path_factory.mktemp("follow")
    idx = Index.build(write_tree(root / "docs", CORPUS), root / "f.slimrag", embedder=embedder)
    yield idx
    idx.close()


def test_condensed_query_adds_the_subject_once() -> None:
    assert with_words("What is its default value?", ["How does autovacuum decide when to run?"]) == \
        "What is its default value? autovacuum decide run"
    assert with_words("And the defaults?", ["What is the default?"]) == "And the defaults?"  # same stem
    assert with_words("Why?", []) == "Why?" and alone("Why?", ["x y"]) == "Why?"
    # only the last earlier question joins
    assert with_words("What about it?", ["Tell me about pandas", "How does autovacuum work?"]) == \
        "What about it? autovacuum work"


def test_rewrite_asks_the_model_and_falls_back_to_words() -> None:
    gen = Scripted("What is the default value of autovacuum_naptime?\nextra line")
    got = rewrite("What is its default value?", ["What does autovacuum_naptime set?"], gen)
    assert got == "What is the default value of autovacuum_naptime?"
    sent = gen.prompts[0]
    assert sent.system == REWRITE_SYSTEM and sent.questions == ("What does autovacuum_naptime set?",)
    assert sent.passages == ()
    empty = Scripted("   ")
    assert rewrite("What is its default?", ["autovacuum naptime"], empty) == "What is its default? autovacuum naptime"


def test_follow_up_keeps_the_subject(index: Index) -> None:
    first, follow = "How often does the autovacuum daemon wake up?", "What is its default value?"
    off = RAG(index, Scripted("One minute."), condense="off").chat()
    off.ask(first, k=1)
    lost = off.ask(follow, k=1)
    assert lost.sources[0].source == "db/defaults.md"  # the follow-up alone finds column defaults
    on = RAG(index, Scripted("One minute."))
    conv = on.chat()
    conv.ask(first, k=1)
    kept = conv.ask(follow, k=1)
    assert kept.sources[0].source == "db/autovacuum.md"
    assert "one minute" in kept.evidence[0].text  # evidence: what the follow-up asks, in the subject's passage


def test_condense_is_checked(index: Index) -> None:
    with pytest.raises(ValueError, match="condense"):
        RAG(index, Scripted("x"), condense="magic")
