"""slimrag: small, offline retrieval-augmented generation.

Public API (no import-time work: heavy modules load on first use)::

    from slimrag import Index, RAG
    idx = Index.build("docs/", "docs.slimrag")
    rag = RAG(idx)
    print(rag.ask("How do I install it?").text)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slimrag.types import Answer, Chunk, Document, Hit, Usage

if TYPE_CHECKING:
    from slimrag.index.core import Index
    from slimrag.rag.pipeline import RAG

__all__ = ["Answer", "Chunk", "Document", "Hit", "Index", "RAG", "Usage", "__version__"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Lazy, so `import slimrag` stays cheap (numpy, sqlite, torch load only when used).
    if name == "Index":
        from slimrag.index.core import Index

        return Index
    if name == "RAG":
        from slimrag.rag.pipeline import RAG

        return RAG
    raise AttributeError(f"module 'slimrag' has no attribute {name!r}")
