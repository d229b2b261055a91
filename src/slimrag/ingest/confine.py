"""`AddRoots`: which files a *client* may make slimrag read, whatever path it sends.

Why it exists
    A server that indexes paths sent by its callers (the MCP tool ``add_paths``) reads them as the
    user who started it. Without a rule, a caller that cannot read ``~/.ssh/id_rsa`` could ask
    the server to index it and then read it back with ``search``; over stdio, a document the
    agent reads can ask the agent to do the same. So a path from a client is accepted only when
    its real location lies inside a root the *person who started the server* chose: by default
    the index's own indexed folder (``Manifest.source_root``), plus each ``--allow-add PATH``.

The rule (`AddRoots.check`), in order, for one path
    1. ``~`` is expanded (the server user's home; the result is checked like any other path);
       a relative path is taken relative to the first root (the indexed folder: a stored source
       name such as ``guide/new.md`` means the file of that name there), never the server's
       working folder, which the client cannot see;
    2. the path is resolved with ``os.path.realpath``: every symlink and ``..`` is followed, so
       what is checked is the file that would be read, not the name it was reached by;
    3. it must be a root or lie below one (roots are realpath'd too, when `AddRoots` is built);
       the index's own folder is refused even when a root holds it (its files are not documents);
    4. no component below the root may start with ``.``: hidden files and folders (``.ssh``,
       ``.git``, ``.env``) are never read, even named directly (a walked folder skips them
       already, `slimrag.ingest.crawl`);
    5. only then is existence checked, so a refused path says nothing of whether it exists.

    A refusal is an `AddRefused` (a `RequestError`, so an HTTP server answers it with 400) whose
    message names the roots and the flag that widens them.

Folders (`AddRoots.files`)
    A folder that passes is walked by `slimrag.ingest.crawl`, which never leaves its walk root (a
    symlink that points outside it is skipped as ``symlink outside the folder``; a symlinked folder
    is not descended into) and skips hidden entries. But the crawl lets a visible link reach a
    hidden file inside the walk root (``notes.md -> .env``), so every file it finds is checked
    again by the rule above, by its real path, and one that fails is skipped (``ignored``: a
    link to a hidden file; ``symlink outside the folder``), never read. The files are then
    handed to the index by their real paths, each named directly.

Limits (what this does not stop)
    The check is made when the path arrives, and the file is opened a moment later: someone who
    can *write* inside a root can swap a checked path for a symlink in between. A hard link inside
    a root to a file elsewhere is, by every path test, inside the root. Both need write access to
    the root, which the roots' owner grants; confinement is against callers, not against the
    folder's owner.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from slimrag.errors import RequestError
from slimrag.ingest.crawl import crawl
from slimrag.ingest.outcome import IGNORED, OUTSIDE, Skipped

__all__ = ["AddRefused", "AddRoots"]


class AddRefused(RequestError):
    """A path from a client lies outside the allowed roots, or is hidden; the message says which
    roots are allowed and how the person starting the server can widen them."""


def _real(path: str | Path) -> Path:
    return Path(os.path.realpath(os.path.expanduser(os.fspath(path))))


@dataclass(frozen=True, slots=True)
class AddRoots:
    """The folders a client may add files from (see the module header).

    roots: allowed folders, realpath'd and de-duplicated in order (the first is where relative
    paths start; an empty tuple refuses every path). index: the index's own folder, refused
    inside any root (None: no such folder). flag: how the person starting the server adds a
    root, named in refusals (``--allow-add PATH`` for ``slimrag mcp``).
    """

    roots: tuple[Path, ...]
    index: Path | None = None
    flag: str = "--allow-add PATH"

    @classmethod
    def of(cls, roots: Iterable[str | Path | None], index: str | Path | None = None,
           flag: str = "--allow-add PATH") -> AddRoots:
        """`AddRoots` from paths as given (None entries, e.g. an index without an indexed folder,
        are dropped); each is realpath'd now, so a root that is a symlink means its target."""
        real: list[Path] = []
        for root in roots:
            if root is not None and (p := _real(root)) not in real:
                real.append(p)
        return cls(tuple(real), _real(index) if index is not None else None, flag)

    def describe(self) -> str:
        """The roots as a sentence fragment, for tool descriptions and messages."""
        return ", ".join(str(r) for r in self.roots) if self.roots else "no folder"

    def _refuse(self, given: str, why: str) -> AddRefused:
        return AddRefused(f"{given!r} {why}; this server adds files only from {self.describe()} (hidden files "
                          f"and folders excluded). To allow another folder, restart the server with {self.flag}")

    def _why_not(self, real: Path) -> tuple[str, str] | None:
        """Why ``real`` (a real path) may not be read, as (the skip kind a crawl would give, a
        reason); None when it may."""
        root = next((r for r in self.roots if real == r or real.is_relative_to(r)), None)
        if root is None:
            return OUTSIDE, f"is outside the allowed folders (it is {real})"
        if self.index is not None and (real == self.index or real.is_relative_to(self.index)):
            return IGNORED, "is inside the index's own folder, which holds no documents"
        hidden = next((part for part in real.relative_to(root).parts if part.startswith(".")), None)
        if hidden is not None:
            return IGNORED, f"is or lies in a hidden file or folder ({hidden!r})"
        return None

    def check(self, path: str | Path) -> Path:
        """The real path a client's ``path`` means, when it may be read; `AddRefused` otherwise
        (a missing path inside a root too, saying so: callers need one exception to catch)."""
        given = os.fspath(path)
        if not self.roots:
            raise self._refuse(given, "cannot be added: no folder is open to additions")
        if not given.strip() or "\x00" in given:
            raise self._refuse(given, "is not a path")
        raw = os.path.expanduser(given)
        if not os.path.isabs(raw):
            raw = os.path.join(self.roots[0], raw)
        real = Path(os.path.realpath(raw))
        if (bad := self._why_not(real)) is not None:
            raise self._refuse(given, bad[1])
        if not real.exists():
            raise AddRefused(f"{given!r}: no such file or folder (looked for {real}); give a path inside "
                             f"{self.describe()}, absolute or relative to {self.roots[0]}")
        return real

    def check_all(self, paths: Iterable[str | Path]) -> list[Path]:
        """`check` for each path; the first refusal is raised, naming every refused path when
        several are, so a caller fixes them in one go."""
        out: list[Path] = []
        refused: list[str] = []
        for p in paths:
            try:
                out.append(self.check(p))
            except AddRefused as exc:
                refused.append(str(exc))
        if refused:
            raise AddRefused(refused[0] if len(refused) == 1 else
                             f"{len(refused)} paths refused: " + " | ".join(refused))
        return out

    def files(self, paths: Iterable[str | Path], ignore: tuple[str, ...], max_bytes: int,
              skipped: list[Skipped]) -> list[Path]:
        """The real paths of the files a client's ``paths`` may add: each checked (`check_all`:
        one refused path refuses the call), folders walked by the crawl rules (``ignore``,
        ``max_bytes``: the index's), and every file found checked again by its real path (see
        the module header). Entries passed over are appended to ``skipped`` with their reason."""
        out: list[Path] = []
        for real in self.check_all(paths):
            if not real.is_dir():
                out.append(real)
                continue
            for found in crawl(real, ignore=ignore, max_bytes=max_bytes, skipped=skipped):
                target = Path(os.path.realpath(found.path))
                bad = self._why_not(target)
                if bad is None:
                    out.append(target)
                    continue
                skipped.append(Skipped.because(found.source, bad[0], f"a link to {target}, which {bad[1]}"))
        return out
