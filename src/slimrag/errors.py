"""Errors raised by slimrag.

Every error a user can cause derives from :class:`SlimragError`, so a caller can catch one type.
Messages say what went wrong and what to do next.
"""

from __future__ import annotations


class SlimragError(Exception):
    """Base class of every error slimrag raises on purpose."""


class RequestError(SlimragError, ValueError):
    """The caller's input cannot be answered as given: a bad search mode or filter, a prompt longer
    than the model's context, ... The server answers it with 400. It is also a `ValueError`, the
    exception Python code expects for a bad argument."""


class IndexFormatError(SlimragError):
    """The index folder is missing, corrupt, or written by an incompatible version."""


class IngestError(SlimragError):
    """A file could not be read or chunked (raised per file; the crawler turns it into a warning)."""


class ModelNotFoundError(SlimragError):
    """A model package or file is not installed; the message names the package to install."""


class BackendError(SlimragError):
    """A remote backend (embeddings or chat completions) failed or answered something unexpected."""


class NotFoundError(SlimragError, KeyError):
    """A thing asked for by its id or name is not there: an unknown or removed chunk id, ... The
    server answers it with 404. It is also a `KeyError`, what Python code expects from a lookup."""

    def __str__(self) -> str:
        # KeyError's str() quotes its argument (it expects a key); ours is a sentence.
        return str(self.args[0]) if self.args else ""
