"""`OpenAIClient`: the HTTP side of any OpenAI-compatible server (vLLM, SGLang, llama.cpp, Ollama).

Shared by `RemoteGenerator` (:mod:`slimrag.llm.remote`) and `RemoteEmbedder`
(:mod:`slimrag.embed.remote`) so both speak the same URL rule, send the same key header and turn
every failure into the same kind of `BackendError`.

Base URL rule
    ``base_url`` names the API root. If its path already ends in ``/v1`` it is used as is,
    otherwise ``/v1`` is appended: ``http://host:8000``, ``http://host:8000/`` and
    ``http://host:8000/v1/`` all mean ``http://host:8000/v1``. A root under another prefix
    (``http://host/proxy/v1``) works the same way.

Errors
    Refused connections, timeouts, HTTP status >= 400 (with the server's own error message, in
    any of the shapes OpenAI, vLLM, llama.cpp and Ollama use) and malformed JSON all raise
    `BackendError` saying what to do next.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import httpx

from slimrag.errors import BackendError

#: Advice appended to an HTTP error, by status. Statuses not listed get the 4xx/5xx default.
_STATUS_HINTS: dict[int, str] = {
    400: "the server rejected the request; check the model name and sampling settings",
    401: "pass the server's key as api_key= (sent as 'Authorization: Bearer KEY')",
    403: "the API key is not allowed to use this endpoint or model; check the key",
    404: "check that base_url is the API root (it should end in /v1) and that the model is served "
    "(see GET /v1/models)",
    413: "the request is too large; send fewer texts per batch or a shorter prompt",
    422: "the server rejected the request body; check the model name and sampling settings",
    429: "the server is rate-limiting or overloaded; retry later or lower concurrency",
}
_HINT_4XX = "check the request and the server's documentation"
HINT_5XX = "the server failed; check its log, and retry once it is healthy"


def api_root(base_url: str) -> str:
    """Normalize ``base_url`` to the API root ending in ``/v1`` (see the module header)."""
    url = base_url.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BackendError(
            f"base_url {base_url!r} is not an http(s) URL; give one like 'http://127.0.0.1:8000/v1'"
        )
    return url if parts.path.endswith("/v1") else url + "/v1"


def server_message(text: str) -> str:
    """Pull the human-readable message out of an error body, whatever the server's dialect.

    OpenAI and llama.cpp: ``{"error": {"message": ...}}``; Ollama: ``{"error": "..."}``;
    vLLM (some versions): ``{"object": "error", "message": ...}``; anything else: the raw text.
    """
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()[:500] or "(empty body)"
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, str):
            return err
        message = err.get("message") if isinstance(err, dict) else None
        if isinstance(message, str):
            return message
        detail = body.get("detail")  # FastAPI's default error shape
        if isinstance(detail, str):
            return detail
    return text.strip()[:500]


class OpenAIClient:
    """The HTTP side of an OpenAI-compatible server, shared by `RemoteGenerator` and
    `RemoteEmbedder`: one ``httpx.Client`` with the key header, and every transport or protocol
    failure turned into a `BackendError` whose message names the URL and the next step."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 120.0) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.root = api_root(base_url)
        self.timeout = timeout
        headers = {"Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._http = httpx.Client(headers=headers, timeout=timeout)

    def url(self, path: str) -> str:
        """The absolute URL of ``path`` (e.g. ``"models"``) under the API root."""
        return f"{self.root}/{path.lstrip('/')}"

    def get_json(self, path: str) -> Any:
        """GET ``path`` and return its decoded JSON body."""
        url = self.url(path)
        try:
            response = self._http.get(url)
        except httpx.HTTPError as exc:
            raise self.transport_error(exc, url) from exc
        return self._decode(response, url)

    def post_json(self, path: str, body: dict[str, Any]) -> Any:
        """POST ``body`` as JSON to ``path`` and return the decoded JSON answer."""
        url = self.url(path)
        try:
            response = self._http.post(url, json=body)
        except httpx.HTTPError as exc:
            raise self.transport_error(exc, url) from exc
        return self._decode(response, url)

    @contextmanager
    def post_stream(self, path: str, body: dict[str, Any]) -> Iterator[httpx.Response]:
        """POST ``body`` and yield the open response (status already checked) for line-by-line
        reading; transport errors while reading become `BackendError` too."""
        url = self.url(path)
        try:
            with self._http.stream("POST", url, json=body) as response:
                if response.status_code >= 400:
                    response.read()
                    raise self.status_error(response.status_code, response.text, url)
                yield response
        except httpx.HTTPError as exc:
            raise self.transport_error(exc, url) from exc

    def list_models(self) -> list[str]:
        """The model ids the server lists at ``GET /v1/models``, in its order."""
        body = self.get_json("models")
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise BackendError(f"{self.url('models')} answered without a 'data' list; is this an "
                               "OpenAI-compatible server?")
        return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]

    def close(self) -> None:
        """Close the connection pool. Further requests fail."""
        self._http.close()

    def _decode(self, response: httpx.Response, url: str) -> Any:
        if response.status_code >= 400:
            raise self.status_error(response.status_code, response.text, url)
        try:
            return response.json()
        except ValueError as exc:
            raise BackendError(
                f"{url} answered HTTP {response.status_code} with a body that is not JSON "
                f"({response.text[:200]!r}); is base_url an OpenAI-compatible API root?"
            ) from exc

    def status_error(self, status: int, text: str, url: str) -> BackendError:
        """The `BackendError` for an HTTP error status, with the server's message and advice."""
        hint = _STATUS_HINTS.get(status, HINT_5XX if status >= 500 else _HINT_4XX)
        return BackendError(f"{url} answered HTTP {status}: {server_message(text)} ({hint})")

    def transport_error(self, exc: httpx.HTTPError, url: str) -> BackendError:
        """The `BackendError` for a failure below HTTP: refused, timed out, connection dropped."""
        if isinstance(exc, httpx.ConnectError):
            return BackendError(f"cannot connect to {url} ({exc}); is the server running? "
                                "Start it, or fix the URL (--llm or --embedder-url on the command line)")
        if isinstance(exc, httpx.TimeoutException):
            return BackendError(f"no answer from {url} within {self.timeout:g} s; the server may be "
                                "loading a model or overloaded: retry, or pass a larger timeout=")
        return BackendError(f"request to {url} failed: {type(exc).__name__}: {exc}; check the server "
                            "and retry")
