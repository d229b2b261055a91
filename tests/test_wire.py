"""One JSON shape for every shell (issue 29 item 5, `slimrag.rag.wire`): the HTTP API's ``slimrag``
field, MCP's results and the CLI's ``--json`` carry the same hits, passages, evidence, support and
verdict, field for field, and every label is the library's own (`Hit.label`, `Chunk.label`). A real
index built by the real embedder, a real check of a real answer."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.mcp.results import AnswerResult, PassageExcerpt, PassageHit
from slimrag.rag.attribution import attribute
from slimrag.rag.evidence import evidence_answer
from slimrag.rag.verdict import judge
from slimrag.rag.wire import answer_json, checked_json, excerpt_json, hit_json
from slimrag.serve.chat import SNIPPET_CHARS, WireAnswer, extension
from slimrag.serve.web import PassageOut
from slimrag.types import Answer

DOCS = [("kitchen/bread.md", "Bread\n\nKnead the dough for ten minutes. Bake the loaf at 220 degrees for forty minutes.\n"
         + "The crust browns in the last ten minutes.\n" * 40),
        ("kitchen/soup.md", "Soup\n\nSimmer lentils with onion and cumin for half an hour.\n")]
QUESTION = "How long should the loaf bake?"


@pytest.fixture(scope="module")
def idx(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Index]:
    root: Path = tmp_path_factory.mktemp("wire")
    index = Index.build(DOCS, root / "w.slimrag", embedder=embedder, storage="flat")
    yield index
    index.close()


@pytest.fixture(scope="module")
def answer(idx: Index) -> Answer:
    """A checked answer: the evidence-only answer's passages and evidence, a model-like text that is
    half backed (the baking time) and half invented (the oven brand), judged as every shell judges."""
    base = evidence_answer(idx, QUESTION, 3)
    text = "Bake the loaf at 220 degrees for forty minutes. Use a Miele oven from 1987."
    check = attribute(QUESTION, text, base.sources, idx.embedder)
    verdict = judge(QUESTION, text, check, base.evidence, base.sources)
    return replace(base, text=text, support=check.support, used=check.used, verdict=verdict.kind,
                   shown=verdict.shown, marked=verdict.shown, mode="free")


def test_the_check_is_sent_the_same_by_the_api_mcp_and_the_cli(answer: Answer) -> None:
    assert answer.verdict == "partial" and [s.supported for s in answer.support] == [True, False]
    checked = checked_json(answer)
    cli = answer_json(answer)
    api = extension(WireAnswer.of(answer))
    mcp = asdict(AnswerResult.from_answer(answer))
    for key, value in checked.items():
        assert cli[key] == value and api[key] == value and mcp[key] == value, key
    assert api["sources"] == [hit_json(h, SNIPPET_CHARS) for h in answer.sources]
    assert [h["label"] for h in cli["sources"]] == [h.label for h in answer.sources]
    assert mcp["answer"] == cli["text"] == answer.text
    assert [h["label"] for h in mcp["sources"]] == [h.label for h in answer.sources]


def test_a_hit_and_a_passage_carry_the_library_label(idx: Index) -> None:
    hit = idx.search("loaf crust", k=1)[0]
    assert hit_json(hit)["label"] == hit.label == f"{hit.source}#{hit.metadata['ordinal']}"
    assert PassageHit.from_hit(hit).label == hit.label
    ex = idx.passage(hit.chunk_id, around=1)
    sent = excerpt_json(ex)
    assert sent["label"] == ex.chunk.label == hit.label
    assert all(c["label"] == f"{ex.chunk.source}#{c['ordinal']}" for c in sent["before"] + sent["after"])
    assert sent["before"] or sent["after"]
    mcp = asdict(PassageExcerpt.from_excerpt(ex))
    assert {k: mcp[k] for k in ("chunk_id", "label", "source", "page", "text", "before", "after")} == \
        {k: sent[k] for k in ("chunk_id", "label", "source", "page", "text", "before", "after")}
    assert PassageOut.model_validate(sent).model_dump() == sent  # the API's published model keeps every field
