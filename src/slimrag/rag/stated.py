"""What a passage states as so, and what it only mentions: a value as of a version that a later note
restates, a value an example sets. Either backs a sentence word for word and is not the value asked.

Version notes (`current`).
Reference docs keep their history beside the present: under ``pickle.DEFAULT_PROTOCOL`` the Python docs
say "Currently the default protocol is 4", then "Changed in version 3.0: The default protocol is 3."
and "Changed in version 3.8: The default protocol is 4.". A sentence copied from the 3.0 note is backed,
word for word, and is no longer so: the HTML folder set's free answer "The default pickle protocol is 3."
was presented as backed (issue 29). `current` tells the verdict (`slimrag.rag.verdict`) whether some
sentence backing an answer sentence still holds. Two forms of a note are read: a built HTML page's text
("Changed in version 3.0: ...", "New in version ...") and reStructuredText's directive on the line
before the note's body (".. versionchanged:: 3.8"). A later note counts when it holds every content
word of the earlier one but its numbers (`superseded`); a note no later note restates still holds
("Changed in version 1.5: The default block size is 512." alone).

Examples (`only_set`). A default is not a value an example sets: "The default precision of the decimal
module is 9." was backed by the doctest ``>>> decimal.getcontext().prec = 9``, where the sentence before
says the example changes it (the default is 28). `without_set` reads a passage less what its examples
set; a keyword argument in a signature (``lru_cache(maxsize=128)``) does state its default.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from slimrag.rag.sentences import content_words, key_terms, split_sentences
from slimrag.types import Evidence, Hit, Support

#: A version note of reference docs, as built HTML writes it ("Changed in version 3.0: The default
#: protocol is 3.") and as reStructuredText's line before its body does (".. versionchanged:: 3.8").
_NOTE_INLINE = re.compile(r"^\W*(?:Changed|New) in version (\d+(?:\.\d+)*)\s*:")
_NOTE_LINE = re.compile(r"\.\.\s+version(?:changed|added)::\s*(\d+(?:\.\d+)*)\s*$")


def version_of(e: Evidence, hits: Sequence[Hit]) -> tuple[int, ...] | None:
    """The version of the note ``e`` stands in (`_NOTE_INLINE`, `_NOTE_LINE`: the line before it in its
    passage of ``hits``), None when it stands in none."""
    m = _NOTE_INLINE.match(e.text)
    if m is None:
        passage = next((h.text for h in hits if h.label == e.label), "")
        before = passage[:e.start].rstrip().rsplit("\n", 1)[-1]
        m = _NOTE_LINE.search(before)
    return None if m is None else tuple(int(x) for x in m.group(1).split("."))


def superseded(e: Evidence, hits: Sequence[Hit]) -> bool:
    """Whether ``e`` states a value as of a version (`version_of`) that a later note of the passages
    restates: "Changed in version 3.0: The default protocol is 3." under "Changed in version 3.8: The
    default protocol is 4." is no longer so. A later note counts when it holds every word of ``e``'s
    but its numbers."""
    version = version_of(e, hits)
    if version is None:
        return False
    claim = {w for w in content_words(_NOTE_INLINE.sub("", e.text)) if not any(c.isdigit() for c in w)}
    if not claim:
        return False
    for h in hits:
        for x in split_sentences(h.text):
            later = version_of(Evidence(x.text, h.label, h.chunk_id, x.start, x.end, 0.0), hits)
            if later is not None and later > version and claim <= content_words(_NOTE_INLINE.sub("", x.text)):
                return True
    return False


def current(s: Support, hits: Sequence[Hit] = ()) -> bool:
    """Whether some sentence backing ``s`` still holds: not every one is a version note that a later
    note of ``hits`` restates (`superseded`). "The default pickle protocol is 3." is backed by
    "Changed in version 3.0: The default protocol is 3.", which the 3.8 note after it undoes. True for a
    sentence with no backing sentence."""
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
