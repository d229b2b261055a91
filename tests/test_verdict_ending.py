"""A purpose clause's main clause (issue 29's check): "To copy a directory tree, shutil provides
copytree." tells a way."""

from __future__ import annotations

from slimrag.rag.verdict import answers


def test_a_main_clause_may_open_with_a_name() -> None:
    q = "How do I copy a directory tree?"
    assert answers(q, "To copy a directory tree, shutil provides copytree.")
    assert answers(q, "To copy a directory tree, the shutil module provides copytree.")
    # a purpose clause alone, or with a list after its comma, restates the goal
    assert not answers(q, "To copy an entire directory tree rooted at src to a new location dst.")
    assert not answers(q, "To copy a directory tree, its files and links.")
