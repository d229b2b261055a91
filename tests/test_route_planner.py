"""The router's own retrieval (`RoutePlanner`, ``slimrag route --index``) follows the index as the
replicas do: a document added by another process after the router started is in the next plan
(issue 31), found through the index's version token and a reopen with the same embedder."""

from __future__ import annotations

from pathlib import Path

from conftest import DOCS, write_tree

from slimrag.api.schemas import ChatRequest
from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.route.planner import RoutePlanner

GLACIER = "The Perito Moreno glacier in Patagonia advances about two metres a day."


def chat(question: str) -> ChatRequest:
    return ChatRequest.model_validate({"messages": [{"role": "user", "content": question}], "k": 2})


def test_a_plan_names_chunks_added_after_the_planner_opened(tmp_path: Path, embedder: LocalEmbedder) -> None:
    docs = write_tree(tmp_path / "docs", DOCS)
    root = tmp_path / "plan.slimrag"
    Index.build(docs, root, embedder=embedder).close()
    planner = RoutePlanner(root, floor=None)
    try:
        # no word in common with the new text: a stale handle finds new chunks by keyword (and
        # scores them as awaiting vectors), so only the vector side tells a reopen from none
        question = chat("Which frozen river creeps forward through southern Argentina?")
        before = planner.plan(question)
        assert before is not None
        embedder_before = planner._followed.index.embedder  # type: ignore[union-attr]
        with Index.open(root, embedder=embedder) as writer:  # another handle: another process's add
            writer.add([("notes/glacier.txt", GLACIER)])
            added = {h.chunk_id for h in writer.search("Perito Moreno glacier", k=1)}
        after = planner.plan(question)
        assert after is not None
        ids = {chunk for chunk, _ in after.hits}
        assert added <= ids and not added <= {chunk for chunk, _ in before.hits}
        assert planner._followed.index.embedder is embedder_before  # type: ignore[union-attr]  # reopened, not reloaded
        assert planner.plan(question) == after  # nothing moved: the same handle, the same plan
    finally:
        planner.close()
