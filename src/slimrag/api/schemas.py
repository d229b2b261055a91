"""The server's wire format: pydantic request bodies in, plain JSON objects out.

Requests
    Bodies are validated strictly (``"1"`` is not an int, ``1`` is not a string) and unknown
    fields are ignored, so a client sending OpenAI fields slimrag does not honour still works.
    A failure becomes one 400 naming the parameter (see `validation_error`). Every constraint is
    declared in the JSON schema that ``/openapi.json`` publishes (lengths, bounds, patterns), and
    checked by the same rule that schema states, so a request the schema calls valid is answered
    and one it calls invalid gets 400 (schemathesis checks both ways in the test suite).

Text
    Every text (a query, an embedding input, a message, a stop string) is refused when it holds a
    NUL character (SQLite and C libraries cut strings there) or a lone UTF-16 surrogate (JSON's
    ``"\\ud800"``: it cannot be encoded as UTF-8, so tokenizers and SQLite refuse it). Texts that
    are searched or embedded must also hold a character other than ASCII white space
    (`NONBLANK_PATTERN`); a message may be empty, but some user message must hold text.

Limits (each a constant here, published in the schema; a larger body is 413 before parsing)
    ``MAX_K`` 100 passages per chat or search request. ``MAX_TOKENS`` 4,096 for ``max_tokens``
    and ``max_completion_tokens`` (an answer longer than that is not an answer to a question about
    passages; the local model's whole context is 8,192). ``MAX_MESSAGES`` 64 chat messages (only
    the last eight before the question are used as history). ``MAX_TEXT_CHARS`` 32,000 characters
    per message, text part or embedding input (the embedder reads 256 tokens, about 1,000
    characters, of each anyway); ``MAX_QUERY_CHARS`` 4,000 per search query (keyword search ORs
    every word of it). ``MAX_EMBED_INPUTS`` 256 strings per embeddings request: OpenAI allows
    2,048, but on a CPU a batch of 2,048 full-length texts takes minutes, and one request must not
    hold a worker that long; send several requests. ``stop``: at most 4 strings of at most
    `MAX_STOP_CHARS` each, as OpenAI. ``temperature`` in [0, 2], ``top_p`` in (0, 1], ``n`` 1.

Source filters
    ``source`` is a SQLite GLOB on stored source paths (``docs/*.md``): at most `MAX_GLOB_CHARS`
    256 characters and `MAX_GLOB_WILDCARDS` 8 wildcards (``*`` and ``?``, counted also inside
    ``[...]``); SQLite refuses patterns it finds too complex, and matching time grows with the
    number of wildcards. A glob is matched against stored names only: it never opens a file.

Responses
    `usage_json` is OpenAI's ``usage`` object with ``prompt_tokens_details.cached_tokens``
    (tokens served from a KV or prefix cache and not computed) and two fields of ours beside it:
    ``recomputed_tokens`` (tokens served from the cache and computed again anyway: blend reuse's
    recompute set) and ``reuse`` (``"exact"``: cached tokens are bitwise what a fresh prefill
    gives; ``"blend"``: passages were reused out of their first context, see
    `slimrag.llm.kv.blend`). OpenAI clients read ``cached_tokens`` and ignore the rest. Hits,
    passages, evidence and support are sent in the shape every shell sends (`slimrag.rag.wire`):
    a hit's ``score`` ranks it within its search, its ``similarity`` is its cosine with the query
    (``null`` for a hit only keyword search found; `slimrag.types.Hit.similarity`).
    `ErrorBody` is the error shape.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from slimrag.config import SearchConfig
from slimrag.rag.wire import hit_json as hit_json  # a search hit, as every shell sends it
from slimrag.types import Usage

#: Passages per request (chat ``k``, search ``k``) at most.
MAX_K = 100
#: ``max_tokens`` / ``max_completion_tokens`` at most.
MAX_TOKENS = 4096
#: Chat messages per request at most.
MAX_MESSAGES = 64
#: Characters per message content, text part or embedding input at most.
MAX_TEXT_CHARS = 32_000
#: Characters per search query at most.
MAX_QUERY_CHARS = 4_000
#: Strings per embeddings request at most (OpenAI allows 2,048; see the module header).
MAX_EMBED_INPUTS = 256
#: Stop strings: how many, and characters each.
MAX_STOP, MAX_STOP_CHARS = 4, 256
#: Characters and wildcards (``*``, ``?``) of a ``source`` glob at most.
MAX_GLOB_CHARS, MAX_GLOB_WILDCARDS = 256, 8

#: Any text: no NUL. (Lone surrogates are refused too, by encoding; JSON schema cannot say so.)
TEXT_PATTERN = r"^[^\x00]*$"
#: Text that is searched or embedded: no NUL and some character other than ASCII white space.
NONBLANK_PATTERN = r"^[^\x00]*[^\x00\t\n\x0b\x0c\r ][^\x00]*$"
#: A source glob: no NUL, at most `MAX_GLOB_WILDCARDS` of ``*`` and ``?``.
GLOB_PATTERN = rf"^[^\x00*?]*([*?][^\x00*?]*){{0,{MAX_GLOB_WILDCARDS}}}$"


def _matching(pattern: str, what: str) -> AfterValidator:
    """A validator refusing lone surrogates and text that does not match ``pattern`` (the one the
    schema publishes; Python's ``re`` reads it as JSON schema's regexes do)."""
    rule = re.compile(pattern)

    def check(text: str) -> str:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"the text holds a lone UTF-16 surrogate at character {exc.start} "
                             "(an escape such as \\ud800 without its pair); send valid Unicode") from None
        if (at := text.find("\x00")) >= 0:
            raise ValueError(f"the text holds a NUL character (\\u0000) at character {at}; remove it")
        if not rule.match(text):
            raise ValueError(what)
        return text

    return AfterValidator(check)


#: Any text (may be empty).
Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS, json_schema_extra={"pattern": TEXT_PATTERN}),
                 _matching(TEXT_PATTERN, "the text holds a NUL character")]
_BLANK = "the text is empty or white space only; send some words"
#: Text that is embedded (an embedding input).
NonBlankText = Annotated[str, Field(max_length=MAX_TEXT_CHARS, json_schema_extra={"pattern": NONBLANK_PATTERN}),
                         _matching(NONBLANK_PATTERN, _BLANK)]
#: A search query.
Query = Annotated[str, Field(max_length=MAX_QUERY_CHARS, json_schema_extra={"pattern": NONBLANK_PATTERN}),
                  _matching(NONBLANK_PATTERN, _BLANK)]
#: A ``source`` filter.
Glob = Annotated[str, Field(max_length=MAX_GLOB_CHARS, json_schema_extra={"pattern": GLOB_PATTERN}),
                 _matching(GLOB_PATTERN, f"a source glob may hold at most {MAX_GLOB_WILDCARDS} wildcards (* and ?); narrow "
                                         "the pattern")]
_NONBLANK = re.compile(NONBLANK_PATTERN)


def _integral(value: object) -> object:
    """``88.0`` as ``88``: JSON schema's integers include floats with no fraction, and clients
    (JavaScript ones) send them; ``"88"`` and ``true`` stay refused."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _int(lo: int | None = None, hi: int | None = None) -> Any:
    """An integer as JSON schema means it (see `_integral`) in ``[lo, hi]``; the bounds sit under
    the validator so that the schema publishes them as ``minimum`` and ``maximum``."""
    return Annotated[int, Field(ge=lo, le=hi), BeforeValidator(_integral)]


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class TextPart(_Body):
    """A text part of a message's content list (other part types are refused)."""

    type: Literal["text"]
    text: Text


class ChatMessage(_Body):
    """One OpenAI chat message."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | Annotated[list[TextPart], Field(max_length=MAX_MESSAGES)] | None = None

    def text(self) -> str:
        """The content as text."""
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""

    def is_question(self) -> bool:
        """A user message holding text: what retrieval and the answer can be for."""
        return self.role == "user" and _NONBLANK.match(self.text()) is not None


def _has_question(messages: list[ChatMessage]) -> list[ChatMessage]:
    if not any(m.is_question() for m in messages):
        raise ValueError("no user message holds text: the last user message is the question that retrieval "
                         "and the answer are for")
    return messages


_NONBLANK_SCHEMA = {"type": "string", "pattern": NONBLANK_PATTERN}
#: What ``messages`` must contain, in the schema's words (a user message with text).
QUESTION_SCHEMA = {
    "type": "object", "required": ["role", "content"],
    "properties": {"role": {"const": "user"},
                   "content": {"anyOf": [_NONBLANK_SCHEMA, {"type": "array", "contains": {
                       "type": "object", "required": ["type", "text"], "properties": {"text": _NONBLANK_SCHEMA}}}]}},
}


class StreamOptions(_Body):
    """OpenAI's ``stream_options``."""

    include_usage: bool = False


class ChatRequest(_Body):
    """``POST /v1/chat/completions`` (OpenAI's fields slimrag honours, plus ``k`` and ``source``).
    The question is the last user message with text; messages after it are not used."""

    model: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES,
                                                 json_schema_extra={"contains": QUESTION_SCHEMA}),
                        AfterValidator(_has_question)]
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: _int(1, MAX_TOKENS) | None = None
    max_completion_tokens: _int(1, MAX_TOKENS) | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: (Annotated[Text, Field(max_length=MAX_STOP_CHARS)]
           | Annotated[list[Annotated[Text, Field(max_length=MAX_STOP_CHARS)]], Field(max_length=MAX_STOP)]
           | None) = None
    n: _int(1, 1) = Field(1, description="Only 1: ask again for another answer.")
    k: _int(1, MAX_K) = 4
    source: Glob | None = None
    evidence_only: bool = Field(False, description=(
        "Answer with the evidence alone: the passage sentences that best answer the question, each with "
        "its [label], without calling the model (slimrag ask --no-llm)."))
    answer: Literal["free", "grounded"] | None = Field(None, description=(
        "How the answer is made: 'grounded' streams the passages' best sentences with their [label]s, then "
        "the model's one short sentence; 'free' lets the model write over the passages. Both are checked: "
        "slimrag.verdict and slimrag.shown say what to present. Default: the model's own (embedded: grounded)."))


class EmbeddingsRequest(_Body):
    """``POST /v1/embeddings``. ``dimensions``, when given, must be the embedder's (the served
    schema lists it)."""

    input: NonBlankText | Annotated[list[NonBlankText], Field(min_length=1, max_length=MAX_EMBED_INPUTS)]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: _int() | None = None


class SearchRequest(_Body):
    """``POST /v1/search``."""

    query: Query
    k: _int(1, MAX_K) = SearchConfig().k
    source: Glob | None = None
    mode: Literal["vector", "keyword", "hybrid"] | None = Field(None, description=(
        f"none: the server's mode, SearchConfig.mode ({SearchConfig().mode!r} unless the server sets another)"))


class ErrorDetail(BaseModel):
    """OpenAI's error object."""

    message: str
    type: Literal["invalid_request_error", "server_error"]
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """Every error answer: ``{"error": {...}}``."""

    error: ErrorDetail


def usage_json(u: Usage) -> dict[str, Any]:
    """OpenAI's ``usage`` object, with how the prompt's KV was reused (see the module header)."""
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens, "recomputed_tokens": u.recomputed_tokens,
                                      "reuse": u.reuse}}
