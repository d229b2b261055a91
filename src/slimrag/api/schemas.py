"""The server's wire format: pydantic request bodies in, plain JSON objects out.

Requests
    Bodies are validated strictly (``"1"`` is not an int, ``1`` is not a string) and unknown
    fields are ignored, so a client sending OpenAI fields slimrag does not honour still works.
    A failure becomes one 400 naming the parameter (see `validation_error`). Limits:
    `MAX_K` passages per chat or search request; `MAX_EMBED_INPUTS` strings per embeddings
    request (checked by the route, with its own message); ``stop`` at most 4 strings, as OpenAI.
    ``temperature`` is in [0, 2], ``top_p`` in (0, 1], ``max_tokens`` at least 1.

Responses
    `usage_json` is OpenAI's ``usage`` object with ``prompt_tokens_details.cached_tokens``
    (tokens served from a KV or prefix cache); `hit_json` is one retrieved passage, with the
    ``label`` the prompt gives it (what answers cite).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from slimrag.config import SearchConfig
from slimrag.types import Hit, Usage

#: Passages per request (chat ``k``, search ``k``) at most.
MAX_K = 100
#: Strings per embeddings request at most (OpenAI's limit).
MAX_EMBED_INPUTS = 2048


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class TextPart(_Body):
    """A text part of a message's content list (other part types are refused)."""

    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    """One OpenAI chat message."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        """The content as text."""
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class StreamOptions(_Body):
    """OpenAI's ``stream_options``."""

    include_usage: bool = False


class ChatRequest(_Body):
    """``POST /v1/chat/completions`` (OpenAI's fields slimrag honours, plus ``k`` and ``source``)."""

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: str | Annotated[list[str], Field(max_length=4)] | None = None
    n: int = 1
    k: int = Field(4, ge=1, le=MAX_K)
    source: str | None = None


class EmbeddingsRequest(_Body):
    """``POST /v1/embeddings``."""

    input: str | list[str]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None


class SearchRequest(_Body):
    """``POST /v1/search``."""

    query: str
    k: int = Field(SearchConfig().k, ge=1, le=MAX_K)
    source: str | None = None
    mode: Literal["vector", "keyword", "hybrid"] | None = None


def usage_json(u: Usage) -> dict[str, Any]:
    """OpenAI's ``usage`` object."""
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


def hit_json(h: Hit, snippet: int | None = None) -> dict[str, Any]:
    """A hit as JSON; ``label`` is how the prompt names the passage (what answers cite)."""
    ordinal = h.metadata.get("ordinal", 0)
    text = h.text if snippet is None or len(h.text) <= snippet else h.text[:snippet] + "…"
    return {"chunk_id": h.chunk_id, "source": h.source, "label": f"{h.source}#{ordinal}", "score": h.score,
            "text": text, "metadata": h.metadata}
