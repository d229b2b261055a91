"""`slimrag mcp INDEX`: the index as tools for an agent, over the Model Context Protocol.

Built on the official SDK's `MCPServer` (``mcp.server.mcpserver``; the package ``slimrag.mcp``
does not shadow it: every import here is absolute). Tools, each a thin shell over the library:

- ``search``: `Index.search` (keyword, vector or hybrid; optional source filter) → passages with
  label, source, page, score and text;
- ``ask``: `RAG` (retrieve, generate with the configured model) → the answer, its citations'
  passages, finish reason and usage;
- ``list_documents``: `Index.documents` → stored sources (optionally filtered), with a limit;
- ``get_passage``: `Index.passage` → a chunk with its neighbours, to read around a hit;
- ``add_paths``: `Index.add` → counts and skips of the add report; confined to the allowed
  roots (`slimrag.ingest.confine.AddRoots`: the index's indexed folder and each ``--allow-add``,
  symlinks resolved, hidden files and folders never), whatever path the caller sends. Its
  description names the roots, and its annotations say it reads the file system and may replace
  a document's stored text (not read-only, destructive, open world).

The tool docstrings are what the model reads: they say what comes back and when to use the tool.
Arguments are typed with descriptions, so each tool's ``inputSchema`` explains itself, and each
returns a dataclass of `slimrag.mcp.results` (published as ``outputSchema``, sent as
``structuredContent``). All calls run on one `IndexWorker` thread (why: its module header): the
index is opened once at start, the generator on the first ``ask``.

Errors: a bad argument (an unknown mode, ``k`` out of range) is refused by the SDK's validation
against the schema; a lookup that fails (unknown chunk id, a source filter that matches nothing,
a missing path) and any `SlimragError` become a tool error whose text says what to do next
(``isError: true``, the session goes on). Anything else is a bug: the SDK logs it on stderr and
answers a generic tool error.

Transports: stdio (the default; what Claude Code and Claude Desktop start) or streamable HTTP
(``--http``, at ``http://HOST:PORT/mcp``; bound to 127.0.0.1 by default), whose key, Host and
Origin rule, body limit and session bounds are `slimrag.mcp.http`'s. The app runs on a socket
the CLI bound before the index opened (`slimrag.api.listen`). On stdio, stdout carries the protocol alone: logs go to stderr,
and while it serves, the SDK points file descriptor 1 at stderr, so a stray ``print`` in a library
(a model loader's progress) cannot corrupt the protocol.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

from slimrag.api.hosts import HostRule
from slimrag.config import SEARCH_MODES, GenerationConfig, SearchConfig
from slimrag.errors import SlimragError
from slimrag.index.browse import MAX_AROUND
from slimrag.index.sources import match_one, source_glob
from slimrag.ingest.confine import AddRoots
from slimrag.ingest.outcome import Skipped
from slimrag.mcp.http import HttpLimits, http_app, needs_key
from slimrag.mcp.results import (
    AddResult,
    AnswerResult,
    DocumentInfo,
    DocumentList,
    PassageExcerpt,
    PassageHit,
    SearchResult,
)
from slimrag.mcp.worker import IndexWorker

#: The most passages one search or ask returns: enough context for an agent, bounded output.
MAX_K = 50
#: The most paths one `add_paths` call takes (each is checked, then crawled; an agent adds a few).
MAX_ADD_PATHS = 100
#: The most documents `list_documents` returns at once.
MAX_LIST = 1000
#: Transports `serve` accepts (the SDK's names).
TRANSPORTS = ("stdio", "streamable-http")

Mode = Literal["keyword", "vector", "hybrid"]
assert set(Mode.__args__) == set(SEARCH_MODES), "the schema's modes must be the library's"  # type: ignore[attr-defined]

INSTRUCTIONS = """\
slimrag searches a local index of the user's files and answers from them with citations.
Start with `search` to find passages (each has a label `source#ordinal`, a source path and, for
PDFs, a page); open more context around a hit with `get_passage`; use `ask` when a written answer
with citations is wanted. `list_documents` shows what is indexed; `add_paths` indexes more files.
Cite passages by their label."""

#: Search defaults, read from `SearchConfig` so the tool, the CLI and the library agree.
DEFAULT_K: int = SearchConfig().k
DEFAULT_MODE: str = SearchConfig().mode


def source_pattern(value: str | None, names: Sequence[str], root: str | None = None) -> str | None:
    """The GLOB `Index.search` filters by for a ``source`` argument, by the CLI's ``--source``
    rules (`slimrag.index.sources`): a stored name (exact), a folder (every name under it) or a
    glob (``*`` also crosses ``/``). None for no filter; a `ToolError` when nothing stored
    matches, with examples of stored names."""
    if value is None or not value.strip():
        return None
    pattern = source_glob(value.strip(), names, root)
    if pattern is None:
        examples = ", ".join(repr(n) for n in names[:3]) or "none: the index is empty"
        raise ToolError(f"no stored source matches {value!r}; give a stored name from list_documents, a folder "
                        f"or a glob such as 'docs/*.md' (stored names look like {examples})")
    return pattern


def sources_meant(value: str, names: Sequence[str], root: str | None = None) -> list[str]:
    """The stored names a ``source`` argument means (same rules as `source_pattern`)."""
    return match_one(value.strip(), names, root, Path.cwd())[1]


def _source_filter(idx: Any, source: str | None) -> str | None:
    """`source_pattern` against ``idx``'s stored names (listed only when a filter is given)."""
    if source is None:
        return None
    return source_pattern(source, [d.source for d in idx.documents()], idx.source_root)


class SlimragTools:
    """The tools, as methods (see the module header); registered by `create_server`."""

    def __init__(self, worker: IndexWorker, roots: AddRoots) -> None:
        self.worker, self.roots = worker, roots

    def search(
        self,
        query: Annotated[str, Field(description="What to look for: a question, a phrase or keywords.",
                                    min_length=1)],
        k: Annotated[int, Field(description="How many passages to return, best first.", ge=1, le=MAX_K)] = DEFAULT_K,
        mode: Annotated[Mode, Field(description="'hybrid' fuses meaning and exact words; 'vector' "
                                                "matches meaning; 'keyword' matches exact words (names, codes, "
                                                "error messages).")] = DEFAULT_MODE,  # type: ignore[assignment]
        source: Annotated[str | None, Field(description="Only passages from this stored source (as "
                                                        "list_documents names it), folder (e.g. 'docs') or glob "
                                                        "(e.g. 'notes/*.md'). Omit to search everything.")] = None,
    ) -> SearchResult:
        """Search the indexed files for passages relevant to a query.

        Returns the best `k` passages, best first. Each has `label` (source#ordinal: how to cite
        it), `source` (the file), `page` (PDFs only), `heading`, `score` (higher is better; scales
        differ between modes) and `text`, plus `chunk_id` for get_passage. Use this first to find
        facts in the user's files; use get_passage to read around a hit, ask for a written answer."""
        def run(idx: Any) -> SearchResult:
            pattern = _source_filter(idx, source)
            hits = idx.search(query, k=k, mode=mode, source=pattern)
            return SearchResult(query, mode, [PassageHit.from_hit(h) for h in hits])
        return self._call(run)

    def ask(
        self,
        question: Annotated[str, Field(description="The question to answer from the indexed files.",
                                       min_length=1)],
        k: Annotated[int, Field(description="How many passages the answer is written from.",
                                ge=1, le=MAX_K)] = 4,
        source: Annotated[str | None, Field(description="Only use passages from this stored source, folder "
                                                        "or glob (as in search).")] = None,
        no_llm: Annotated[bool, Field(description="Answer with the evidence sentences alone, without the "
                                                  "language model: fast, and quoted from the passages.")] = False,
        answer: Annotated[Literal["free", "grounded"] | None, Field(
            description="'grounded': the passages' best sentences first, then the model's one sentence; "
                        "'free': the model writes over the passages. Default: the model's own.")] = None,
    ) -> AnswerResult:
        """Answer a question from the indexed files with a language model, citing passages.

        Returns `answer` (citations look like [source#ordinal]), `sources` (the passages it was
        given, best first, same fields as search), `finish_reason` ('length' means it was cut
        off), `notice`, `abstained` (true when no passage was relevant enough: the answer then
        says so and no model ran), `unknown_citations` (labels the model invented), `usage`,
        `evidence` (the passage sentences that best answer the question, each with its label and
        its place in the passage), `support` (each answer sentence: backed or not, by which labels,
        numbers and names found in no passage), `used` (the labels backing the answer) and `marked`
        (the answer with [label] after each backed sentence that cited nothing), `verdict` (supported, partial,
        or not_backed: then the answer is not to be presented, `shown` says so and quotes the passages) and
        `shown` (what to present). With no_llm the
        answer is the evidence alone and no model runs.
        Slower than search (a model generates); prefer search when you can read passages yourself."""
        def run(idx: Any) -> AnswerResult:
            pattern = _source_filter(idx, source)
            if no_llm:
                from slimrag.rag.evidence import evidence_answer

                return AnswerResult.from_answer(evidence_answer(idx, question, k, source=pattern))
            return AnswerResult.from_answer(self.worker.rag().ask(question, k, source=pattern, answer=answer))
        return self._call(run)

    def list_documents(
        self,
        source: Annotated[str | None, Field(description="Only documents under this folder (e.g. 'docs') or "
                                                        "matching this glob (e.g. 'notes/*.md'); omit for "
                                                        "all.")] = None,
        limit: Annotated[int, Field(description="The most documents to return.", ge=1, le=MAX_LIST)] = 200,
    ) -> DocumentList:
        """List the documents in the index, sorted by source path.

        Returns `total` (how many matched), `documents` (at most `limit`: source, size in bytes,
        modified time, doc_id) and `index_chunks` (passages in the whole index). Use it to see
        what is indexed, or to find a source name for the source filter of search and ask."""
        def run(idx: Any) -> DocumentList:
            docs = idx.documents()
            if source:
                meant = set(sources_meant(source, [d.source for d in docs], idx.source_root))
                docs = [d for d in docs if d.source in meant]
            return DocumentList(len(docs), [DocumentInfo.from_document(d) for d in docs[:limit]],
                                int(idx.status()["chunks"]))
        return self._call(run)

    def get_passage(
        self,
        chunk_id: Annotated[int, Field(description="The chunk_id of a passage from search or ask.", ge=0)],
        around: Annotated[int, Field(description="How many neighbouring passages of the same document to "
                                                 "include on each side.", ge=0, le=MAX_AROUND)] = 1,
    ) -> PassageExcerpt:
        """Open a passage in its document: the passage and its neighbours before and after it.

        Returns the passage (`label`, `source`, `page`, `text`) with `before` and `after`: the
        chunks of the same document just before and after it, in reading order (fewer at the
        start or end of the document). Use it when a search hit is cut off or needs context."""
        return self._call(lambda idx: PassageExcerpt.from_excerpt(idx.passage(chunk_id, around)))

    def add_paths(
        self,
        paths: Annotated[list[str], Field(description="Files or folders to index, inside the folders this "
                                                      "server allows (see the tool description): absolute, or "
                                                      "relative to the first of them. Folders are read "
                                                      "recursively, skipping hidden and ignored files.",
                                          min_length=1, max_length=MAX_ADD_PATHS)],
    ) -> AddResult:
        """Add files or folders to the index, or update those whose content changed.

        Returns counts of documents `added`, `updated` and `unchanged`, `chunks` written, and
        `skipped` inputs with the reason (unsupported type, binary, too large, ignored, ...),
        plus `files`: the sources behind each count. Files already indexed with the same content
        are not read again; a changed file's stored passages are replaced by its new text.
        Never removes a document."""
        def run(idx: Any) -> AddResult:
            skipped: list[Skipped] = []
            # an AddRefused is a SlimragError: `_call` makes it a tool error with its message
            files = self.roots.files(paths, idx.config.ignore, idx.config.max_file_bytes, skipped)
            report = idx.add([str(p) for p in files])
            report.skipped[:0] = skipped  # the walk's skips first, as a folder's add lists them
            return AddResult.from_report(report)
        return self._call(run)  # the write puts its parts in the view itself

    def add_paths_description(self) -> str:
        """The ``add_paths`` description the model reads: its docstring plus what it may read."""
        doc = " ".join(ln.strip() for ln in (type(self).add_paths.__doc__ or "").splitlines())
        return (f"{doc}\n\nReads files only inside: {self.roots.describe()} (symlinks resolved; hidden files and "
                "folders, and anything outside these folders, are refused with a tool error). Only the person "
                "who starts the server can allow other folders.")

    def _call(self, fn: Any) -> Any:
        """``fn(index)`` on the worker; library errors become tool errors with their message."""
        try:
            return self.worker.call(fn)
        except SlimragError as exc:  # NotFoundError (unknown chunk) and RequestError (bad input) included
            raise ToolError(str(exc)) from exc  # its message already says what to do next


def create_server(worker: IndexWorker, roots: AddRoots) -> MCPServer[Any]:
    """The MCP server with slimrag's tools over ``worker``'s index; ``add_paths`` reads only
    inside ``roots``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        own_version = version("slimrag")
    except PackageNotFoundError:  # running from a source tree that was never installed
        own_version = "0"
    server: MCPServer[Any] = MCPServer("slimrag", instructions=INSTRUCTIONS, version=own_version,
                                       log_level="WARNING")
    tools = SlimragTools(worker, roots)
    reading = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    server.add_tool(tools.search, name="search", title="Search the index", annotations=reading)
    server.add_tool(tools.ask, name="ask", title="Answer from the index", annotations=reading)
    server.add_tool(tools.list_documents, name="list_documents", title="List indexed documents",
                    annotations=reading)
    server.add_tool(tools.get_passage, name="get_passage", title="Open a passage in its document",
                    annotations=reading)
    # Honest hints: it writes the index (not read-only), replaces a changed document's passages
    # (destructive), and reads files from the machine's file system, outside the index (open world).
    server.add_tool(tools.add_paths, name="add_paths", title="Add files to the index",
                    description=tools.add_paths_description(),
                    annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True,
                                                idempotent_hint=True, open_world_hint=True))
    return server


def serve(index: str | Path, *, llm: dict[str, Any] | None = None, max_tokens: int | None = None,
          transport: str = "stdio", host: str = "127.0.0.1", port: int = 8765,
          sock: socket.socket | None = None, hosts: HostRule | None = None,
          allow_add: Sequence[str | Path] = (), key: str | None = None, limits: HttpLimits | None = None) -> None:
    """Open ``index`` and serve its tools until the client leaves (stdio) or the process is
    stopped (HTTP). llm: the generator's spec (`IndexWorker`), default the embedded model.
    allow_add: folders ``add_paths`` may read besides the index's indexed folder.
    HTTP only: ``sock``, a socket bound already (`slimrag.api.listen.bind`; else ``host``:``port``
    is bound here); ``hosts``, the Host and Origin rule (default: ``host`` and loopback); ``key``,
    the Bearer key every request must carry (None: none, allowed on loopback only, ValueError
    otherwise); ``limits``, the body and session bounds (`slimrag.mcp.http`)."""
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
    if transport != "stdio" and (why := needs_key(host, key)) is not None:
        raise ValueError(why)
    worker = IndexWorker(index, llm or {"llm": None},
                         max_tokens if max_tokens is not None else GenerationConfig().max_new_tokens)
    try:
        source_root = worker.call(lambda idx: idx.source_root)
        server = create_server(worker, AddRoots.of([source_root, *allow_add], index=index))
        if transport == "stdio":
            server.run("stdio")
        else:
            from slimrag.api.listen import bind, run

            app = http_app(server, hosts or HostRule(bind=host), key, limits)
            run(app, sock or bind(host, port), host, log_level="warning")
    finally:
        worker.close()
