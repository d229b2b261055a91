"""The published contract: ``/openapi.json`` says what the server really answers.

FastAPI's generated schema declares 422 for every body (slimrag answers 400, in OpenAI's shape,
see `slimrag.api.errors`) and knows nothing of what `Gate` answers before a route runs (401,
413). `publish` replaces FastAPI's schema with one where every operation lists the statuses it
can return, each with the error body's schema, and, when the server has an API key, a bearer
security scheme on every operation but ``/healthz``. Routes list their own statuses with
`error_responses`. Clients and fuzzers (schemathesis runs in the test suite) can then trust it:
a status the schema does not list is a bug of the server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from slimrag.api.schemas import ErrorBody

#: What each error status means, as published.
WHY = {
    400: "The request is invalid: bad JSON, a wrong type, a value out of range, or input the server "
         "cannot answer (the error's ``param`` names the field).",
    401: "The API key is missing or wrong: send ``Authorization: Bearer KEY``.",
    413: "The request body is larger than the server's limit.",
    500: "The server failed (a broken index, a missing model, or a bug: see the server log).",
    502: "The language model or embedding backend failed.",
}

#: Paths open without the API key.
OPEN_PATHS = ("/healthz",)


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` argument of a route that can answer ``statuses`` (all with `ErrorBody`);
    `Gate`'s 401 is added by `publish` when the server has a key."""
    return {s: {"model": ErrorBody, "description": WHY[s]} for s in statuses}


def publish(app: FastAPI, *, api_key: bool, patches: Iterable[Callable[[dict[str, Any]], None]] = ()) -> None:
    """Make ``app.openapi()`` return the contract described in the module header; ``patches``
    edit the schema once built (e.g. a value only known at run time, such as the embedder's width)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
        components = schema.setdefault("components", {})
        for name in ("HTTPValidationError", "ValidationError"):
            components.get("schemas", {}).pop(name, None)
        if api_key:
            components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer",
                                                        "description": "The server's --api-key."}}
        for path, operations in schema["paths"].items():
            for op in operations.values():
                op["responses"].pop("422", None)
                if api_key and path not in OPEN_PATHS:
                    op["security"] = [{"bearer": []}]
                    op["responses"]["401"] = {
                        "description": WHY[401],
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}
        for patch in patches:
            patch(schema)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
