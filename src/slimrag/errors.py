"""Errors raised by slimrag.

Every error a user can cause derives from :class:`SlimragError`, so a caller can catch one type.
Messages say what went wrong and what to do next.
"""

from __future__ import annotations


class SlimragError(Exception):
    """Base class of every error slimrag raises on purpose."""


class IndexFormatError(SlimragError):
    """The index folder is missing, corrupt, or written by an incompatible version."""


class IngestError(SlimragError):
    """A file could not be read or chunked (raised per file; the crawler turns it into a warning)."""


class ModelNotFoundError(SlimragError):
    """A model package or file is not installed; the message names the package to install."""


class BackendError(SlimragError):
    """A remote backend (embeddings or chat completions) failed or answered something unexpected."""
