"""Code in answers: the identifiers a sentence or a code block states, and whether the passages show them.

An answer that names code (``json.loads``, ``median(``, `rmtree`) claims that the code exists and
does what the sentence says; a 135M model invents such names readily (``json.JSONDecoder(...)`` with
made-up arguments, ``heapq.nlargest`` for the n smallest). Attribution (`slimrag.rag.attribution`)
holds each identifier to the passages like a number or a name, and checks a fenced code block as one
unit (`code_support`); the verdict (`slimrag.rag.verdict`) reads code the question does not name as
an answer to "which function ...?" and "How do I ...?". A passage shows an identifier (`shown`) by
the name itself, or by its last part where the passage documents a module's function by its bare
name (pydoc's ``loads(s, ...)`` in ``json.txt``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from slimrag.types import Hit, Support

#: A fenced code block (its body in group 1; unclosed, it runs to the end): how attribution and the
#: verdict's cut-off rule (`slimrag.rag.verdict`) both split an answer into sentences and blocks.
FENCE = re.compile(r"```[^\n]*\n(.*?)(?:```|\Z)", re.S)
#: Identifiers that code states: dotted names (``json.loads``), calls (``median(``) and a name in
#: single backticks (Markdown code: `rmtree`).
_IDENT = re.compile(r"(?<![A-Za-z0-9_.])[A-Za-z_][A-Za-z0-9_]+(?:\.[A-Za-z_][A-Za-z0-9_]+)+(?![A-Za-z0-9_])"
                    r"|(?<![A-Za-z0-9_.])[A-Za-z_][A-Za-z0-9_]*(?=\((?!s\)))"
                    r"|(?<=(?<!`)`)[A-Za-z_][A-Za-z0-9_]*(?=`(?!`))")
#: A code span of Markdown ("`make demo`", "``[A-Z]``": its text in group 1).
CODE_SPAN = re.compile(r"`([^`\n]+)`")
#: Names any Python snippet may use without a passage showing them.
_BUILTIN_CALLS = frozenset("print len str int float list dict set tuple open range isinstance type repr sorted".split())


def identifiers(text: str) -> set[str]:
    """The dotted names and called names of ``text`` (``json.loads``, ``median``), less Python's
    common built-ins: what code states and a passage must show."""
    return {m.group(0) for m in _IDENT.finditer(text)} - _BUILTIN_CALLS


def shown(ident: str, passages: str) -> bool:
    """Whether a passage shows ``ident``: the dotted name itself, or its last part where the
    passage documents a module's function by its bare name (pydoc's ``loads(s, ...)``)."""
    if re.search(rf"(?<![A-Za-z0-9_]){re.escape(ident)}(?![A-Za-z0-9_])", passages):
        return True
    last = ident.rsplit(".", 1)[-1]
    head = ident.split(".", 1)[0]
    return ("." in ident and bool(re.search(rf"(?<![A-Za-z0-9_.]){re.escape(last)}\(", passages))
            and head.lower() in passages.lower())


def code_text(hits: Sequence[Hit]) -> str:
    """The passages as code is looked up in: each one's source name (``json.txt`` documents the
    module ``json``) and text."""
    return "\n".join(f"{h.source}\n{h.text}" for h in hits)


def code_support(block: str, hits: Sequence[Hit]) -> Support:
    """A fenced code block of an answer checked as one unit: supported when every identifier and
    call it states (`identifiers`) is in some passage; the missing ones are its unknown terms. A
    block that states none (plain values) is supported only when its text is in a passage."""
    passages = code_text(hits)
    idents = identifiers(block)
    missing = tuple(sorted(i for i in idents if not shown(i, passages)))
    labels = tuple(h.label for h in hits if idents and any(shown(i, code_text([h])) for i in idents))
    ok = not missing if idents else " ".join(block.split()) in " ".join(passages.split())
    return Support(block.strip(), labels if ok else (), (), ok, missing)
