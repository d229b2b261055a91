"""The HTTP server (``slimrag serve``): one index and its generator behind OpenAI-compatible routes.

Endpoints
    ``POST /v1/chat/completions``: RAG over the served index. The last message must be the user's
    question; it is what retrieval searches for. Earlier user and assistant messages become the
    chat history (the last `HISTORY_MESSAGES`). Client system messages are ignored: the served
    RAG's system prompt stays, so it remains the byte-identical prefix that KV caches reuse.
    ``max_tokens`` (or ``max_completion_tokens``), ``temperature``, ``top_p`` and ``stop`` become a
    `GenerationConfig`; unset ones keep the served RAG's (greedy, 256 tokens, unlike OpenAI's
    temperature 1). Extensions: ``k`` (passages, default 4) and ``source`` (a glob on source paths).
    ``stream: true`` answers with server-sent events in OpenAI's chunk format ending with
    ``data: [DONE]``, with a usage chunk (``choices: []``) before it when
    ``stream_options.include_usage`` is set; otherwise one ``chat.completion`` object. The
    passages used, in prompt order, are in the extension field ``slimrag: {"sources": [...]}`` of
    the completion, or of the last chunk before ``[DONE]``. ``model`` may be anything: the
    served model answers, under `create_app`'s ``model_name``.
    ``POST /v1/embeddings``: the index's embedder; ``input`` is a string or up to
    `MAX_EMBED_INPUTS` strings (truncated to the embedder's window, as sentence-transformers does);
    ``encoding_format`` ``float`` or ``base64`` (little-endian float32, as OpenAI sends it).
    ``POST /v1/search``: ``{query, k=5, source?, mode?}`` → hits with chunk id, source, score, text.
    ``GET /v1/models``, ``GET /healthz``, ``GET /metrics`` (Prometheus text format, by hand: five
    counters do not need a client library).

Threads
    An index's SQLite connection may only be used by the thread that opened it, so blocking work
    runs on `Workers`: ``workers`` threads (default 4), each with its own `Index` on the served
    folder, sharing the embedder, the generator and the shadow of a remote prefix cache.
    Generation vectors are memory-mapped, so a worker's index costs little; an index with
    uncompacted delta parts holds them in memory once per worker, so compact large ones before
    serving. The built-in generators are thread-safe (the local engine admits one prefill at a
    time through its scheduler and interleaves decode steps under its model lock), so their
    requests overlap; any other `Generator` runs one generation at a time.

Errors
    Every error is OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``: invalid
    JSON, wrong types, missing fields and out-of-range values are 400; a missing or wrong API key
    401; a body over ``max_body_bytes`` (default 1 MiB) 413; unknown routes 404. A failing remote
    backend is 502, a broken index or model 500, a prompt too long for the model 400. A stream
    waits for its first piece before it sends 200, so those failures keep their status; a failure
    after that is sent as a ``data: {"error": ...}`` event and the stream ends without ``[DONE]``
    (llama.cpp's convention, which `RemoteGenerator` reports as a `BackendError`).

Security
    ``slimrag serve`` binds 127.0.0.1 unless told otherwise. With an API key, every ``/v1/``
    route needs ``Authorization: Bearer KEY``; ``/healthz`` and ``/metrics`` stay open (as vLLM
    does). JSON bodies must say ``Content-Type: application/json``, so a web page cannot post to the
    local server without a CORS preflight, which is never granted.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import queue
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager, asynccontextmanager, nullcontext
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

import numpy as np
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from slimrag.config import GenerationConfig, SearchConfig
from slimrag.errors import BackendError, IndexFormatError, ModelNotFoundError, SlimragError
from slimrag.index.core import Index
from slimrag.llm.base import Delta, Generator
from slimrag.llm.remote import RemoteGenerator
from slimrag.rag.pipeline import RAG
from slimrag.rag.plan import PlanningCache
from slimrag.rag.prompt import Prompt
from slimrag.types import Answer, Hit, Usage

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Passages per request (chat ``k``, search ``k``) at most.
MAX_K = 100
#: Strings per embeddings request at most (OpenAI's limit).
MAX_EMBED_INPUTS = 2048
#: Earlier chat messages kept as history (four turns, as `Chat` keeps).
HISTORY_MESSAGES = 8
#: Characters of passage text in a completion's sources (search hits carry the whole text).
SNIPPET_CHARS = 300
ENDPOINTS = ("/v1/chat/completions", "/v1/embeddings", "/v1/search", "/v1/models", "/healthz", "/metrics")


# -- errors ------------------------------------------------------------------------------------


class APIError(Exception):
    """An error answered in OpenAI's shape; ``type`` follows the status (4xx: the request's fault)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        """The JSON error object."""
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


def api_error(exc: Exception) -> APIError:
    """The HTTP error for an exception raised while answering (unexpected ones are logged)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, BackendError):
        return APIError(502, f"the language model backend failed: {exc}", code="backend_error")
    if isinstance(exc, IndexFormatError | ModelNotFoundError):
        return APIError(500, f"the server is misconfigured: {exc}", code="server_misconfigured")
    if isinstance(exc, SlimragError):  # at request time: a prompt longer than the model's context
        return APIError(400, str(exc), code="invalid_request")
    log.error("unexpected error while answering", exc_info=exc)
    return APIError(500, f"internal error ({type(exc).__name__}: {exc}); see the server log",
                    code="internal_error")


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict"}


def _param(loc: Sequence[str | int]) -> str | None:
    """``messages[0].content`` from a pydantic error location (``body`` and union tags dropped)."""
    out = ""
    for part in loc[1:]:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier() and part.islower() and part not in _TYPE_TAGS:
            out += f".{part}" if out else part
    return out or None


def validation_error(exc: RequestValidationError) -> APIError:
    """A 400 naming the most specific invalid parameter, one error as OpenAI reports (FastAPI would
    answer 422 in its own shape)."""
    errors = list(exc.errors()) or [{"type": "missing", "loc": ("body",), "msg": "invalid body"}]
    if errors[0]["type"] == "json_invalid":
        why, at = errors[0].get("ctx", {}).get("error"), errors[0]["loc"][-1]
        return APIError(400, f"the request body is not valid JSON ({why} at character {at})",
                        code="invalid_json")
    # a union reports one error per member; the deepest location is the one that says what is wrong
    first = max(errors, key=lambda e: len(_param(e["loc"]) or ""))
    param = _param(first["loc"])
    if param is None and isinstance(first.get("input"), bytes):
        return APIError(400, "send the request body as a JSON object with 'Content-Type: application/json'",
                        code="invalid_body")
    if param is None:
        return APIError(400, f"the request body must be a JSON object ({first['msg']})", code="invalid_body")
    return APIError(400, f"invalid '{param}': {first['msg']}", param=param, code="invalid_value")


# -- metrics -----------------------------------------------------------------------------------


class Metrics:
    """Counters served at ``GET /metrics`` in Prometheus' text format (version 0.0.4). Thread-safe."""

    HELP = {
        "slimrag_requests_total": "HTTP requests answered, by endpoint and status code.",
        "slimrag_errors_total": "Errors answered, as a response or mid-stream, by endpoint and status.",
        "slimrag_prompt_tokens_total": "Prompt tokens of chat completions.",
        "slimrag_cached_tokens_total": "Prompt tokens of chat completions served from a KV or prefix cache.",
        "slimrag_completion_tokens_total": "Tokens generated by chat completions.",
    }

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, dict[tuple[tuple[str, str], ...], int]] = {name: {} for name in self.HELP}

    def inc(self, name: str, value: int = 1, **labels: str) -> None:
        """Add ``value`` to counter ``name`` with these labels."""
        key = tuple(sorted(labels.items()))
        with self._lock:
            series = self._values[name]
            series[key] = series.get(key, 0) + value

    def usage(self, usage: Usage) -> None:
        """Count the tokens of one completion."""
        self.inc("slimrag_prompt_tokens_total", usage.prompt_tokens)
        self.inc("slimrag_cached_tokens_total", usage.cached_tokens)
        self.inc("slimrag_completion_tokens_total", usage.completion_tokens)

    def render(self) -> str:
        """The exposition text: HELP, TYPE and one line per series (label-less counters start at 0)."""
        lines: list[str] = []
        with self._lock:
            for name, text in self.HELP.items():
                lines += [f"# HELP {name} {text}", f"# TYPE {name} counter"]
                for key, value in sorted(self._values[name].items() or [((), 0)]):
                    labels = ",".join(f'{k}="{v}"' for k, v in key)
                    lines.append(f"{name}{{{labels}}} {value}" if labels else f"{name} {value}")
        return "\n".join(lines) + "\n"


def endpoint_of(path: str) -> str:
    """The metrics label of a request path: the route, or ``other`` (so scans cannot add series)."""
    path = path.rstrip("/") or "/"
    return path if path in ENDPOINTS else "other"


# -- the gate in front of every route ----------------------------------------------------------


async def _send_json(send: Send, status: int, body: dict[str, Any],
                     headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    payload = json.dumps(body).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": payload})


class Gate:
    """ASGI middleware: counts every request for ``/metrics``, checks the API key on ``/v1/``
    routes, refuses a body over ``max_body_bytes`` with 413 (by its Content-Length, or while
    reading a chunked one), and answers any exception that escapes a route in the error shape."""

    def __init__(self, app: ASGIApp, *, api_key: str | None, max_body_bytes: int, metrics: Metrics) -> None:
        self.app, self.api_key, self.max_body_bytes, self.metrics = app, api_key, max_body_bytes, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 0

        async def counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self._guarded(scope, receive, counted)
        except Exception as exc:
            if status:  # the response has started: nothing else can be sent
                raise
            err = api_error(exc)
            await _send_json(counted, err.status, err.body())
        finally:
            endpoint = endpoint_of(scope["path"])
            # 499 (nginx's "client closed request"): the client left before any answer was sent
            self.metrics.inc("slimrag_requests_total", endpoint=endpoint, status=str(status or 499))
            if status >= 400:
                self.metrics.inc("slimrag_errors_total", endpoint=endpoint, status=str(status))

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.api_key is not None and scope["path"].startswith("/v1"):
            given = headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
                what = "wrong" if given else "missing"
                err = APIError(401, f"API key {what}: send 'Authorization: Bearer KEY' with the server's key",
                               code="invalid_api_key")
                await _send_json(send, 401, err.body(), [(b"www-authenticate", b"Bearer")])
                return
        if scope["method"] in ("POST", "PUT", "PATCH"):
            receive = await self._read_body(headers, receive, send)
            if receive is None:
                return
        await self.app(scope, receive, send)

    async def _read_body(self, headers: dict[str, str], receive: Receive, send: Send) -> Receive | None:
        """Read the whole body (at most ``max_body_bytes``) and return a ``receive`` replaying it;
        None when the request was refused or the client left."""
        too_large = APIError(413, f"the request body is larger than {self.max_body_bytes:,} bytes; send "
                                  "fewer or shorter texts", code="request_too_large")
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await _send_json(send, 413, too_large.body())
            return None
        parts, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            parts.append(message.get("body", b""))
            size += len(parts[-1])
            if size > self.max_body_bytes:
                await _send_json(send, 413, too_large.body())
                return None
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(parts), False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # later calls wait for the client's disconnect
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        return replay


# -- worker threads ----------------------------------------------------------------------------


class _FinishTap(Generator):
    """The served generator as one worker sees it: remembers the last finish reason (`Answer`
    carries none, OpenAI's ``finish_reason`` needs it) and holds ``exclusive`` while streaming."""

    def __init__(self, inner: Generator, exclusive: AbstractContextManager[Any]) -> None:
        self.inner, self.exclusive, self.name = inner, exclusive, inner.name
        self.finish_reason = "stop"

    def planning_cache(self) -> PlanningCache | None:
        return self.inner.planning_cache()

    def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
        self.finish_reason = "stop"
        with self.exclusive:
            for delta in self.inner.stream(prompt, config):
                self.finish_reason = delta.finish_reason or self.finish_reason
                yield delta


def thread_safe(llm: Generator) -> bool:
    """True for the built-in generators, which may serve several requests at once."""
    local = sys.modules.get("slimrag.llm.local")  # already imported when ``llm`` is a LocalGenerator
    return isinstance(llm, RemoteGenerator) or (local is not None and isinstance(llm, local.LocalGenerator))


@dataclass
class Worker:
    """What one worker thread owns: its `Index` and a `RAG` over it sharing the served generator."""

    index: Index
    rag: RAG
    tap: _FinishTap

    @classmethod
    def open(cls, served: RAG, exclusive: AbstractContextManager[Any]) -> Worker:
        """Open the served index again in this thread, with the served embedder and settings."""
        index = Index.open(served.index.root, embedder=served.index.embedder)
        tap = _FinishTap(served.llm, exclusive)
        rag = RAG(index, tap, system=served.system, generation=served.generation, mode=served.mode,
                  shadow=False)
        rag.shadow = served.shadow  # one mirror of the remote prefix cache for all workers
        return cls(index, rag, tap)


_Job = tuple[Callable[[Worker], Any], Future[Any]]


class Workers:
    """A fixed set of threads running blocking work, each on its own `Worker` (see the module
    header). Threads start on first use and stop with :meth:`stop`; each closes its index."""

    def __init__(self, served: RAG, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"workers must be >= 1, got {threads}")
        self.served, self.n = served, threads
        self.exclusive: AbstractContextManager[Any] = (nullcontext() if thread_safe(served.llm)
                                                       else threading.Lock())
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def submit(self, job: Callable[[Worker], T]) -> Future[T]:
        """Run ``job`` on a worker; its result or exception lands in the returned future."""
        with self._lock:
            if not self._threads:
                self._threads = [threading.Thread(target=self._loop, name=f"slimrag-worker-{i}", daemon=True)
                                 for i in range(self.n)]
                for t in self._threads:
                    t.start()
        fut: Future[T] = Future()
        self._jobs.put((job, fut))
        return fut

    async def run(self, job: Callable[[Worker], T]) -> T:
        """Await ``job`` run on a worker."""
        return await asyncio.wrap_future(self.submit(job))

    async def stream(self, job: Callable[[Worker], Iterator[T]]) -> AsyncIterator[T]:
        """Iterate ``job``'s items on a worker and yield them here; an exception it raises is
        raised here. Leaving early tells the worker to stop and close the iterator."""
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        stop = threading.Event()

        def run(worker: Worker) -> None:
            it = job(worker)
            try:
                for item in it:
                    if stop.is_set():
                        return
                    loop.call_soon_threadsafe(items.put_nowait, ("item", item))
            finally:
                close = getattr(it, "close", None)
                if close is not None:
                    close()

        def done(fut: Future[None]) -> None:
            if not fut.cancelled():
                exc = fut.exception()
                loop.call_soon_threadsafe(items.put_nowait, ("error", exc) if exc else ("end", None))

        fut = self.submit(run)
        fut.add_done_callback(done)
        try:
            while True:
                kind, value = await items.get()
                if kind == "error":
                    raise value
                if kind == "end":
                    return
                yield value
        finally:
            stop.set()
            fut.cancel()

    def stop(self, timeout: float = 10.0) -> None:
        """Let the threads finish their jobs and end (they close their indexes)."""
        with self._lock:
            threads, self._threads = self._threads, []
        for _ in threads:
            self._jobs.put(None)
        for t in threads:
            t.join(timeout)

    def _loop(self) -> None:
        worker: Worker | None = None
        try:
            while (item := self._jobs.get()) is not None:
                job, fut = item
                if not fut.set_running_or_notify_cancel():
                    continue
                try:
                    worker = worker or Worker.open(self.served, self.exclusive)
                    fut.set_result(job(worker))
                except Exception as exc:  # handed to the waiting request, which answers it
                    fut.set_exception(exc)
        finally:
            if worker is not None:
                worker.index.close()


def warm_up(rag: RAG) -> None:
    """Load the generator's model and the embedder now, so the first request does not wait."""
    load = getattr(rag.llm, "load", None)
    if callable(load):
        load()
    rag.index.embedder.embed_batch(["warm up"])


# -- request bodies ----------------------------------------------------------------------------


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


# -- chat completions --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Final:
    answer: Answer
    finish_reason: str


def conversation(messages: list[ChatMessage]) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The question (the last message, which must be the user's) and the history before it."""
    question = messages[-1].text()
    if messages[-1].role != "user" or not question.strip():
        raise APIError(400, "the last message must be a user message with text: it is the question "
                            "retrieval and the answer are for", param="messages", code="invalid_value")
    history = tuple((m.role, m.text()) for m in messages[:-1]
                    if m.role in ("user", "assistant") and m.text().strip())
    return question, history[-HISTORY_MESSAGES:]


def generation_config(req: ChatRequest, served: GenerationConfig) -> GenerationConfig:
    """The request's sampling settings over the served defaults."""
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    return GenerationConfig(
        max_new_tokens=req.max_completion_tokens or req.max_tokens or served.max_new_tokens,
        temperature=served.temperature if req.temperature is None else req.temperature,
        top_p=served.top_p if req.top_p is None else req.top_p,
        stop=tuple(s for s in stop if s) or served.stop,
    )


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


def extension(final: _Final) -> dict[str, Any]:
    """The ``slimrag`` field: sources in prompt order and end-to-end timings."""
    u = final.answer.usage
    return {"sources": [hit_json(h, SNIPPET_CHARS) for h in final.answer.sources],
            "ttft_s": round(u.ttft_s, 4), "total_s": round(u.total_s, 4)}


def _sse(obj: dict[str, Any] | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, separators=(',', ':'))}\n\n"


async def _chunks(head: dict[str, Any], first: str | _Final, rest: AsyncIterator[str | _Final],
                  include_usage: bool, metrics: Metrics) -> AsyncIterator[str]:
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
        metrics.usage(item.answer.usage)
        last = chunk({}, item.finish_reason)
        if include_usage:
            yield _sse(last)
            last = {**head, "object": "chat.completion.chunk", "choices": [],
                    "usage": usage_json(item.answer.usage)}
        yield _sse({**last, "slimrag": extension(item)})
        yield _sse("[DONE]")
    except Exception as exc:  # the 200 is out: report in the stream, as llama.cpp does
        err = api_error(exc)
        metrics.inc("slimrag_errors_total", endpoint="/v1/chat/completions", status=str(err.status))
        yield _sse(err.body())
    finally:
        await rest.aclose()


def _answer(worker: Worker, question: str, history: tuple[tuple[str, str], ...], k: int, source: str | None,
            config: GenerationConfig) -> Iterator[str | _Final]:
    for piece in worker.rag.stream_answer(question, k, source=source, config=config, history=history):
        yield piece if isinstance(piece, str) else _Final(piece, worker.tap.finish_reason)


# -- the app -----------------------------------------------------------------------------------


def create_app(rag: RAG, *, api_key: str | None = None, model_name: str = "slimrag", workers: int = 4,
               max_body_bytes: int = 1 << 20) -> FastAPI:
    """The server for ``rag``'s index folder, generator and settings (see the module header).

    api_key: required as a bearer token on ``/v1/`` routes when set. model_name: the id listed at
    ``/v1/models`` and named in completions. workers: threads doing blocking work, each with its
    own index. max_body_bytes: larger request bodies get 413.
    """
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
    pool = Workers(rag, workers)
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(warm_up, rag)
        yield
        await asyncio.to_thread(pool.stop)

    app = FastAPI(title="slimrag", summary="RAG over one index, OpenAI-compatible", lifespan=lifespan)
    app.add_middleware(Gate, api_key=api_key or None, max_body_bytes=max_body_bytes, metrics=metrics)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        err = validation_error(exc)
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = (f"no route {request.method} {request.url.path}; see GET /docs" if exc.status_code == 404
                   else str(exc.detail))
        err = APIError(exc.status_code, message, code=str(exc.status_code))
        return JSONResponse(err.body(), status_code=err.status, headers=exc.headers)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest) -> Response:
        if req.n != 1:
            raise APIError(400, "only n=1 is supported: ask again for another answer", param="n",
                           code="invalid_value")
        question, history = conversation(req.messages)
        config = generation_config(req, rag.generation)
        events = pool.stream(lambda w: _answer(w, question, history, req.k, req.source, config))
        first = await anext(events)  # retrieval, prompt and backend errors still get their status
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model_name}
        if req.stream:
            include_usage = req.stream_options is not None and req.stream_options.include_usage
            return StreamingResponse(_chunks(head, first, events, include_usage, metrics),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        final = first
        async for item in events:
            final = item
        assert isinstance(final, _Final)
        metrics.usage(final.answer.usage)
        message = {"role": "assistant", "content": final.answer.text}
        return JSONResponse({**head, "object": "chat.completion",
                             "choices": [{"index": 0, "message": message, "logprobs": None,
                                          "finish_reason": final.finish_reason}],
                             "usage": usage_json(final.answer.usage), "slimrag": extension(final)})

    @app.post("/v1/embeddings")
    async def embeddings(req: EmbeddingsRequest) -> dict[str, Any]:
        texts = [req.input] if isinstance(req.input, str) else req.input
        if not texts or not all(t.strip() for t in texts):
            raise APIError(400, "'input' must be a non-empty string or a non-empty list of non-empty strings",
                           param="input", code="invalid_value")
        if len(texts) > MAX_EMBED_INPUTS:
            raise APIError(400, f"'input' has {len(texts)} strings; send at most {MAX_EMBED_INPUTS} per "
                                "request", param="input", code="invalid_value")
        embedder = rag.index.embedder
        if req.dimensions is not None and req.dimensions != embedder.dim:
            raise APIError(400, f"{embedder.model_id} gives {embedder.dim} dimensions, not {req.dimensions}",
                           param="dimensions", code="invalid_value")

        def embed(w: Worker) -> tuple[np.ndarray, int]:
            vecs = w.index.embedder.embed(texts, batch_size=w.index.config.embed_batch, progress=False)
            return vecs, sum(w.index.chunker.count(t) for t in texts)

        vectors, tokens = await pool.run(embed)
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode()
                 if req.encoding_format == "base64" else v.tolist()} for i, v in enumerate(vectors)]
        return {"object": "list", "data": data, "model": embedder.model_id,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    @app.post("/v1/search")
    async def search(req: SearchRequest) -> dict[str, Any]:
        if not req.query.strip():
            raise APIError(400, "'query' must be non-empty text", param="query", code="invalid_value")
        hits = await pool.run(lambda w: w.index.search(req.query, k=req.k, mode=req.mode or rag.mode,
                                                       source=req.source))
        return {"object": "list", "data": [hit_json(h) for h in hits]}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        created = int(time.time())
        ids = [model_name, rag.index.embedder.model_id]
        data = [{"id": i, "object": "model", "created": created, "owned_by": "slimrag"} for i in ids]
        return {"object": "list", "data": data}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "model": model_name}

    @app.get("/metrics")
    async def metrics_text() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
