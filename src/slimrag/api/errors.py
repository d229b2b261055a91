"""The server's errors, in OpenAI's shape, and the mapping from exceptions to HTTP statuses.

Every error is ``{"error": {"message", "type", "param", "code"}}``; ``type`` is
``invalid_request_error`` for a 4xx (the request's fault) and ``server_error`` for a 5xx.

Statuses
    Invalid JSON, wrong types, missing fields and out-of-range values are 400 (not FastAPI's 422:
    OpenAI clients expect 400, naming the one parameter at fault); a missing or wrong API key 401;
    a body over ``max_body_bytes`` 413; unknown routes 404 (the last three are answered by `Gate`
    and `create_app`). A `RequestError` (the request's input cannot be answered: a prompt too long
    for the model, ...) is 400, a failing remote backend (`BackendError`) 502, a broken index or a
    missing model 500. Any other `SlimragError` at request time is still 400, as it was before
    `RequestError` existed, until every request-time raise site says which it is. Anything else is
    a logged 500 whose message points at the server log.

Streams
    A stream waits for its first piece before it sends 200, so the failures above keep their
    status; a failure after that is sent as a ``data: {"error": ...}`` event and the stream ends
    without ``[DONE]`` (llama.cpp's convention, which `RemoteGenerator` reports as a `BackendError`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request

from slimrag.errors import (
    BackendError,
    IndexFormatError,
    ModelNotFoundError,
    NotFoundError,
    RequestError,
    SlimragError,
)

log = logging.getLogger(__name__)


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
    if isinstance(exc, RequestError):
        return APIError(400, str(exc), code="invalid_request")
    if isinstance(exc, NotFoundError):
        return APIError(404, str(exc), code="not_found")
    if isinstance(exc, BackendError):
        return APIError(502, f"the language model backend failed: {exc}", code="backend_error")
    if isinstance(exc, IndexFormatError | ModelNotFoundError):
        return APIError(500, f"the server is misconfigured: {exc}", code="server_misconfigured")
    if isinstance(exc, SlimragError):  # not yet told apart from a RequestError (see the header)
        return APIError(400, str(exc), code="invalid_request")
    log.error("unexpected error while answering", exc_info=exc)
    return APIError(500, f"internal error ({type(exc).__name__}: {exc}); see the server log",
                    code="internal_error")


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict"}
#: Clearer words than pydantic's for some error types (a lone surrogate: JSON's ``"\ud800"``).
_MESSAGES = {"string_unicode": "the text holds a lone UTF-16 surrogate (an escape such as \\ud800 without its "
                               "pair), which cannot be encoded as UTF-8; send valid Unicode"}


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
    # a union reports one error per member; the deepest location is the one that says what is wrong,
    # and at equal depth a member of the right type that broke a rule (too many items) beats a
    # member of the wrong type
    first = max(errors, key=lambda e: (len(_param(e["loc"]) or ""), not e["type"].endswith("_type")))
    param = _param(first["loc"])
    first = {**first, "msg": _MESSAGES.get(first["type"], first["msg"].removeprefix("Value error, "))}
    if param is None and isinstance(first.get("input"), bytes):
        return APIError(400, "send the request body as a JSON object with 'Content-Type: application/json'",
                        code="invalid_body")
    if param is None:
        return APIError(400, f"the request body must be a JSON object ({first['msg']})", code="invalid_body")
    return APIError(400, f"invalid '{param}': {first['msg']}", param=param, code="invalid_value")


def install_handlers(app: FastAPI) -> None:
    """Answer FastAPI's own errors in OpenAI's shape: validation errors as 400 (`validation_error`),
    unknown routes 404, wrong methods 405."""

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        err = validation_error(exc)
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = (f"no route {request.method} {request.url.path}; see GET /openapi.json" if exc.status_code == 404
                   else str(exc.detail))
        err = APIError(exc.status_code, message, code=str(exc.status_code))
        return JSONResponse(err.body(), status_code=err.status, headers=exc.headers)
