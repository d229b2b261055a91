"""What a passage states as so, and what it only mentions: a value as of a version that a later note
restates, a value an example sets. Either backs a sentence word for word and is not the value asked.

Version notes (`current`).
Reference docs keep their history beside the present: under ``pickle.DEFAULT_PROTOCOL`` the Python docs
say "Currently the default protocol is 4", then "Changed in version 3.0: The default protocol is 3."
and "Changed in version 3.8: The default protocol is 4.". A sentence copied from the 3.0 note is backed,
word for word, and is no longer so: the HTML folder set's free answer "The default pickle protocol is 3."
was presented as backed (issue 29). `current` tells the verdict (`slimrag.rag.verdict`) whether some
sentence backing an answer sentence still holds. Both forms of a Sphinx note are read: a built HTML
page's paragraph that opens "Changed in version 3.0:" (every sentence of it), and reStructuredText's
directive (".. versionchanged:: 3.8"), its body on the same line, on the next or after a blank line,
every sentence indented under it (`version_of`). A note is no longer so when a later note after it, on
the same documented object, restates its words with another number (`superseded`); a note no later
note restates still holds ("Changed in version 1.5: The default block size is 512." alone), and so
does one that states no number or fewer than two words ("Accepts a path-like object.", which other
objects' notes repeat).

Examples (`only_set`). A default is not a value an example sets: "The default precision of the decimal
module is 9." was backed by the doctest ``>>> decimal.getcontext().prec = 9``, where the sentence before
says the example changes it (the default is 28). `without_set` reads a passage less what its examples
set; a keyword argument in a signature (``lru_cache(maxsize=128)``) does state its default.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from slimrag.rag.sentences import content_words, key_terms, split_sentences
from slimrag.rag.signatures import signature_of
from slimrag.types import Evidence, Hit, Support

#: A version note as a built HTML page writes it, opening its paragraph ("Changed in version 3.0: The
#: default protocol is 3.", "Added in version ...", "Deprecated since version 3.3, will be ...: ...").
_NOTE_HTML = re.compile(r"\W*(?:(?:Changed|New|Added) in|Deprecated since) version (\d+(?:\.\d+)*)\b[^:\n]*:")
#: A reStructuredText version note's directive (".. versionchanged:: 3.8"), its body on the same line,
#: on the next one or after a blank line, indented under it.
_NOTE_RST = re.compile(r"[ \t]*\.\.[ \t]+(?:versionchanged|versionadded|deprecated)::[ \t]*(\d+(?:\.\d+)*)")
#: A bare number ("is 3."), not one inside a name ("HAS_TLSv1_3", "utf-8") nor a version ("3.8").
_NUMERAL = re.compile(r"(?<![\w.-])\d+(?![\w-]|\.\d)")


def version_of(text: str, start: int) -> tuple[int, ...] | None:
    """The version of the note the sentence at offset ``start`` of passage ``text`` belongs to, None
    when it belongs to none: the note's directive opens the sentence (its body on the same or the
    next line) or is the nearest line above it indented less (reStructuredText, `_NOTE_RST`), or
    the sentence's paragraph opens with a note (a built HTML page, `_NOTE_HTML`)."""
    m = _NOTE_RST.match(text, start)
    if m is None:
        line_start, line_end = text.rfind("\n", 0, start) + 1, text.find("\n", start)
        indent = _indent(text[line_start:line_end if line_end >= 0 else len(text)])
        lines = text[:line_start].splitlines()
        for i in range(len(lines) - 1, -1, -1):
            if lines[i].strip() and _indent(lines[i]) < indent:
                body = next((_indent(x) for x in lines[i + 1:] if x.strip()), indent)
                # the body's own indentation, not the directive's: a chunk cut mid-line loses the
                # directive's, and text indented less than the body is not the note's
                m = _NOTE_RST.match(lines[i]) if indent >= body else None
                break
    if m is None:
        paragraph = text.rfind("\n\n", 0, start)
        m = _NOTE_HTML.match(text, paragraph + 2 if paragraph >= 0 else 0)
    return None if m is None else tuple(int(x) for x in m.group(1).split("."))


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _claim(sentence: str) -> str:
    """``sentence`` less the note's opening ("Changed in version 3.0:", ".. versionchanged:: 3.0")."""
    m = _NOTE_HTML.match(sentence) or _NOTE_RST.match(sentence)
    return sentence[m.end():] if m else sentence


def superseded(e: Evidence, hits: Sequence[Hit]) -> bool:
    """Whether ``e`` states a number as of a version (`version_of`) that a later note after it in its
    passage of ``hits``, on the same documented object (`slimrag.rag.signatures.signature_of`),
    restates with another number: "Changed in version 3.0: The default protocol is 3." under
    "Changed in version 3.8: The default protocol is 4." is no longer so. The later note holds every
    content word of ``e``'s but its numbers, and ``e`` at least two: "Accepts a path-like object."
    is restated by no other object's later note, and "Added." by none."""
    h = e.passage(hits)
    if h is None or (version := version_of(h.text, e.start)) is None:
        return False
    claim = _claim(e.text)
    words = {w for w in content_words(claim) if not any(c.isdigit() for c in w)}
    numbers = set(_NUMERAL.findall(claim))
    if len(words) < 2 or not numbers:
        return False
    documents = signature_of(h.text, e.start, h.source)
    for x in split_sentences(h.text):  # the cheap tests first: dating a sentence reads the lines above it
        if x.start <= e.start:
            continue
        said = _claim(x.text)
        restated = set(_NUMERAL.findall(said))
        if (restated and restated != numbers and words <= content_words(said)
                and (later := version_of(h.text, x.start)) is not None and later > version
                and signature_of(h.text, x.start, h.source) == documents):
            return True
    return False


def current(s: Support, hits: Sequence[Hit] = ()) -> bool:
    """Whether some sentence backing ``s`` still holds: not every one is a version note that a later
    note of ``hits`` restates (`superseded`). "The default pickle protocol is 3." is backed by
    "Changed in version 3.0: The default protocol is 3.", which the 3.8 note after it undoes. True for a
    sentence with no backing sentence. The verdict does not ask it of a question for a version or a
    date: "In which version did the default protocol become 3?" is what the 3.0 note answers."""
    return not s.evidence or not all(superseded(e, hits) for e in s.evidence)


#: An operator that holds "=" without setting anything: a comparison.
_COMPARES = re.compile(r"[=!<>]=|=[=>]")


def without_set(text: str) -> str:
    """``text`` less what its examples set: from a doctest statement that sets something (``>>>
    decimal.getcontext().prec = 9``: an "=" outside brackets, not a comparison) to the end of its
    example (a blank line), the value set and what the example prints once it is set. Prose, a
    signature's keyword argument (``lru_cache(maxsize=128)``) and a configuration file state values."""
    out: list[str] = []
    cut = False
    for line in text.splitlines():
        if not line.strip():
            cut = False
        elif cut:
            continue
        code = line.lstrip()
        if code.startswith(">>>"):
            depth = 0
            for i, c in enumerate(code):
                depth += (c in "([{") - (c in ")]}")
                if c == "=" and depth == 0 and not _COMPARES.search(code, max(i - 1, 0), i + 2):
                    line, cut = code[:i], True
                    break
        out.append(line)
    return "\n".join(out)


def only_set(s: Support) -> bool:
    """Whether each number ``s``'s sentence states is held by the sentences backing it only as a value
    an example sets, or shows once set (`without_set`): for a "default" question that is a value someone chose, not the
    default. "The default precision of the decimal module is 9." is backed by the example
    ``>>> decimal.getcontext().prec = 9``, which changes the default of 28."""
    numbers = {t for t in key_terms(s.sentence) if any(c.isdigit() for c in t)}
    if not numbers or not s.evidence:
        return False
    return not any(numbers & key_terms(without_set(e.text)) for e in s.evidence)
