"""What happened to one input of an add: the fixed set of outcomes, and `Skipped`, the record of a
file passed over.

Every file a build or add meets ends in exactly one outcome, so the report can account for all
of them (``added + updated + unchanged + skipped == files met``). Skips carry one reason from the
fixed set below, a short name a user can grep for and a script can switch on; the human detail
follows it in the message: ``"encoding: not valid UTF-8 (byte 3); convert it to UTF-8 to include
it"``. The kind is the message's prefix, so it survives any transport that keeps only the
message (Ray rows carry the message string), see `kind_of`.

Loud reasons (the file looked like something to read, and was not) give one warning line each;
quiet ones (ignored by the user's own rules, or a type slimrag does not read) are counted and
listed with ``--verbose`` only, so indexing ``/usr/share/doc`` does not print thousands of lines
about images.

An ignored or unreadable *folder* counts once, under its name with a trailing ``/``: its
contents are not walked (walking ``.git`` or ``node_modules`` just to count them would cost more
than the build).
"""

from __future__ import annotations

from dataclasses import dataclass

from slimrag.errors import IngestError

#: outcomes of a document that was read
ADDED, UPDATED, UNCHANGED = "added", "updated", "unchanged"

#: skip reasons (the fixed set; each message starts with one of them)
UNSUPPORTED = "unsupported type"  #: no reader for the suffix, and the content does not look like text
BINARY = "binary"  #: a text type whose content holds NUL bytes
ENCODING = "encoding"  #: not valid UTF-8 nor in a declared charset; also a file name that is not UTF-8
TOO_LARGE = "too large"  #: over ``IndexConfig.max_file_bytes`` (on disk, or decompressed for .gz)
IGNORED = "ignored"  #: hidden, or matched by .gitignore / .slimragignore / ``ignore`` patterns
OUTSIDE = "symlink outside the folder"  #: a link whose target is outside the indexed folder
UNREADABLE = "unreadable"  #: permission denied, a symlink loop, a FIFO or device, a path too long
PARSE_ERROR = "parse error"  #: the reader failed: corrupt PDF, invalid JSON, nesting too deep
EMPTY = "no text"  #: read fine, but nothing to index (an empty file, a PDF of scanned images)
NOT_PROSE = "not prose"  #: text for machines in a folder of prose: stylesheets, SVG, source maps, lock files

SKIP_REASONS = (UNSUPPORTED, BINARY, ENCODING, TOO_LARGE, IGNORED, NOT_PROSE, OUTSIDE, UNREADABLE, PARSE_ERROR,
                EMPTY)
#: reasons counted and listed, but not worth a warning line each
QUIET = frozenset({IGNORED, UNSUPPORTED, NOT_PROSE})


def kind_of(reason: str) -> str:
    """The skip reason a message starts with; `PARSE_ERROR` for a message of unknown form."""
    for kind in SKIP_REASONS:
        if reason == kind or reason.startswith(kind + ": "):
            return kind
    return PARSE_ERROR


def counted(n: int, noun: str, grouping: str = "") -> str:
    """``n`` and the noun, plural unless ``n`` is 1: ``1 chunk``, ``0 chunks``, ``2 documents``;
    ``grouping=","`` writes ``20,582 chunks``. For the counts of reports and summaries."""
    return f"{n:{grouping}} {noun if n == 1 else noun + 's'}"


def message(kind: str, detail: str = "") -> str:
    """The one-line skip message: the reason, then the detail when there is one."""
    if kind not in SKIP_REASONS:
        raise ValueError(f"unknown skip reason {kind!r}; use one of {SKIP_REASONS}")
    return f"{kind}: {detail}" if detail else kind


@dataclass
class Skipped:
    """A file that was not read, and why (shown to the user as one line).

    source: the stored name (or, for a name that is not UTF-8, its bytes escaped as ``\\xff``).
    reason: the message, starting with one of `SKIP_REASONS`. kind: that reason; derived from the
    message when not given, so older callers that pass only a message still count right."""

    source: str
    reason: str
    kind: str = ""

    def __post_init__(self) -> None:
        if not self.kind:
            self.kind = kind_of(self.reason)

    @classmethod
    def because(cls, source: str, kind: str, detail: str = "") -> Skipped:
        """A skip with a reason from the fixed set and an optional detail."""
        return cls(source, message(kind, detail), kind)

    @property
    def quiet(self) -> bool:
        """True for reasons that are counted but not warned about (see `QUIET`)."""
        return self.kind in QUIET


class SkipFile(IngestError):
    """A reader's refusal of one file, with its skip reason (`kind`); the message is the full
    skip message, so ``str(e)`` is what the user reads."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(message(kind, detail))
        self.kind, self.detail = kind, detail
