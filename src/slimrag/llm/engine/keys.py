"""Where the embedded engine files a prompt's K/V in the knowledge tree: its root key and passage path.

A prompt's cacheable segments are all but the last (the question, never cached): the system
segment, then the passages in prompt order (and, in a chat, the kept turns). The tree root is the
system segment's key namespaced by the model (:func:`slimrag.prompt.root_key`, the one rule the
planner walks by too), so two models or two system prompts never share entries; the path is the
other segments' content-addressed keys (``Prompt.passage_key``). One home for this rule:
:meth:`slimrag.llm.local.LocalGenerator.start` (a request's path) and
:meth:`~slimrag.llm.local.LocalGenerator.keep` both read it here.
"""

from __future__ import annotations

from collections.abc import Sequence

from slimrag.prompt import Segment, root_key


def tree_path(namespace: str, segments: Sequence[Segment]) -> tuple[str, list[str]]:
    """The tree root and passage keys of ``segments`` (the system segment first, each with a
    key); a ValueError when one has no key (a question segment) or there are none."""
    if not segments or any(s.key is None for s in segments):
        raise ValueError("only cacheable segments (each with a key, the system segment first) have a tree path")
    head, *rest = segments
    return root_key(namespace, str(head.key)), [str(s.key) for s in rest]


def cache_path(namespace: str, segments: Sequence[Segment]) -> tuple[str, list[str]]:
    """The tree root and passage keys of a whole prompt's cacheable segments (all but the last)."""
    return tree_path(namespace, segments[:-1])
