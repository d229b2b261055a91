"""`until_gone`: stop work for a client that left.

Neither uvicorn nor Starlette cancels a route when its client disconnects before the response
starts; only a streaming response notices, once it streams. So a non-streamed chat completion
would generate for nobody (600 tokens in one probe), and the router would wait for a replica's
whole answer. Routes that wait long race their work against the ASGI ``http.disconnect``
message: `Gate` replays the body once, and later ``receive()`` calls wait for the disconnect.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


async def until_gone(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result, unless the client disconnects first: then ``work`` is cancelled and
    `ClientGone` is raised."""
    task = asyncio.ensure_future(work)

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise ClientGone
