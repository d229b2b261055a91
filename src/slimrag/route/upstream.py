"""What the router keeps of a replica's attempt: why it failed (`Failure`, whether it takes the
replica down), at most `MAX_ERROR_BYTES` of its error body, never the whole of it, and the answer
relayed to the client (`Relayed`); a health answer read as a JSON object (`json_object`)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


@dataclass(frozen=True, slots=True)
class Failure:
    """Why an attempt failed before any byte reached the client; ``down``: leave the replica out
    for the cool-down (unreachable, timed out, 503/504), not for another 5xx, which may be this
    request's own fault and would otherwise take every replica down at once."""

    reason: str
    down: bool


def reason_of(status: int, body: bytes) -> str:
    """A failed replica's status and error message (OpenAI's shape when it is that)."""
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body[:200].decode("utf-8", errors="replace")
    return f"status {status}: {message}"


#: Most bytes of a failed replica's error body read for the log and the 502 (the rest is dropped).
MAX_ERROR_BYTES = 64 * 1024


async def head_of(upstream: httpx.Response) -> bytes:
    """At most `MAX_ERROR_BYTES` of ``upstream``'s body: a replica's error is read to be named,
    never buffered whole, whatever it sends."""
    parts, size = [], 0
    async for chunk in upstream.aiter_bytes():
        parts.append(chunk)
        size += len(chunk)
        if size >= MAX_ERROR_BYTES:
            break
    return b"".join(parts)[:MAX_ERROR_BYTES]


class Relayed(StreamingResponse):
    """A replica's answer relayed to the client; ``release`` runs once it ends, however it ends."""

    def __init__(self, chunks: AsyncIterator[bytes], status: int, headers: dict[str, str],
                 release: Callable[[], Awaitable[None]]) -> None:
        super().__init__(chunks, status_code=status, headers=headers)
        self.release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):  # a client that left cancels the scope
                await self.release()


def json_object(response: httpx.Response) -> dict[str, Any]:
    """A replica's JSON object (its ``/healthz``), or {} when it is not JSON or not an object."""
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
