"""Sentences and the words that matter in them: what evidence and attribution compare.

`split_sentences` cuts a passage into sentences with their character offsets (the web page
highlights by offset). Rules, in order: a blank line, a Markdown heading or list item starts a new
block; inside a block a sentence ends at ``.``, ``!`` or ``?`` (and closing quotes or brackets)
followed by white space and an upper-case letter, a digit, a quote or a bracket, unless the word
before the stop is a known abbreviation (``e.g.``, ``Dr.``, ``U.S.``) or a single letter (an
initial), or a title (``Gen.``, ``Gov.``, capitalised) before a capitalised word that is no stop word (a
name: "Gen. Eisenhower", not "the next gen. It ..."). Decimals (``1.5``) and version numbers never split: no white space follows the stop.
A "sentence" longer than `MAX_WORDS` words (a table or code flattened to one line) is cut into
windows of that many words, so one huge block cannot win on overlap alone.

`content_words` keeps the words that carry meaning: lower-cased, stop words dropped, a light
suffix strip (plural ``s``/``es``, ``ing``, ``ed``, ``ies``/``ied`` for ``y``, a doubled consonant
before ``ing``/``ed`` undoubled) so "defaults" meets "default", "kids" "kid", "starring" "star" and
"stories" "story"; a dropped final g is written back ("Thinkin'" meets "thinking"). `key_terms` are the numbers and names: tokens holding a digit, and capitalised
words that do not start a sentence; they are what an answer must not invent (`slimrag.rag.attribution`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Longest sentence kept whole, in words; longer runs are cut into windows this long.
MAX_WORDS = 60

_BLOCK = re.compile(r"\n\s*\n|\n(?=\s*(?:#{1,6}\s|[-*+]\s|\d+[.)]\s))")
_STOP = re.compile(r"[.!?][\"')\]]*\s+(?=[A-Z0-9\"'(\[`])")
#: Words a full stop abbreviates rather than ends a sentence at: "e.g.", "Dr.".
_ABBREV = frozenset("""e.g i.e etc vs cf mr mrs ms dr prof st no fig approx al jr sr inc ltd co mt""".split())
#: Titles that end no sentence before a name ("The role of Gen. Eisenhower went to ...": cut there, the
#: sentence lost the role it names), and only there: "gen.", "rep.", "pres." are words too ("the next gen. It
#: ships ...", "ten reps. Then rest."), so a title is capitalised and the word after it a capitalised non-stop word.
_TITLES = frozenset("gen col lt sgt capt cmdr adm maj gov sen rep rev hon pres supt".split())
_WORD = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9'_\-.]|,(?=\d{3}))*[A-Za-z0-9]|[A-Za-z0-9]")
STOPWORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being below
between both but by can could did do does doing done down during each either else ever every few for from
further had has have having he her here hers herself him himself his how however i if in into is it its
itself just like may me might more most much must my myself no nor not now of off on once one only or other
ought our ours ourselves out over own per please same shall she should so some such than that the their
theirs them themselves then there these they this those through thus to too under until up upon us use used
using very via was we were what whatever when where whether which while who whom whose why will with within
without would yes yet you your yours yourself yourselves um uh sorry no mean rather actually
""".split())


@dataclass(frozen=True, slots=True)
class Sentence:
    """A sentence of a passage: its text and where it is in the passage (``text[start:end]``)."""

    text: str
    start: int
    end: int


def _abbreviation(block: str, stop: int) -> bool:
    """Whether the full stop at ``stop`` ends an abbreviation or an initial, not a sentence."""
    if block[stop] != ".":
        return False
    word = re.search(r"([A-Za-z.]+) ?$", block[:stop])  # "U.S." and tokenized text's "U . S ."
    if word is None:
        return False
    w = word.group(1).lower().strip(".")
    if w in _TITLES:
        after = re.match(r"\s+([A-Za-z]+)", block[stop + 1:])
        return word.group(1)[0].isupper() and after is not None and after.group(1)[0].isupper() \
            and after.group(1).lower() not in STOPWORDS
    return w in _ABBREV or len(w) == 1 or ("." in w and len(w) <= 5)


def _windows(text: str, start: int) -> list[Sentence]:
    spans = [m.span() for m in re.finditer(r"\S+", text)]
    if len(spans) <= MAX_WORDS:
        return [Sentence(text, start, start + len(text))]
    out = []
    for i in range(0, len(spans), MAX_WORDS):
        a, b = spans[i][0], spans[min(i + MAX_WORDS, len(spans)) - 1][1]
        out.append(Sentence(text[a:b], start + a, start + b))
    return out


def split_sentences(text: str) -> list[Sentence]:
    """The sentences of ``text`` with their offsets, in reading order (module header)."""
    out: list[Sentence] = []
    pos = 0
    for block in [*_BLOCK.split(text)]:
        at = text.find(block, pos)
        pos = at + len(block)
        cut = 0
        for m in _STOP.finditer(block):
            if _abbreviation(block, m.start()):
                continue
            end = m.start() + len(m.group(0).rstrip())
            piece = block[cut:end]
            if piece.strip():
                lead = len(piece) - len(piece.lstrip())
                out += _windows(piece.strip(), at + cut + lead)
            cut = m.end()
        piece = block[cut:]
        if piece.strip():
            lead = len(piece) - len(piece.lstrip())
            out += _windows(piece.strip(), at + cut + lead)
    return out


def stem(word: str) -> str:
    """A light suffix strip so inflections meet (``defaults`` → ``default``, ``Kubo's`` → ``kubo``), and a
    doubled last consonant undoubled (`_undouble`)."""
    w = word.lower()
    if w.endswith(("'s", "’s")):  # a possessive: "Kubo's" meets "Kubo"
        w = w[:-2]
    if len(w) > 5 and w.endswith(("ies", "ied")):  # "stories", "studied" meet "story", "study"
        return w[:-3] + "y"
    for suffix in ("ing", "es", "ed", "s"):
        if len(w) > len(suffix) + 3 and w.endswith(suffix) and not w.endswith("ss"):
            return _undouble(w[: -len(suffix)], word)
    if len(w) == 4 and w.endswith("s") and not w.endswith(("ss", "us", "is")):  # a short plural: "kids", "cats"
        return w[:-1]
    return _undouble(w, word)


#: Consonants whose doubling an inflection adds ("stopped", "starring", "running", "committed"); not
#: f, l, s, z, which base words end doubled ("staff", "call", "pass", "jazz").
_DOUBLED = re.compile(r"(?<=[^aeiouy][aeiou])([bdgmnprt])\1$")


def _undouble(w: str, word: str) -> str:
    """``w`` (``word`` stemmed) with a doubled last consonant of `_DOUBLED` after one vowel after a
    consonant made single, base words and inflections alike ("stopped", "stop"; "butted", "butt" → "but"),
    so they meet; a vowel pair before it ("earring") or a capitalised ``word`` (a name: "Manning",
    "Redding") keeps it. A sentence's capitalised first word ("Starring ...") keeps it too."""
    if len(w) > 3 and not word[:1].isupper() and _DOUBLED.search(w):
        return w[:-1]
    return w


_SPACED_THOUSANDS = re.compile(r"(?<=\d) , (?=\d{3}\b)")


def words(text: str) -> list[str]:
    """The word tokens of ``text`` (letters and digits, with inner ``'-_.``; ``40 , 000``, as
    tokenized text writes ``40,000``, is one number)."""
    return _WORD.findall(_SPACED_THOUSANDS.sub(",", text))


#: Words of conversation, not of content: a sentence made of these ("Sure, I hope this helps!")
#: claims nothing that a passage could back.
CHATTER = frozenset("""sure hope help glad happy question answer passage information provided based context
know think let please thank thanks note great certainly course here""".split())
#: `CHATTER` as `content_words` spells it (stemmed).
CHATTER_STEMS = frozenset(stem(w) for w in CHATTER)


#: A word whose final "g" a song title or speech drops ("Thinkin'", tokenized "Thinkin '"): the "'" is no
#: possessive ("Berlin ' s") and closes no quote still open before it ("he said 'stop thinkin'"; `_open_quote`).
_DROPPED_G = re.compile(r"\b([A-Za-z]{3,}in) ?'(?! ?s\b)")
#: A "'" that opens a quote (after a space, a bracket or the start, before a word: "my 'cousin") and one
#: that may close it (after a word or a stop, before no word: "cousin'"); "don't" and tokenized " ' " are neither.
_QUOTE_OPENS = re.compile(r"(?<![^\s(\[\"])'(?=\w)")
_QUOTE_CLOSES = re.compile(r"(?<=[\w.,!?])'(?!\w)")


def _open_quote(text: str, at: int) -> bool:
    """Whether a quote opened in ``text`` before ``at`` is still open there: each opening "'"
    (`_QUOTE_OPENS`) counts one, each closing one (`_QUOTE_CLOSES`) closes the last one open, so
    "my 'cousin' was thinkin'" has none open at its last "'", and "he said 'stop thinkin'" has one."""
    depth = 0
    for m in re.finditer("'", text[:at]):
        if _QUOTE_OPENS.match(text, m.start()):
            depth += 1
        elif depth and _QUOTE_CLOSES.match(text, m.start()):
            depth -= 1
    return depth > 0


def _restore_g(text: str) -> str:
    """``text`` with each dropped final "g" (`_DROPPED_G`) written back: "Thinkin '" -> "Thinking"; a
    "'" that closes a quote still open (`_open_quote`) is the quote's: "my 'cousin'" keeps its word."""
    return _DROPPED_G.sub(lambda m: m.group(0) if _open_quote(text, m.end() - 1) else m.group(1) + "g", text)


def content_words(text: str) -> set[str]:
    """Stemmed words of ``text`` that are not stop words ("Thinkin'" read as "thinking": `_DROPPED_G`)."""
    text = _restore_g(text) if "'" in text else text
    return {stem(w) for w in words(text) if w.lower().removesuffix("'s") not in STOPWORDS and len(w) > 1
            or w.isdigit()}


def _number(token: str) -> str | None:
    """A digit-holding token in a canonical form (``1,000`` → ``1000``, ``128MB`` kept), else None."""
    if not any(c.isdigit() for c in token):
        return None
    return token.replace(",", "").lower().rstrip(".")


#: Number words: a quantity written out is a number all the same ("two hours" is not "half an hour").
NUMBER_WORDS = frozenset("""zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen
fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred
thousand million billion trillion half quarter dozen first second third fourth fifth tenth""".split())


def key_terms(text: str) -> set[str]:
    """Numbers and names in ``text``, lower-cased: tokens with a digit, number words, and
    capitalised words that are not the first word of a sentence (nor stop words)."""
    out: set[str] = set()
    for s in re.split(r"(?<=[.!?])\s+|\n", text):
        toks = words(s)
        for i, t in enumerate(toks):
            n = _number(t)
            if n is not None:
                out.add(n)
            elif t.lower() in NUMBER_WORDS:
                out.add(t.lower())
            elif i > 0 and t[0].isupper() and t.lower() not in STOPWORDS:
                out.add(t.lower().removesuffix("'s"))  # "Kubo's" names Kubo
    return out
