"""`RemoteGenerator`: generation through any OpenAI-compatible ``/v1/chat/completions`` endpoint.

Tested against the protocol as vLLM, SGLang, llama.cpp's ``llama-server`` and Ollama speak it.
The HTTP layer (URL rule, API key, error translation) is `OpenAIClient` in
:mod:`slimrag.openai_http`, shared with `RemoteEmbedder`.

Request (streaming, always)
    ``POST {root}/chat/completions`` with ``model``, ``messages`` (from `Prompt.messages`, so the
    bytes are the deterministic rendering that lets the server's prefix cache hit),
    ``temperature``, ``top_p``, ``max_tokens``, ``stop`` (omitted when empty; some servers reject
    an empty list), ``repetition_penalty`` (only when not 1: an extension that vLLM, SGLang and
    llama.cpp accept), ``stream: true`` and ``stream_options: {"include_usage": true}``.

Response: server-sent events
    Lines ``data: {json}``, ended by ``data: [DONE]``. Blank lines, ``:`` comments and ``event:``/
    ``id:`` fields are skipped. Each chunk's ``choices[0].delta.content`` (absent, null or empty
    in role-only chunks) becomes one `Delta`; ``choices[0].finish_reason`` is remembered.
    Thinking text (``delta.reasoning_content`` from llama.cpp and vLLM, ``delta.reasoning`` from
    Ollama) is not part of the answer and is dropped; the first token is the first answer text.
    The usage chunk has ``choices: []`` and ``usage`` set. A server that ignores
    ``stream_options`` sends no usage at all: the final `Usage` then has zero token counts and
    only the timings. A failure after the stream began raises `BackendError` with the server's
    message, in either form llama.cpp uses: a chunk ``data: {"error": ...}``, or an SSE
    ``error: {...}`` field followed by ``data: [DONE]`` (older ``llama-server`` builds: reading
    only ``data:`` lines took that for a short, successful answer). A server that answers
    ``stream: true`` with one plain JSON completion (``Content-Type: application/json``) is
    accepted too: its text becomes a single delta. A stream that ends with neither ``[DONE]``
    nor a finish reason was cut off and raises.

Usage and cached tokens, by server (``tests/test_backend_shapes.py`` checks each against a local
server speaking that shape; the field names are cited from each project's source in
``tests/openai_server.py``)
    vLLM and SGLang: ``usage.prompt_tokens_details.cached_tokens`` (prefix-cache hits).
    llama.cpp ``llama-server``: the same field (the slot's reused prefix), and a ``timings``
    object on the last chunk: ``cache_n`` (cached prompt tokens), ``prompt_n`` (prompt tokens
    evaluated), ``predicted_n`` (generated). Builds without ``include_usage`` support, or without
    ``prompt_tokens_details``, send only ``timings``: the counts are then read from it
    (``prompt_tokens = prompt_n + cache_n``, ``cached_tokens = cache_n``,
    ``completion_tokens = predicted_n``); ``usage`` wins where both say something.
    Ollama: ``usage`` with ``prompt_tokens`` and ``completion_tokens`` only, and only when
    ``stream_options.include_usage`` is set (it is, always); it reports no cached tokens, so
    ``cached_tokens`` is 0 although its runner may reuse a prefix.

Timings
    ``ttft_s`` runs from just before the request is sent to the first non-empty content piece
    (it includes connection set-up and queueing on the server, which is what a user waits for);
    ``total_s`` to the end of the stream. With an empty reply ``ttft_s`` equals ``total_s``.

Errors
    Refused connections, timeouts, HTTP status >= 400 (with the server's own error message, in
    any of the shapes OpenAI, vLLM, llama.cpp and Ollama use) and malformed JSON all raise
    `BackendError` saying what to do next. Leaving a stream early closes the response.

Thread safety: one generator may be used from several threads (httpx.Client is thread-safe and
the model id is resolved under a lock).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from slimrag.config import GenerationConfig
from slimrag.errors import BackendError
from slimrag.llm.base import Delta, Generator
from slimrag.openai_http import HINT_5XX, OpenAIClient, api_root, server_message
from slimrag.prompt import Prompt
from slimrag.types import Usage

__all__ = ["OpenAIClient", "RemoteGenerator", "api_root"]


class RemoteGenerator(Generator):
    """A `Generator` backed by an OpenAI-compatible chat completions server.

    base_url: the API root (``/v1`` is appended when missing). model: the served model id; when
    None, the first id of ``GET /v1/models`` is used (asked once, on first use). api_key: sent as
    a bearer token. timeout: seconds allowed for connecting and between two reads of the stream
    (not for the whole generation). Close with :meth:`close` or use as a context manager.

    Repetition penalty: none by default (it is not part of OpenAI's API, and larger models do not
    need it). The server's prefix cache is invisible from here, so the pipeline shadows it.
    """

    thread_safe = True
    default_repetition_penalty = 1.0
    shadows_prefix_cache = True

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None,
                 timeout: float = 120.0) -> None:
        self._client = OpenAIClient(base_url, api_key=api_key, timeout=timeout)
        self._model = model
        self._lock = threading.Lock()
        self.name = f"remote:{model or 'auto'}@{self._client.root}"

    @property
    def base_url(self) -> str:
        """The normalized API root requests go to."""
        return self._client.root

    def resolve_model(self) -> str:
        """The model id requests name: the one given, or the server's first listed model."""
        with self._lock:
            if self._model is None:
                models = self._client.list_models()
                if not models:
                    raise BackendError(f"{self._client.url('models')} lists no models; load a model "
                                       "on the server or pass model=")
                self._model = models[0]
                self.name = f"remote:{self._model}@{self._client.root}"
            return self._model

    def request_body(self, prompt: Prompt, config: GenerationConfig) -> dict[str, Any]:
        """The JSON body of a streaming chat completion request for ``prompt``."""
        body: dict[str, Any] = {
            "model": self.resolve_model(),
            "messages": prompt.messages(),
            "temperature": config.temperature,
            "top_p": config.top_p,
            "max_tokens": config.max_new_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if config.stop:
            body["stop"] = list(config.stop)
        if config.repetition_penalty != 1.0:  # not OpenAI's; vLLM, SGLang and llama.cpp accept it
            body["repetition_penalty"] = config.repetition_penalty
        return body

    def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
        """Yield content pieces as the server streams them; the last delta carries `Usage` and the
        finish reason (see the module header for what each server reports)."""
        body = self.request_body(prompt, config or GenerationConfig())
        url = self._client.url("chat/completions")
        start = time.perf_counter()
        ttft: float | None = None
        reason: str | None = None
        usage: dict[str, Any] | None = None
        timings: dict[str, Any] | None = None
        with self._client.post_stream("chat/completions", body) as response:
            if response.headers.get("content-type", "").startswith("application/json"):
                events: Iterator[dict[str, Any]] = iter([_as_chunk(_parse_json(response.read(), url))])
            else:
                events = _sse_events(response.iter_lines(), url)
            done = False
            for event in events:
                if event is _DONE:
                    done = True
                    break
                if isinstance(event.get("usage"), dict):
                    usage = event["usage"]  # the last one wins: some servers send running totals
                if isinstance(event.get("timings"), dict):
                    timings = event["timings"]  # llama-server's, on its last chunk
                text, finish = _chunk_content(event, url)
                reason = finish or reason
                if text:
                    if ttft is None:
                        ttft = time.perf_counter() - start
                    yield Delta(text)
            if not done and reason is None:
                raise BackendError(f"the stream from {url} ended before its last chunk; the server "
                                   "may have crashed or dropped the connection: check its log and retry")
        total = time.perf_counter() - start
        yield Delta("", usage=_usage(usage, timings, ttft if ttft is not None else total, total, url),
                    finish_reason=reason or "stop")

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()

    def __enter__(self) -> RemoteGenerator:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


#: Sentinel event for ``data: [DONE]``.
_DONE: dict[str, Any] = {}


def _parse_json(raw: str | bytes, url: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        shown = raw[:200] if isinstance(raw, str) else raw[:200].decode("utf-8", "replace")
        raise BackendError(f"{url} sent malformed JSON ({shown!r}); the server is not speaking the "
                           "OpenAI protocol: check base_url and the server version") from exc


def _sse_events(lines: Iterator[str], url: str) -> Iterator[dict[str, Any]]:
    """Decode server-sent events into chunk dicts, `_DONE` for the terminator. An ``error:``
    field (llama-server's mid-stream failure) becomes an ``{"error": ...}`` chunk."""
    for line in lines:
        if line.startswith("error:"):
            raw = line[6:].strip()
            try:
                detail: Any = json.loads(raw)
            except ValueError:
                detail = raw or "(no message)"
            yield {"error": detail}
            continue
        if not line.startswith("data:"):
            continue  # blank separators, ':' keep-alive comments, event:/id:/retry: fields
        data = line[5:].strip()
        if data == "[DONE]":
            yield _DONE
            return
        if data:
            yield _as_chunk(_parse_json(data, url))


def _as_chunk(obj: Any) -> dict[str, Any]:
    """Check the top-level shape of one decoded chunk (or of a whole non-streamed completion)."""
    if not isinstance(obj, dict):
        raise BackendError(f"expected a JSON object per stream chunk, got {type(obj).__name__}; "
                           "check that the server speaks the OpenAI chat completions protocol")
    return obj


def _chunk_content(chunk: dict[str, Any], url: str) -> tuple[str, str | None]:
    """The content text and finish reason of one chunk (a whole completion is accepted too)."""
    if "error" in chunk:
        raise BackendError(f"{url} reported an error mid-stream: {server_message(json.dumps(chunk))} "
                           f"({HINT_5XX})")
    choices = chunk.get("choices") or []
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return "", None  # the usage chunk, or a keep-alive
    choice = choices[0]
    part = choice.get("delta") or choice.get("message") or {}
    text = part.get("content") if isinstance(part, dict) else None
    if text is not None and not isinstance(text, str):
        raise BackendError(f"{url} sent content of type {type(text).__name__}, expected a string")
    finish = choice.get("finish_reason")
    return text or "", finish if isinstance(finish, str) else None


def _from_timings(timings: dict[str, Any]) -> dict[str, Any]:
    """llama-server's ``timings`` as the ``usage`` fields it implies (see the module header)."""
    out: dict[str, Any] = {}
    cache_n, prompt_n, predicted_n = (timings.get(k) for k in ("cache_n", "prompt_n", "predicted_n"))
    if prompt_n is not None:
        out["prompt_tokens"] = int(prompt_n) + int(cache_n or 0)
    if predicted_n is not None:
        out["completion_tokens"] = int(predicted_n)
    if cache_n is not None:
        out["cached_tokens"] = int(cache_n)
    return out


def _usage(raw: dict[str, Any] | None, timings: dict[str, Any] | None, ttft: float, total: float,
           url: str) -> Usage:
    """Build `Usage` from the server's ``usage`` object and llama-server's ``timings`` (each None
    when not sent); a count ``usage`` gives wins over the one ``timings`` implies."""
    try:
        counts = _from_timings(timings) if timings is not None else {}
        if raw is not None:
            details = raw.get("prompt_tokens_details")
            for key in ("prompt_tokens", "completion_tokens"):
                if raw.get(key) is not None:
                    counts[key] = int(raw[key])
            if isinstance(details, dict) and details.get("cached_tokens") is not None:
                counts["cached_tokens"] = int(details["cached_tokens"])
    except (TypeError, ValueError) as exc:
        raise BackendError(f"{url} sent usage or timings with non-integer counts: {raw!r} {timings!r}") from exc
    return Usage(prompt_tokens=counts.get("prompt_tokens", 0), completion_tokens=counts.get("completion_tokens", 0),
                 cached_tokens=counts.get("cached_tokens", 0), ttft_s=ttft, total_s=total)
