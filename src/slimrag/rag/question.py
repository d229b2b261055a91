"""The question's reading: what a question asks for, read once, in one place.

Why a module of its own: evidence ranks a passage sentence higher when it holds the kind of value asked
(the "answer" feature, `slimrag.rag.evidence`), grounded decoding frees the model's words for a question
asking a way (`slimrag.rag.grounded`), and the verdict's rules read the kind asked, the way's verb, the
code asked for and the qualifiers (`slimrag.rag.verdict`). Spread over those three, one reading was read
two ways: "asks a way" was `_HOW_TO` alone for the verdict and `_HOW_TO` or a bare "How to ...?" for
decoding. Here each reading has one regex and one name, and `Question.read` reads a question once for
every rule that asks about it (the verdict judges each answer sentence against the same reading).

What is read
    ============ ===================================================================================
    kind         `answer_type`: "when" (a date or a period: `has_type`), "number" (how many, how long,
                 what percent), "name" (who, where, which), or None; a spoken question that takes back
                 its start ("Where did he um no rather when did he ...") is typed by what follows the
                 last taking back
    person       "who", "whom", "whose", "where": a name there is a person's or a place's, never a number
    way          a question for a way: "How do I <verb> ...?", "How can you ...", "How to ...?", "How
                 does one ...?" (`_HOW_TO`, `asks_a_way`); ``way_verb`` is its verb unless a light one
                 (`light`: "make", "get")
    code_verb    "Which function <verb>s ...?" (`_WHICH_CODE`): the verb the code must be documented
                 doing, stemmed, unless light; ``code_kind``: the kind of code asked ("function", "flag")
    qualifiers   `QUALIFIERS` asked ("default", "oldest", "maximum"; "first"/"last" only after a
                 determiner: "the first version", not "does the battery last")
    code         the code it names (`slimrag.rag.code.identifiers`), which an answer naming it again
                 does not answer
    counts       what "how many <x>" or "how much <x>" counts, stemmed (`_COUNTS`: "spaces"), None for
                 other questions: a number inside a name counts it only when <x> follows the number
    dated        it asks a date ("when") or a version (`_VERSION`): a version note answers it even
                 where a later note changed the value
    ============ ===================================================================================

A bare "How to parse ...?" asks a way as "How do I parse ...?" does, for decoding and for the verdict
alike. Reading it so moved no verdict of the recorded runs (no recorded question is bare); on twins of
their 18 how-to questions rewritten bare ("How to copy an entire directory tree?"), the verdict's old
reading (`_HOW_TO` without the bare form) gave 2 of 90 twin answers another verdict than their
originals, one wrong answer presented as backed among them; this reading gives the originals' verdicts
(docs/benchmarks.md, "The question's reading").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from slimrag.rag.code import identifiers
from slimrag.rag.sentences import NUMBER_WORDS, STOPWORDS, content_words, key_terms, stem, words

# -- the kind of value asked (evidence's "answer" feature, the verdict's typed answers) -------------------

_YEAR = re.compile(r"\b(1[0-9]{3}|20[0-9]{2})s?\b|\b\d{1,2}(st|nd|rd|th)\b|century|centuries", re.I)
_MONTH = re.compile(r"\b(january|february|march|april|may|june|july|august|september|october|november|"
                    r"december|spring|summer|autumn|winter)\b", re.I)
#: A "when" answer that names a period rather than a date ("during the Roman Empire", "During World War II",
#: "during the reign of Augustus": a named ruler's reign is a period); "during construction" names none.
_PERIOD = re.compile(r"\b[Dd]uring (?:the )?(?:(?:reign|rule|time|era|age) of )?[A-Z]")
_NUMBER = re.compile(r"\d|\b(one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|twenty|thirty|"
                     r"forty|fifty|hundred|thousand|million|billion|dozen|half)\b", re.I)
#: "when" asks for a time where a verb of the question follows it ("when did", "when is"), it ends the
#: question ("... is held when ?") or it opens the question with no clause of its own after it (`_WHEN_OPENS`:
#: "When exactly did the Berlin Wall fall?"); elsewhere it is a conjunction ("Which argparse action stores
#: True when a flag is given?" asks for a name; "What can happen when breathing ...", for no kind).
_WHEN = re.compile(r"\bwhen(\s+|')(did|does|do|was|were|is|are|will|would|can|could|should|has|have|had|"
                   r"must|might|s)\b|\bwhen\s*\?|\bwhat (year|date|day|month|century|decade|time)\b|"
                   r"\bwhich (year|century)\b", re.I)
#: A question that opens with "when" and whose "when" is a conjunction: a comma clause ("When I add files,
#: what ...") or another question word ("When forces are at right angles ... what can they ...") follows.
_WHEN_OPENS = re.compile(r"^\W*when\b(?![^?]*(,|\b(what|who|whom|whose|which|where|how|why)\b))", re.I)
_HOW_MANY = re.compile(r"\bhow (many|much|long|old|far|big|large|high|tall|often|fast)\b|\bwhat (percent|"
                       r"percentage|number|amount|size|value)\b", re.I)
_WHO = re.compile(r"\b(who|whom|whose|where|which)\b", re.I)

#: Words with which a spoken question takes back what it began ("Where did Kublai um oh no rather when
#: did he ..."): a take-back only where a question word follows it, fillers aside (`_ASKS_AGAIN`), so
#: "How many people have no access ..." keeps its "how many".
_TAKE_BACK = r"no|sorry|rather|i mean|make that|wait|actually|instead|um+|uh|er|oops"
_RETRACT = re.compile(rf"\b({_TAKE_BACK})\b", re.I)
_ASKS_AGAIN = re.compile(rf"(?:\s|,|\b(?:{_TAKE_BACK}|oh|shoot|like)\b)*"
                         r"\b(when|what|who|whom|whose|which|where|how|why)\b", re.I)

#: Questions whose "name" is a person's or a place's: a number never answers them.
_PERSON = re.compile(r"\b(who|whom|whose|where)\b", re.I)

# -- a way, and code that does something ----------------------------------------------------------------

#: "How do I <verb> ...?", "How to <verb> ...?", "How does one ...?": a way to do something, which an
#: answer states by the verb or by code it names; an adverb before the verb ("How do I quickly sort
#: ...?") is skipped, but not a verb that ends in "ly" ("How can I multiply ...?").
_HOW_TO = re.compile(r"^\W*how (?:(?:do|can|should|would|could) (?:i|you|we|one)|to|does one) "
                     r"(?:(?!(?:apply|multiply|supply|reply|rely|comply|imply|fly|ally|tally|rally)\b)\w+ly )?(\w+)",
                     re.I)

#: "Which function returns ...?": the verb after a kind of code is what the code must be documented doing.
#: A question that counts something, and what: "How many spaces ...?", "How much indentation ...?".
_COUNTS = re.compile(r"\bhow (?:many|much) (\w+)", re.I)
#: A question that asks for a version ("In which version did ...?").
_VERSION = re.compile(r"\bversions?\b", re.I)

_WHICH_CODE = re.compile(r"\bwhich (?:[\w.-]+ ){0,2}?(function|method|class|module|exception|attribute|"
                         r"decorator|parameter|argument|flag|option|action|constant|variable)s? (\w+)", re.I)

#: Verbs that say little of an action: a question's "how do I make ...", "which flag makes ..." asks
#: for no verb the answer must repeat (`light`; "do", "does", "has", "have", "use" are stop words already).
_LIGHT_VERBS = frozenset("make makes get gets give gives let lets uses take takes".split())

# -- qualifiers -----------------------------------------------------------------------------------------

#: Words that qualify what a question asks for (the default value, the oldest event), each with the words
#: that say the same, as `stem` writes them: the sentence backing an answer must hold one of them.
QUALIFIERS = (frozenset({"default"}), frozenset({"oldest", "earliest", "first"}),
              frozenset({"latest", "newest", "last"}), frozenset({"maximum", "max", "largest", "highest"}),
              frozenset({"minimum", "min", "smallest", "lowest"}))

#: Qualifiers that are also a verb ("How long does the battery last?") or an adverb of a comparison
#: ("Which was released first, Django or Flask?"): they qualify only after a determiner ("the first
#: version", "its last release"; `asked_qualifiers`).
_ORDINALS = frozenset({"first", "last"})
_DETERMINERS = frozenset("the its their his her your my our".split())


def answer_type(question: str) -> str | None:
    """What kind of value the question asks for: "when", "number", "name", or None. A question that
    takes back its start is typed by what follows its last taking back (`_RETRACT`, `_ASKS_AGAIN`), when
    that names a kind."""
    tails = [question[m.end():] for m in _RETRACT.finditer(question)]
    asked_again = [t for t in tails if _ASKS_AGAIN.match(t)]
    if asked_again:
        kind = _kind(asked_again[-1].lstrip(" ,"))
        if kind is not None:
            return kind
    return _kind(question)


def _kind(question: str) -> str | None:
    if _WHEN.search(question) or _WHEN_OPENS.match(question):
        return "when"
    if _HOW_MANY.search(question):
        return "number"
    if _WHO.search(question):
        return "name"
    return None


def has_type(kind: str | None, sentence: str, q_terms: set[str] | frozenset[str]) -> float:
    """1.0 when ``sentence`` holds a value of the ``kind`` a question asks for (`answer_type`) that
    ``q_terms`` (the question's numbers and names) does not already state, else 0.0. A "when" is
    answered by a year, a month or a season, or a period (`_PERIOD`: "during the reign of Augustus")."""
    if kind is None:
        return 0.0
    if kind == "when":
        return float(bool(_YEAR.search(sentence) or _MONTH.search(sentence) or _PERIOD.search(sentence)))
    new = key_terms(sentence) - q_terms
    if kind == "number":
        return float(any(any(c.isdigit() for c in t) for t in new) or bool(_NUMBER.search(sentence) and new))
    return float(any(not any(c.isdigit() for c in t) and t not in NUMBER_WORDS for t in new))  # "first" is no name


def asks_a_way(question: str) -> bool:
    """Whether ``question`` asks how to do something ("How do I parse ...?", "How can I ...?", "How
    to parse ...?", "How does one ...?"). "How do you say hello in French?" reads as one too."""
    return _HOW_TO.search(question) is not None


def light(verb: str) -> bool:
    """Whether ``verb`` says little of an action ("makes", "does", "use"; `_LIGHT_VERBS`, stop words)."""
    return verb.lower() in _LIGHT_VERBS or verb.lower() in STOPWORDS


def asked_qualifiers(question: str) -> tuple[frozenset[str], ...]:
    """The `QUALIFIERS` groups ``question`` asks for, its words compared by stem ("defaults"); "first"
    and "last" only after a determiner (`_ORDINALS`): "the first version", not "does the battery last"."""
    toks = [w.lower() for w in words(question)]
    said = {stem(w) for i, w in enumerate(toks) if w not in _ORDINALS or (i and toks[i - 1] in _DETERMINERS)}
    return tuple(group for group in QUALIFIERS if group & said)


@dataclass(frozen=True, slots=True)
class Question:
    """A question read once (module header): its text and every reading the checks of its answer ask for."""

    text: str
    #: its content words (`content_words`) and its numbers and names (`key_terms`)
    words: frozenset[str]
    terms: frozenset[str]
    #: every word it says, lower-cased: a lower-case question still names its names ("mrs wolowitz")
    said: frozenset[str]
    #: `answer_type`
    kind: str | None
    #: it asks who, whom, whose or where (`_PERSON`)
    person: bool
    #: it asks a way (`_HOW_TO`); ``way_verb``: the verb asked, stemmed, None when light (`light`) or no
    #: way is asked
    way: bool
    way_verb: str | None
    #: the stemmed verb a "which function <verb>s ...?" question asks the code to do (`_WHICH_CODE`),
    #: None when light or not such a question
    code_verb: str | None
    #: the kind of code a "which <kind> ...?" question asks for ("function", "flag": `_WHICH_CODE`), the
    #: verb light or not; None for other questions
    code_kind: str | None
    #: `asked_qualifiers`
    qualifiers: tuple[frozenset[str], ...]
    #: the code it names, lower-cased (`slimrag.rag.code.identifiers`): no answer to it ("Which function
    #: does `json.loads` call?" is not answered by ``json.loads``)
    code: frozenset[str]
    #: what a how-many or how-much question counts, stemmed (`_COUNTS`); None for other questions
    counts: str | None
    #: it asks a date or a version (`_VERSION`)
    dated: bool

    @classmethod
    def read(cls, question: str | Question) -> Question:
        """``question`` read (a `Question` is returned as it is)."""
        if isinstance(question, Question):
            return question
        way = _HOW_TO.search(question)
        code = _WHICH_CODE.search(question)
        kind = answer_type(question)
        counts = _COUNTS.search(question) if kind == "number" else None
        return cls(
            text=question,
            words=frozenset(content_words(question)),
            terms=frozenset(key_terms(question)),
            said=frozenset(w.lower() for w in words(question)),
            kind=kind,
            person=_PERSON.search(question) is not None,
            way=way is not None,
            way_verb=stem(way.group(1)) if way is not None and not light(way.group(1)) else None,
            code_verb=stem(code.group(2)) if code is not None and not light(code.group(2)) else None,
            code_kind=code.group(1).lower() if code is not None else None,
            qualifiers=asked_qualifiers(question),
            code=frozenset(i.lower() for i in identifiers(question)),
            counts=stem(counts.group(1).lower()) if counts is not None else None,
            dated=kind == "when" or _VERSION.search(question) is not None,
        )
