"""A real, small OpenAI-compatible HTTP server for tests (stdlib only).

It binds 127.0.0.1 on a free port, serves from a background thread and stops when its ``with``
block ends::

    with OpenAIServer() as srv:
        RemoteGenerator(srv.base_url)          # srv.base_url == "http://127.0.0.1:PORT/v1"
        srv.requests                           # what it received, as dicts

Endpoints and their deterministic behaviour
    ``GET /v1/models``: ``{"object": "list", "data": [{"id": ...}]}`` for ``models``.
    ``POST /v1/embeddings``: each input is hashed by character trigrams (lower-cased, padded with
    a space) into ``dim`` signed buckets (CRC-32), then L2-normalized, so texts that share words
    get similar vectors. The ``data`` list is sent in *reverse* order with correct ``index``
    fields (``reverse_embeddings``) so clients must sort by ``index`` as the protocol requires.
    ``POST /v1/chat/completions``: the reply is ``"echo: "`` followed by the words of the last
    non-empty line of the last user message (at most 16 words; for a slimrag `Prompt` that line is
    ``"Question: ..."``), cut to ``max_tokens`` words (finish reason ``"length"``) and at the first
    ``stop`` string (``"stop"``). See :meth:`OpenAIServer.reply`. Tokens are whitespace tokens:
    ``prompt_tokens`` counts those of all message contents joined by newlines. With
    ``stream: true`` the answer is server-sent events over chunked transfer encoding: a role-only
    chunk with empty content, one chunk per word, a chunk with the finish reason, then (when the
    request has ``stream_options.include_usage`` and ``stream_usage`` is true) a usage chunk with
    ``choices: []``, then ``data: [DONE]`` (the vLLM/OpenAI sequence).

Prefix cache emulation
    ``usage.prompt_tokens_details.cached_tokens`` is the length, in whitespace tokens, of the
    longest common token prefix between this request's joined prompt text and any earlier chat
    request's (the last 1,024 are remembered; :meth:`OpenAIServer.reset_cache` forgets them). That
    is what vLLM's or SGLang's prefix cache would reuse, at token rather than block granularity,
    so tests can check that slimrag's deterministic rendering and passage order make caches hit.

Failure injection (attributes; change them at any time, they are read per request)
    ``api_key``: when set, requests without ``Authorization: Bearer KEY`` get 401.
    ``fail_status``: when set, every request gets that status with an OpenAI-style error body
    whose message is ``fail_message``. ``malformed``: answers are broken JSON (the stream sends
    one good piece first). ``chunk_delay_s``: sleep between stream chunks, for timing tests.
    ``stream_usage``: False emulates servers that ignore ``stream_options`` (no usage chunk).
    ``stream_fault``: ``"error"`` sends an ``{"error": ...}`` chunk after the first piece (as
    llama.cpp reports failures mid-stream), ``"cut"`` ends the stream after the first piece with
    neither finish reason nor ``[DONE]`` (a crashed server), ``"json"`` answers ``stream: true``
    with one plain JSON completion (a server without streaming).
    ``healthy``: False answers ``GET /healthz`` with 503 (it answers 200 otherwise, whatever the
    other knobs say, as a server whose model fails still serves its health route).
    Unknown models get 404 as vLLM answers; unparsable request bodies get 400.

Server shapes (``shape``): what real servers put around the same protocol
    ``"openai"`` (the default) is OpenAI's and vLLM's sequence above. ``"ollama"`` and
    ``"llamacpp"`` reproduce Ollama's and llama.cpp's ``llama-server``'s OpenAI-compatible
    endpoints, field for field as their sources write them (cited in `OllamaShape` and
    `LlamaCppShape`): chunk deltas, where usage goes and what it holds (Ollama: counts only, no
    cached tokens; llama-server: ``prompt_tokens_details.cached_tokens`` and a ``timings`` object),
    thinking text in a separate delta field (``reasoning`` / ``reasoning_content``, sent before
    the answer when ``reasoning`` is set), error bodies, unknown models, and llama-server's
    mid-stream ``error:`` event. ``timings``: False leaves llama-server's ``timings`` out;
    ``usage_details``: False leaves ``prompt_tokens_details`` out of ``usage`` (llama-server
    builds before it had one, and servers that report no cache).

Every request is recorded (also rejected ones) as ``{"method", "path", "headers", "body"}`` with
lower-cased header names and the decoded JSON body (None for GET or bad JSON).
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

#: Longest reply, in words, before ``max_tokens`` is applied.
REPLY_WORDS = 16
#: How many earlier prompts the prefix cache emulation remembers.
CACHE_ENTRIES = 1024
#: Values of ``stream_fault`` (see the module header).
STREAM_FAULTS = (None, "error", "cut", "json")
#: Words of thinking text a ``reasoning`` server sends before its answer.
REASONING = "Let me look at the passages first."


class OpenAIServer:
    """The test server (see the module header for the protocol it speaks and its knobs)."""

    def __init__(self, *, models: Iterable[str] = ("test-model",), dim: int = 32,
                 api_key: str | None = None, fail_status: int | None = None,
                 fail_message: str = "injected failure", malformed: bool = False,
                 stream_usage: bool = True, reverse_embeddings: bool = True,
                 chunk_delay_s: float = 0.0, stream_fault: str | None = None, shape: str = "openai",
                 reasoning: bool = False, timings: bool = True, usage_details: bool = True) -> None:
        if stream_fault not in STREAM_FAULTS:
            raise ValueError(f"stream_fault must be one of {STREAM_FAULTS}, got {stream_fault!r}")
        if shape not in SHAPES:
            raise ValueError(f"shape must be one of {tuple(SHAPES)}, got {shape!r}")
        self.shape = shape
        self.reasoning = reasoning
        self.timings = timings
        self.usage_details = usage_details
        self.models = list(models)
        self.dim = dim
        self.api_key = api_key
        self.fail_status = fail_status
        self.fail_message = fail_message
        self.malformed = malformed
        self.stream_usage = stream_usage
        self.reverse_embeddings = reverse_embeddings
        self.chunk_delay_s = chunk_delay_s
        self.stream_fault = stream_fault
        self.healthy = True
        #: Connections the client dropped: streams left early, keep-alive sockets reset.
        self.disconnects = 0
        self._lock = threading.Lock()
        self._requests: list[dict[str, Any]] = []
        self._prompts: list[list[str]] = []
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> OpenAIServer:
        """Bind 127.0.0.1 on a free port and serve from a daemon thread."""
        if self._httpd is not None:
            raise RuntimeError("server already started")
        self._httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="openai-test-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket; the port refuses connections afterwards."""
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The bound port (only while started)."""
        if self._httpd is None:
            raise RuntimeError("server not started")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """The API root, ``http://127.0.0.1:PORT/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    # -- records ---------------------------------------------------------------------------------

    @property
    def requests(self) -> list[dict[str, Any]]:
        """A copy of every request received so far, oldest first."""
        with self._lock:
            return list(self._requests)

    def requests_to(self, path: str) -> list[dict[str, Any]]:
        """The recorded requests whose path ends with ``path`` (e.g. ``"chat/completions"``)."""
        return [r for r in self.requests if r["path"].endswith(path)]

    def reset_cache(self) -> None:
        """Forget earlier prompts, as a server restart would."""
        with self._lock:
            self._prompts.clear()

    # -- deterministic model ---------------------------------------------------------------------

    @staticmethod
    def embed_text(text: str, dim: int = 32) -> list[float]:
        """The server's embedding of ``text``: signed trigram hashing, L2-normalized."""
        vec = [0.0] * dim
        padded = f" {text.lower()} "
        for i in range(len(padded) - 2):
            h = zlib.crc32(padded[i : i + 3].encode("utf-8"))
            vec[h % dim] += 1.0 if (h >> 16) & 1 else -1.0
        norm = sum(v * v for v in vec) ** 0.5
        return [v / norm for v in vec] if norm > 0 else vec

    @staticmethod
    def prompt_text(messages: list[dict[str, Any]]) -> str:
        """All message contents joined by newlines: what token counts and the cache look at."""
        return "\n".join(_content_text(m.get("content")) for m in messages)

    @staticmethod
    def reply(messages: list[dict[str, Any]], max_tokens: int | None = None,
              stop: Iterable[str] = ()) -> tuple[str, str]:
        """The reply text and finish reason the server gives for these messages."""
        users = [_content_text(m.get("content")) for m in messages if m.get("role") == "user"]
        lines = [ln for ln in (users[-1] if users else "").splitlines() if ln.strip()]
        words = ["echo:"] + (lines[-1].split()[:REPLY_WORDS] if lines else [])
        reason = "stop"
        if max_tokens is not None and len(words) > max_tokens:
            words, reason = words[:max_tokens], "length"
        text = " ".join(words)
        cuts = [text.find(s) for s in stop if s and s in text]
        if cuts:
            text, reason = text[: min(cuts)], "stop"
        return text, reason

    def _usage(self, messages: list[dict[str, Any]], completion: str) -> Counts:
        """Token counts with the prefix cache emulation; records this prompt for later requests."""
        tokens = self.prompt_text(messages).split()
        with self._lock:
            cached = max((_common_prefix(tokens, p) for p in self._prompts), default=0)
            self._prompts.append(tokens)
            del self._prompts[:-CACHE_ENTRIES]
        return Counts(len(tokens), len(completion.split()), cached)

    def _record(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self._requests.append(entry)


class _HTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that knows its `OpenAIServer` (daemon threads: never blocks exit)."""

    daemon_threads = True
    owner: OpenAIServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that closes a keep-alive connection is normal (counted, not printed); any
        other handler failure is printed by the default handler so a test log shows it."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            with self.owner._lock:
                self.owner.disconnects += 1
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    """One connection. HTTP/1.1 keep-alive; idle sockets time out so threads end on their own."""

    protocol_version = "HTTP/1.1"
    timeout = 10
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the per-request stderr log; requests are recorded in ``srv.requests``."""
        return

    # -- dispatch --------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch(None)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw)
        except ValueError:
            self._record(None)
            self._error(400, f"request body is not JSON: {raw[:100]!r}", "invalid_request_error")
            return
        self._dispatch(body)

    def _record(self, body: Any) -> None:
        self.server.owner._record({
            "method": self.command,
            "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body": body,
        })

    def _dispatch(self, body: Any) -> None:
        srv = self.server.owner
        if self.command == "GET" and self.path == "/healthz":  # a router's health check: not recorded
            self._json(200 if srv.healthy else 503, {"status": "ok" if srv.healthy else "unavailable"})
            return
        self._record(body)
        if srv.api_key is not None and self.headers.get("Authorization") != f"Bearer {srv.api_key}":
            self._error(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
            return
        if srv.fail_status is not None:
            self._error(srv.fail_status, srv.fail_message, "server_error")
            return
        shape = SHAPES[srv.shape]
        routes = {
            ("GET", "/v1/models"): self._models,
            ("POST", "/v1/embeddings"): self._embeddings,
            ("POST", "/v1/chat/completions"): self._chat,
        }
        handler = routes.get((self.command, self.path.split("?")[0].rstrip("/")))
        if handler is None:
            self._error(404, f"no route {self.command} {self.path}", "invalid_request_error")
            return
        if body is not None and not isinstance(body, dict):
            self._error(400, "request body must be a JSON object", "invalid_request_error")
            return
        if body is not None and body.get("model") not in srv.models:
            refusal = shape.unknown_model(str(body.get("model")))
            if refusal is not None:
                self._error(404, refusal, "NotFoundError")
                return
        handler(body or {})

    # -- endpoints -------------------------------------------------------------------------------

    def _models(self, body: dict[str, Any]) -> None:
        now = int(time.time())
        data = [SHAPES[self.server.owner.shape].model_entry(m, now) for m in self.server.owner.models]
        self._json(200, {"object": "list", "data": data})

    def _embeddings(self, body: dict[str, Any]) -> None:
        srv = self.server.owner
        inputs = body.get("input")
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not all(isinstance(t, str) for t in inputs):
            self._error(400, "input must be a string or a list of strings", "invalid_request_error")
            return
        if srv.malformed:
            self._raw(200, b'{"data": [not json', "application/json")
            return
        data = [{"object": "embedding", "index": i, "embedding": srv.embed_text(t, srv.dim)}
                for i, t in enumerate(inputs)]
        if srv.reverse_embeddings:
            data.reverse()
        tokens = sum(len(t.split()) for t in inputs)
        self._json(200, {"object": "list", "data": data, "model": body["model"],
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    def _chat(self, body: dict[str, Any]) -> None:
        srv = self.server.owner
        shape = SHAPES[srv.shape]
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            self._error(400, "messages must be a non-empty list of objects", "invalid_request_error")
            return
        stop = body.get("stop") or []
        text, reason = srv.reply(messages, body.get("max_tokens"), [stop] if isinstance(stop, str) else stop)
        turn = Turn(head={"id": f"chatcmpl-{len(srv.requests)}", "created": int(time.time()), "model": body["model"]},
                    text=text, reason=reason, counts=srv._usage(messages, text),
                    thinking=REASONING if srv.reasoning else "", timings=srv.timings,
                    details=srv.usage_details)
        if not body.get("stream") or srv.stream_fault == "json":
            if srv.malformed:
                self._raw(200, b'{"choices": [', "application/json")
                return
            self._json(200, shape.completion(turn))
            return
        include_usage = bool((body.get("stream_options") or {}).get("include_usage")) and srv.stream_usage
        lines = [f"data: {json.dumps(e)}\n\n".encode() for e in shape.chunks(turn, include_usage)]
        lines.append(b"data: [DONE]\n\n")
        if srv.malformed:
            lines = lines[:2] + [b"data: {not json\n\n"]
        elif srv.stream_fault == "error":
            lines = lines[:2] + shape.stream_error(srv.fail_message)
        elif srv.stream_fault == "cut":
            lines = lines[:2]
        self._stream(lines)

    # -- writing ---------------------------------------------------------------------------------

    def _json(self, status: int, obj: Any) -> None:
        self._raw(status, json.dumps(obj).encode(), "application/json")

    def _error(self, status: int, message: str, kind: str, code: str | None = None) -> None:
        self._json(status, SHAPES[self.server.owner.shape].error_body(status, message, kind, code))

    def _raw(self, status: int, payload: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _stream(self, lines: list[bytes]) -> None:
        """Send SSE lines with chunked transfer encoding, as vLLM does; count early disconnects."""
        srv = self.server.owner
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for line in lines:
                if srv.chunk_delay_s:
                    time.sleep(srv.chunk_delay_s)
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            with srv._lock:
                srv.disconnects += 1
            self.close_connection = True


def _content_text(content: Any) -> str:
    """Message content as text: a string, or the text parts of an OpenAI content-part list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _common_prefix(a: list[str], b: list[str]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


# -- server shapes ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Counts:
    """Whitespace-token counts of one chat request: prompt, completion, and prompt tokens the
    prefix cache emulation found cached."""

    prompt: int
    completion: int
    cached: int


@dataclass(frozen=True)
class Turn:
    """One chat answer before a shape dresses it: the shared chunk head (id, created, model), the
    text, finish reason, counts, and the thinking text sent first (empty for none)."""

    head: dict[str, Any]
    text: str
    reason: str
    counts: Counts
    thinking: str = ""
    timings: bool = True
    details: bool = True

    @property
    def pieces(self) -> list[str]:
        """The answer as streamed: one piece per word, trailing space kept."""
        return re.findall(r"\S+\s*", self.text)

    @property
    def thoughts(self) -> list[str]:
        return re.findall(r"\S+\s*", self.thinking)


class Shape:
    """How one server family writes the OpenAI protocol. The base is OpenAI's own (and vLLM's):
    a role-only first chunk with empty content, one chunk per piece, a finish chunk with an empty
    delta, ``"usage": null`` on every chunk when usage was asked for, then a usage chunk with
    ``choices: []``; errors as ``{"error": {"message", "type", "param", "code"}}``."""

    fingerprint: str | None = None

    def head(self, turn: Turn, kind: str) -> dict[str, Any]:
        head = {**turn.head, "object": kind}
        if self.fingerprint is not None:
            head["system_fingerprint"] = self.fingerprint
        return head

    def model_entry(self, model: str, created: int) -> dict[str, Any]:
        return {"id": model, "object": "model", "created": created, "owned_by": "slimrag-tests"}

    def unknown_model(self, model: str) -> str | None:
        """The 404 message for a model the server does not serve, or None when it answers anyway."""
        return f"The model `{model}` does not exist."

    def error_body(self, status: int, message: str, kind: str, code: str | None) -> dict[str, Any]:
        return {"error": {"message": message, "type": kind, "param": None,
                          "code": code if code is not None else status}}

    def usage(self, turn: Turn) -> dict[str, Any]:
        c = turn.counts
        usage = {"prompt_tokens": c.prompt, "completion_tokens": c.completion, "total_tokens": c.prompt + c.completion}
        return {**usage, "prompt_tokens_details": {"cached_tokens": c.cached}} if turn.details else usage

    def chunk(self, turn: Turn, delta: dict[str, Any], finish: str | None, extra: dict[str, Any]) -> dict[str, Any]:
        return {**self.head(turn, "chat.completion.chunk"),
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}

    def chunks(self, turn: Turn, include_usage: bool) -> list[dict[str, Any]]:
        extra = {"usage": None} if include_usage else {}
        events = [self.chunk(turn, {"role": "assistant", "content": ""}, None, extra)]
        events += [self.chunk(turn, {"reasoning_content": t}, None, extra) for t in turn.thoughts]
        events += [self.chunk(turn, {"content": p}, None, extra) for p in turn.pieces]
        events.append(self.chunk(turn, {}, turn.reason, extra))
        if include_usage:
            events.append({**self.head(turn, "chat.completion.chunk"), "choices": [], "usage": self.usage(turn)})
        return events

    def completion(self, turn: Turn) -> dict[str, Any]:
        message = {"role": "assistant", "content": turn.text}
        return {**self.head(turn, "chat.completion"), "usage": self.usage(turn),
                "choices": [{"index": 0, "message": message, "finish_reason": turn.reason}]}

    def stream_error(self, message: str) -> list[bytes]:
        """The SSE lines that report a failure after the stream began (then the stream ends)."""
        error = {"error": {"message": message, "type": "server_error", "code": 500}}
        return [f"data: {json.dumps(error)}\n\n".encode()]


class OllamaShape(Shape):
    """Ollama's ``/v1/chat/completions``, as ollama/ollama writes it in ``openai/openai.go``
    (``ToChunk``, ``ToUsage``, ``NewError``, ``ChatCompletionChunk`` whose ``usage`` is an
    ``omitempty`` pointer) and ``middleware/openai.go`` (``ChatWriter.writeResponse``,
    ``writeError``):

    - every chunk's delta is ``{"role": "assistant", "content": piece}``; no role-only first
      chunk; the last chunk carries ``finish_reason`` (``done_reason``: stop or length) with
      empty content; no ``usage`` key on any of them;
    - thinking models send their thoughts as ``delta.reasoning`` with empty content;
    - with ``stream_options.include_usage``, one more chunk after the last: ``choices: []`` and
      ``usage`` = ``{prompt_tokens, completion_tokens, total_tokens}`` (``prompt_eval_count``
      and ``eval_count``): no ``prompt_tokens_details``, so no cached-token count at all;
      without it, no usage is sent;
    - errors: ``{"error": {"message", "type": "api_error", "param": null, "code": null}}``; an
      unknown model is 404 ``model "NAME" not found, try pulling it first`` (``server/routes.go``).
    """

    fingerprint = "fp_ollama"

    def model_entry(self, model: str, created: int) -> dict[str, Any]:
        return {"id": model, "object": "model", "created": created, "owned_by": "library"}

    def unknown_model(self, model: str) -> str | None:
        return f'model "{model}" not found, try pulling it first'

    def error_body(self, status: int, message: str, kind: str, code: str | None) -> dict[str, Any]:
        kind = {400: "invalid_request_error", 404: "not_found_error"}.get(status, "api_error")
        return {"error": {"message": message, "type": kind, "param": None, "code": None}}

    def usage(self, turn: Turn) -> dict[str, Any]:
        c = turn.counts
        return {"prompt_tokens": c.prompt, "completion_tokens": c.completion, "total_tokens": c.prompt + c.completion}

    def chunks(self, turn: Turn, include_usage: bool) -> list[dict[str, Any]]:
        events = [self.chunk(turn, {"role": "assistant", "content": "", "reasoning": t}, None, {})
                  for t in turn.thoughts]
        events += [self.chunk(turn, {"role": "assistant", "content": p}, None, {}) for p in turn.pieces]
        events.append(self.chunk(turn, {"role": "assistant", "content": ""}, turn.reason, {}))
        if include_usage:
            events.append({**self.head(turn, "chat.completion.chunk"), "choices": [], "usage": self.usage(turn)})
        return events

    def stream_error(self, message: str) -> list[bytes]:
        error = {"error": {"message": message, "type": "api_error", "param": None, "code": None}}
        return [f"data: {json.dumps(error)}\n\n".encode()]


class LlamaCppShape(Shape):
    """llama.cpp's ``llama-server``, as ggml-org/llama.cpp writes it in ``tools/server/
    server-task.cpp`` (``to_json_oaicompat_chat_stream``, ``usage_json_oaicompat``,
    ``result_timings::to_json``) and ``server.cpp`` (the stream's error callback):

    - a first chunk ``{"role": "assistant", "content": null}``, then ``{"content": piece}``
      deltas (thinking as ``reasoning_content``), then ``finish_reason`` with ``delta: {}``;
    - with ``include_usage``, a last chunk ``choices: []`` whose ``usage`` has
      ``prompt_tokens`` (all of them), ``completion_tokens`` and
      ``prompt_tokens_details.cached_tokens`` (the slot's reused prefix, ``n_prompt_tokens_cache``);
    - the last chunk sent (the usage chunk, else the finish chunk) also carries ``timings``:
      ``cache_n`` (cached prompt tokens), ``prompt_n`` (prompt tokens evaluated),
      ``predicted_n``, and their ``*_ms``, ``*_per_token_ms``, ``*_per_second``; builds that
      predate ``include_usage`` send only these;
    - it serves the one model it loaded, whatever name a request gives;
    - errors: ``{"error": {"code", "message", "type"}}``; a failure after the stream began is
      an SSE ``error:`` field (``server_sent_event(sink, "error", ...)``) followed by
      ``data: [DONE]`` (newer builds send ``data: {"error": ...}`` instead).
    """

    fingerprint = "b6000-slimrag-tests"

    def model_entry(self, model: str, created: int) -> dict[str, Any]:
        return {"id": model, "object": "model", "created": created, "owned_by": "llamacpp",
                "meta": {"n_ctx_train": 8192, "n_params": 135_000_000}}

    def unknown_model(self, model: str) -> str | None:
        return None

    def error_body(self, status: int, message: str, kind: str, code: str | None) -> dict[str, Any]:
        kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}.get(
            status, "server_error")
        return {"error": {"code": status, "message": message, "type": kind}}

    def timings(self, turn: Turn) -> dict[str, Any]:
        c = turn.counts
        evaluated = c.prompt - c.cached
        prompt_ms, predicted_ms = 0.5 * evaluated + 1.0, 20.0 * c.completion + 1.0
        return {"cache_n": c.cached, "prompt_n": evaluated, "prompt_ms": prompt_ms,
                "prompt_per_token_ms": prompt_ms / max(evaluated, 1),
                "prompt_per_second": 1e3 * evaluated / prompt_ms,
                "predicted_n": c.completion, "predicted_ms": predicted_ms,
                "predicted_per_token_ms": predicted_ms / max(c.completion, 1),
                "predicted_per_second": 1e3 * c.completion / predicted_ms}

    def chunks(self, turn: Turn, include_usage: bool) -> list[dict[str, Any]]:
        events = [self.chunk(turn, {"role": "assistant", "content": None}, None, {})]
        events += [self.chunk(turn, {"reasoning_content": t}, None, {}) for t in turn.thoughts]
        events += [self.chunk(turn, {"content": p}, None, {}) for p in turn.pieces]
        events.append(self.chunk(turn, {}, turn.reason, {}))
        if include_usage:
            events.append({**self.head(turn, "chat.completion.chunk"), "choices": [], "usage": self.usage(turn)})
        if turn.timings:
            events[-1]["timings"] = self.timings(turn)
        return events

    def completion(self, turn: Turn) -> dict[str, Any]:
        out = super().completion(turn)
        if turn.timings:
            out["timings"] = self.timings(turn)
        return out

    def stream_error(self, message: str) -> list[bytes]:
        error = {"code": 500, "message": message, "type": "server_error"}
        return [f"error: {json.dumps(error)}\n\n".encode(), b"data: [DONE]\n\n"]  # DONE is written after any end


#: shape name -> how that server family writes the protocol (see the module header).
SHAPES: dict[str, Shape] = {"openai": Shape(), "ollama": OllamaShape(), "llamacpp": LlamaCppShape()}
