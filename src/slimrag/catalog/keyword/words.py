"""Keyword queries: their words, and as FTS5 match expressions.

A query is reduced to its words (``\\w+``), each quoted and all OR-ed, so user text with FTS5
syntax characters (quotes, ``-``, ``:``) never raises a syntax error and every word counts
towards BM25. A quoted word is a phrase of its tokens in FTS5; FTS5's ``unicode61`` tokenizer
also cuts at ``_``, so ``max_chunk_id`` is a phrase of three tokens, which needs the token
positions that only ``detail=full`` keeps. Under ``detail=none`` such a word becomes its tokens
AND-ed: a superset of the phrase's chunks, each token scored on its own. Words of one token,
nearly every word of prose, read the same under both.
"""

from __future__ import annotations

import re

_WORD = re.compile(r"\w+", re.UNICODE)
_TOKEN = re.compile(r"[^\W_]+", re.UNICODE)  # FTS5's unicode61 tokens: letters and digits


def words(query: str) -> list[str]:
    """The words of ``query`` (``\\w+``): each one phrase of its tokens, all OR-ed."""
    return _WORD.findall(query)


def match_expression(query: str, detail: str) -> str | None:
    """The FTS5 MATCH expression of ``query`` for a keyword index of ``detail``; None when the
    query has no word."""
    words = _WORD.findall(query)
    return " OR ".join(_term(w, detail) for w in words) if words else None


def _term(word: str, detail: str) -> str:
    """One query word as an FTS5 expression: a quoted string, which FTS5 reads as a phrase of
    its tokens. A phrase needs token positions, which only ``detail=full`` keeps; otherwise a
    word of several tokens is their AND (the same as the phrase for single-token words, which
    is nearly every word of prose; identifiers with underscores are where they differ)."""
    tokens = _TOKEN.findall(word)
    if detail == "full" or len(tokens) <= 1:
        return '"' + word.replace('"', '""') + '"'
    return "(" + " AND ".join(f'"{t}"' for t in tokens) + ")"
