"""``POST /v1/chat/completions`` as RAG: from OpenAI messages to a question, and from an answer to
OpenAI's completion or server-sent events.

Messages
    The last user message holding text is the question; it is what retrieval searches for (some
    user message must hold text, as the published schema says; messages after it, such as an
    assistant prefill, are not used). Earlier user and assistant messages become the chat history (the last `HISTORY_MESSAGES`, four turns, as
    `Chat` keeps). Client system messages are ignored: the served RAG's system prompt stays, so it
    remains the byte-identical prefix that KV caches reuse.

Sampling
    ``max_tokens`` (or ``max_completion_tokens``, which wins), ``temperature``, ``top_p`` and
    ``stop`` become a `GenerationConfig`; unset ones keep the served RAG's (greedy, 256 tokens,
    unlike OpenAI's temperature 1).

Streaming
    ``stream: true`` answers with server-sent events in OpenAI's chunk format: a first chunk with
    the assistant role, one per text piece, one with the finish reason, then ``data: [DONE]``;
    with ``stream_options.include_usage`` a usage chunk (``choices: []``) comes before ``[DONE]``.
    A failure after the 200 is sent as a ``data: {"error": ...}`` event and the stream ends
    without ``[DONE]`` (see `slimrag.api.errors`).

Finish reasons
    OpenAI's wire knows ``stop``, ``length``, ``content_filter`` and ``tool_calls``; slimrag's own
    reasons become one of them (`WIRE_FINISH`: ``loop``, the guard that stopped a repeating
    answer, is a ``stop``), so a strict client never meets an unknown value, and the ``slimrag``
    field keeps slimrag's reason. `answer_pieces` yields a `WireAnswer` for that: an `Answer`
    whose ``finish_reason`` is already the wire's, carrying slimrag's beside it, so every place
    that writes a completion or a chunk gets the mapping without knowing of it.

The ``slimrag`` extension field
    The completion, or the last chunk before ``[DONE]``, carries ``slimrag: {"text", "sources": [...],
    "mode", "verdict", "shown", "marked", "used", "evidence", "support", "ttft_s", "total_s",
    "finish_reason"}``: the model's text as written, the passages retrieved, by relevance, with at most `SNIPPET_CHARS` of their
    text; what the check decided and found, as every shell sends it (`slimrag.rag.wire.checked_json`:
    the verdict and the text to show, the text with a ``[label]`` after each supported sentence that
    cited nothing, the labels of the sources that back the answer, the evidence sentences with their
    offsets in their passage's full text, which a page highlights, and each answer sentence's
    support); the streamed ``content`` is the model's text as written; the end-to-end timings and
    slimrag's own finish reason. A completion that is not streamed and whose answer the check
    withheld (verdict ``not_backed``) has ``shown`` as its ``content``, the notice and the passages'
    sentences, cited: a client that reads only ``content`` never takes the unbacked text for the
    answer (streamed, the text is out before the verdict; the page shows ``shown`` after it).

Usage
    ``usage.prompt_tokens_details`` holds ``cached_tokens`` (OpenAI's), ``recomputed_tokens`` and
    ``reuse`` (`slimrag.api.schemas.usage_json`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass, fields
from typing import Any

from slimrag.api.errors import APIError, api_error
from slimrag.api.metrics import Metrics
from slimrag.api.schemas import ChatMessage, ChatRequest, usage_json
from slimrag.config import GenerationConfig
from slimrag.rag.stream import AnswerStream
from slimrag.rag.wire import checked_json, hit_json
from slimrag.serve.workers import Worker
from slimrag.types import Answer

#: Earlier chat messages kept as history (four turns, as `Chat` keeps).
HISTORY_MESSAGES = 8
#: Characters of passage text in a completion's sources (search hits carry the whole text).
SNIPPET_CHARS = 300
#: slimrag finish reasons OpenAI's wire does not have -> the one a client is told instead.
WIRE_FINISH = {"loop": "stop"}


@dataclass(frozen=True, slots=True)
class WireAnswer(Answer):
    """An answer as the OpenAI wire shows it: ``finish_reason`` mapped by `WIRE_FINISH`,
    ``slimrag_finish_reason`` what slimrag reported (the ``slimrag`` field's)."""

    slimrag_finish_reason: str = "stop"

    @classmethod
    def of(cls, answer: Answer) -> WireAnswer:
        """``answer`` with its finish reason mapped to the wire's."""
        values = {f.name: getattr(answer, f.name) for f in fields(Answer)}
        values["finish_reason"] = WIRE_FINISH.get(answer.finish_reason, answer.finish_reason)
        return cls(**values, slimrag_finish_reason=answer.finish_reason)


def conversation(messages: list[ChatMessage]) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The question (the last user message holding text; the schema requires one) and the history
    before it. Messages after the question (an assistant prefill, tool output) are not used."""
    at = max((i for i, m in enumerate(messages) if m.is_question()), default=None)
    if at is None:  # the schema's ``contains`` refuses this before the route runs
        raise APIError(400, "no user message holds text: the last user message is the question retrieval "
                            "and the answer are for", param="messages", code="invalid_value")
    history = tuple((m.role, m.text()) for m in messages[:at]
                    if m.role in ("user", "assistant") and m.text().strip())
    return messages[at].text(), history[-HISTORY_MESSAGES:]


def generation_config(req: ChatRequest, served: GenerationConfig) -> GenerationConfig:
    """The request's sampling settings over the served defaults."""
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    return GenerationConfig(
        max_new_tokens=req.max_completion_tokens or req.max_tokens or served.max_new_tokens,
        temperature=served.temperature if req.temperature is None else req.temperature,
        top_p=served.top_p if req.top_p is None else req.top_p,
        stop=tuple(s for s in stop if s) or served.stop,
        repetition_penalty=served.repetition_penalty,
    )


def extension(answer: Answer) -> dict[str, Any]:
    """The ``slimrag`` field (module header): the sources and the check's findings as every shell
    sends them (`slimrag.rag.wire`), the timings and slimrag's own finish reason."""
    u = answer.usage
    reason = answer.slimrag_finish_reason if isinstance(answer, WireAnswer) else answer.finish_reason
    return {"text": answer.text, "sources": [hit_json(h, SNIPPET_CHARS) for h in answer.sources], **checked_json(answer),
            "ttft_s": round(u.ttft_s, 4), "total_s": round(u.total_s, 4), "finish_reason": reason}


def answer_pieces(worker: Worker, question: str, history: tuple[tuple[str, str], ...], k: int,
                  source: str | None, config: GenerationConfig, evidence_only: bool = False,
                  answer: str | None = None) -> Iterator[str | WireAnswer]:
    """Run RAG on ``worker``: the answer's text pieces, then the answer as a `WireAnswer` (its
    finish reason the wire's). ``evidence_only``: answer with the evidence alone, without the
    model (`RAG.evidence_answer`), as one piece."""
    if evidence_only:
        answer = worker.rag.evidence_answer(question, k, source=source)
        yield answer.text
        yield WireAnswer.of(answer)
        return
    yield from wire_pieces(worker.rag.respond(question, k, source=source, config=config, history=history,
                                              answer=answer))


def wire_pieces(stream: AnswerStream) -> Iterator[str | WireAnswer]:
    """``stream``'s text pieces, then its answer as a `WireAnswer`: what a chat's worker puts on
    the queue to the response (`Workers.stream`), whose last item is the answer (`final_answer`).
    Closing this (the client left) closes ``stream``: the generation stops at once, not at GC."""
    try:
        yield from stream
        yield WireAnswer.of(stream.answer)
    finally:
        stream.close()


def final_answer(item: str | WireAnswer) -> WireAnswer:
    """The last item of a chat's pieces (`wire_pieces`), which is its answer."""
    if isinstance(item, str):
        raise RuntimeError("the chat's pieces ended without their answer")
    return item


def _sse(obj: dict[str, Any] | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, separators=(',', ':'))}\n\n"


async def sse_chunks(head: dict[str, Any], first: str | WireAnswer, rest: AsyncGenerator[str | WireAnswer, None],
                     include_usage: bool, metrics: Metrics) -> AsyncGenerator[str, None]:
    """The server-sent events of a streamed completion (see the module header)."""
    extra = {"usage": None} if include_usage else {}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**head, "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}], **extra}

    try:
        yield _sse(chunk({"role": "assistant", "content": ""}))
        item = first
        while isinstance(item, str):
            yield _sse(chunk({"content": item}))
            item = await anext(rest)
        metrics.usage(item.usage)
        last = chunk({}, item.finish_reason)
        if include_usage:
            yield _sse(last)
            last = {**head, "object": "chat.completion.chunk", "choices": [],
                    "usage": usage_json(item.usage)}
        yield _sse({**last, "slimrag": extension(item)})
        yield _sse("[DONE]")
    except Exception as exc:  # the 200 is out: report in the stream, as llama.cpp does
        err = api_error(exc)
        metrics.inc("slimrag_errors_total", endpoint="/v1/chat/completions", status=str(err.status))
        yield _sse(err.body())
    finally:
        await rest.aclose()
