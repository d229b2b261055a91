"""The verdict: what the check of an answer lets the reader see.

Attribution (`slimrag.rag.attribution`) says, sentence by sentence, whether a passage backs an
answer. The verdict turns that into what is presented (issue 29, "every answer is checked before
it is presented"):

=============== ========================================================================================
``supported``   every claiming sentence is backed, and at least one of them answers the question: the
                answer is shown, each sentence cited
``partial``     at least one backed sentence answers the question, others are not backed: the answer
                is shown, each unbacked sentence marked where it stands (`UNSUPPORTED_MARK`)
``not_backed``  no backed sentence answers the question (all unbacked, or nothing claimed, or only the
                question restated): the model's text is not the answer; `NOT_BACKED` (`OFF_QUESTION`
                when every sentence is backed) and the passages' best sentences, cited, are shown
=============== ========================================================================================

A backed sentence *answers* the question (`answers`) when it states something the question does not
(a content word or a number or name the question lacks, conversation words such as "answer" and
"question" aside; a question asked back answers nothing) and, for a question that asks for a kind of
value (when, how many: `slimrag.rag.question.answer_type`, `TYPED`), holds a value of that kind that the
question does not already state (a lower-case question still names its names: "Mrs. Wolowitz" and "The
Big Bang Theory" are no new name for "who played mrs wolowitz on the big bang theory?"); for "which" and "what" a name may be code the question does not name
(`getrecursionlimit` for "which function returns the current recursion limit?") or a number ("which
port ...": 8000), for "who" and "where" code only; a number word ("two", "first") is no name. A sentence
that introduces what follows it (ending in ":", a code fence after it aside) answers only by code it
names that the question does not, or by the date or number asked that it states itself ("Stage 3 has 4
parts, as follows:"): "You can view its JSON string representation with a simple line of
code:" answers nothing, "... you can use the `copy.deepcopy` function ...:" answers. "Warsaw is a city in Poland." backs nothing of
"How many people live in Warsaw?" however true it is; without this rule a true restatement would
count as a supported answer. And the passages that back it must be about what was asked: they must
hold at least `ON_TOPIC` (half) of the question's content words (`on_topic`). A sentence copied from
a passage retrieved for the wrong subject ("the Mona Lisa is a portrait painting by ..." for "who
painted la primavera, a painting of the roman goddess flora?") is backed, and answers nothing asked.
Nor does a backed sentence on the right page that speaks of something else: the sentence and the
passage sentences that back it (for a code block, the passages that back it) must hold together at
least `ON_QUESTION` (0.3) of the question's content words (`on_question`). "The
Fugitive is an American drama series created by Roy Huggins." is backed, on the page of "who played the fugitive in the tv show?", and says who created it; "It was
first published in Gospel Songs No. 2 by Ira Sankey and Bliss" does not say who wrote the hymn. Such a
sentence first, then sentences no passage backs, was a partial answer presented as backed; now the
answer is withheld and the passages quoted, unless another of its backed sentences answers.

A sentence cut off mid-phrase (`unfinished`: an unclosed code span, or, the unit that ends the answer
text, `_ending`: prose after a code block, not the block attribution lists after it, and nothing when a
closed block or only chatter ends it, no
stop after a last word that ends nothing, "... with methods like `", as an answer stopped at its token
limit ends; a list item before it, "- Python 3.10 and above", is whole, and so is the last one when
the generator stopped by itself, `judge`'s ``ended``) answers nothing: the folder
set's free answer whose only backed sentence was such a fragment was presented as backed. An HTML tag states
no claim (`_MARKUP`: a README's badge, ``<img src=... alt="Package version">``, copied by grounded
decoding, answered "Which Python version ...?" backed and cited); a sentence is read without its
tags, code spans aside. A "when"
answer may name a period instead of a date ("During the Roman Empire.", "during the reign of Augustus":
`slimrag.rag.question.has_type`). A bare value (all the
sentence adds is names: "Harrison Ford.", "The answer is: Tony Jeffries.") counts for `on_question` the
`CONTEXT_BACK` sentences before each backing sentence too: "The role of Gen. Eisenhower went to Tony
Jeffries" names the question's role two sentences after its "play" and "Dwight". A sentence that adds
more than names does not: on the tuning slices that passed two wrong answers for one right.

A sentence that refers back (opening with "It", "This", "They") right after a sentence no passage backs
answers nothing either: its subject is the unbacked one's ("... use the `deep_copy()` function. This
method creates a deep copy of the given object." is backed by the passage's `copy.deepcopy`).

A number inside a name ("the PEP 8 standard", `_NAMED_NUMBER`) counts nothing asked ("How much
indentation ...?"). A value a passage no longer states answers nothing: a version note that a later note
restates ("Changed in version 3.0: The default protocol is 3."), or a value an example sets
(`slimrag.rag.stated`).

A question's qualifier ("default", "oldest", "maximum": `slimrag.rag.question.QUALIFIERS`, each with
the words that say the same, compared by stem; "first" and "last" only after a determiner, not "does the
battery last" nor "released first, Django or Flask") must be held by the backing sentences or the
sentences before them (`qualified`): "The default level of the root logger is NOTSET." is backed by "When a logger is created, the level is set to
NOTSET", a value for another case than the one asked. Nor is a default a value that an example sets
(`slimrag.rag.stated.only_set`: "The default precision of the decimal module is 9." backed only by ``>>>
decimal.getcontext().prec = 9``, where the sentence before says the example changes it); a keyword
argument in a signature (``lru_cache(maxsize=128)``) does state its default.

A question for a way ("How do I parse an ISO 8601 date string ...?", ``Question.way``) is answered by a
sentence that says the asked verb or names code the question does not, a shell command in a code span
too ("Run `make demo`."; "The `date` class in Python is a built-in datetime object." does neither), and one for code that does something ("Which function
returns the default timeout ...?", ``Question.code_verb``) by code whose backing says that verb
(`does_what_asked`: `setdefaulttimeout`'s passage says "Set the default timeout"; under a backing signature
line, the sentence that documents it says it: "provides ... key derivation" for "derives"). A light verb
("How do I make a deep copy ...?") need not be said, but a means must be (`slimrag.rag.ways.tells_a_means`: "use", "call",
"by", or code): "A shallow copy constructs a new object with references to the original." describes, and
tells no way. Nor is a way answered by a purpose clause alone ("To copy an entire
directory tree rooted at *src* to a new location *dst*.", a span copied from the passage's docs:
`slimrag.rag.ways.restates_the_goal`): it restates the goal, unless a main clause ("..., use ...") or code follows.

What counts as flagged is what the reader sees: an answer is withheld (``not_backed``) or marked
(``partial``, at least one `UNSUPPORTED_MARK` in what is shown) or neither (``supported``), and
`bench.answers` measures the check's precision over the first two together.

The verdict is a pure function of the attribution, the question, the answer text and the evidence;
`judge` returns it with the text a shell shows once the answer is complete (`Answer.shown`). What the
question asks (its kind, a way and its verb, the code's verb, its qualifiers, its words) is read once
per answer (`slimrag.rag.question.Question`) and handed to every rule; the rules here read sentences.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from slimrag.rag.attribution import CONTEXT_BACK, Attribution, with_markers
from slimrag.rag.code import CODE_SPAN, FENCE
from slimrag.rag.evidence import evidence_text
from slimrag.rag.question import Question, has_type
from slimrag.rag.sentences import (
    CHATTER_STEMS,
    STOPWORDS,
    content_words,
    key_terms,
    split_sentences,
    stem,
    words,
)
from slimrag.rag.signatures import documented, does_what_asked, names_what_is_documented, signature_line
from slimrag.rag.stated import current, only_set
from slimrag.rag.ways import new_code, restates_the_goal, tells_a_means
from slimrag.types import Evidence, Hit, Support

#: What a shell says in place of an answer that no passage backs ("not the answer": true whether the
#: model's text was streamed above it or is replaced by it, as in a completion that is not streamed).
NOT_BACKED = "The model's answer is not backed by the passages, so it is not the answer. The passages say:"
#: The same for an answer whose every claim a passage backs, none of them answering the question: its
#: sentences are the passages' own, and they say something else.
OFF_QUESTION = ("The model's answer repeats the passages but does not answer the question, so it is not the answer. "
                "The passages say:")

#: Evidence sentences quoted under `NOT_BACKED`.
QUOTED = 3

#: Answer types (`slimrag.rag.question.answer_type`) whose value an answer must state: a date for
#: "when", a number for "how many", a name for "who"/"where"/"which". Dropping "name" (an answer to
#: "who" may be a common noun, "the owner") presented more wrong free answers: on 30 + 30 recorded
#: answers (bench.answers --recheck), free-form confidently wrong on disfl_qa 0.100 -> 0.167.
TYPED = ("when", "number", "name")

#: Share of the question's content words the passages backing an answer sentence must hold.
ON_TOPIC = 0.5

#: Share of the question's content words an answering sentence and its backing must hold together
#: (module header). Lower caught fewer confidently wrong answers on the tuning slices, higher withheld
#: more right grounded ones; the figures are in docs/benchmarks.md ("The check, fourth pass").
ON_QUESTION = 0.3

#: Answer types a sentence ending in ':' may state itself ("In 1267 he moved it to the following city:");
#: a name there is as often its subject ("In Python, you can do it as follows:").
_LEAD_TYPED = ("when", "number")

#: A code fence opened at a sentence's end ("Here's how to use it:\n```python").
_FENCE_OPEN = re.compile(r"\s*```\w*\s*$")

#: The end of a sentence cut off mid-phrase (an answer stopped at its token limit): no stop, and a last
#: word that ends nothing ("... with methods like `", "... defined by").
_TRAILING = re.compile(r"(\w+)\W*$")

#: Words no phrase ends on, lower case as written ("Vitamin A" ends whole): `unfinished`.
_DANGLING = frozenset({"the", "a", "an", "of"})

#: A face written with a bracket (":(", ";-("): no bracket left open.
_OPENED_FACE = re.compile(r"[:;]-?\(")

#: A sentence whose subject is the sentence before it ("This method creates a deep copy ..."): after a
#: sentence no passage backs, its subject is what no passage says, and it answers nothing.
_REFERS = re.compile(r"(it|its|this|these|that|they|their)\b", re.I)

#: An HTML tag outside code spans (a README badge, ``<img src=... alt="Package version">``) states no
#: claim; `answers` reads a sentence without it. A bare URL may answer ("Where is ...?"): it stays.
_MARKUP = re.compile(r"</?[A-Za-z][\w-]*(?:\s[^<>]*)?/?>")

#: A citation in brackets ("[json.txt#3]").
_CITED = re.compile(r"\[[^\[\]\n]*\]")


#: A number that is part of a name: after a capitalised word that does not open the sentence ("the PEP 8
#: standard", "Gospel Songs No. 2", "in Python 3.8"). It names something; it counts nothing.
_NAMED_NUMBER = re.compile(r"(?:(?<=\w\s)|(?<=\w\s\())(?P<name>[A-Z][\w-]+\.?)\s+\d+(?:\.\d+)*\b"
                           r"(?!\s*(?:%|percent|times)\b|\s*%)")

#: The verdicts, in order from best to worst.
VERDICTS = ("supported", "partial", "not_backed")


@dataclass(frozen=True, slots=True)
class Verdict:
    """The check's decision (module header), the text to present, the labels quoted when withheld."""

    kind: str
    shown: str
    quoted: tuple[str, ...] = ()


def off_question(support: Sequence[Support], kind: str) -> bool:
    """Whether a withheld answer (``kind``) is the passages' own words, every sentence backed."""
    return kind == "not_backed" and bool(support) and all(s.supported for s in support)


def unfinished(sentence: str, last_sentence: bool = True) -> bool:
    """Whether ``sentence`` was cut off mid-phrase: it holds an unclosed code span (an odd number of
    backticks), or, the answer's last sentence (``last_sentence``), it leaves a bracket open (a code
    block cut inside a call) or ends without a stop on a stop word ("... defined by"), where an answer
    stopped at its token limit ends. Earlier in an answer such
    an ending is a list item or a line ("- Python 3.10 and above"), whole; but none ends on an article
    or "of" (`_DANGLING`), wherever it stands and however the generator stopped (a grounded sentence
    whose copied span ran out: "... or other modification of the"). A cut-off sentence states no
    whole claim, so it answers nothing (module header)."""
    text = sentence.rstrip()
    if text.count("`") % 2:
        return True
    last = _TRAILING.search(text)
    ends_open = bool(text) and text[-1] not in ".!?:;)]\"'`*" and last is not None
    if ends_open and last.group(1) in _DANGLING:  # type: ignore[union-attr]  (as written: "plan A" ends whole)
        return True  # "... or other modification of the": no phrase ends there, however it stopped
    if not last_sentence:
        return False
    bare = _OPENED_FACE.sub("", CODE_SPAN.sub("", text))  # a bracket in a code span or a face opens nothing
    if bare.count("(") > bare.count(")"):
        return True  # an open bracket: cut inside a call or an aside ("isinstance(obj, zlib.Z")
    return ends_open and last.group(1).lower() in STOPWORDS  # type: ignore[union-attr]


def answers(question: str | Question, sentence: str, last_sentence: bool = True) -> bool:
    """Whether ``sentence`` states something ``question`` asks for (module header); ``last_sentence``:
    whether it ends the answer (`unfinished`)."""
    q = Question.read(question)
    sentence = _without_markup(sentence)
    text = _FENCE_OPEN.sub("", sentence).rstrip()
    if text.endswith("?") or unfinished(text, last_sentence):  # a question asked back, a cut-off phrase: nothing answered
        return False
    said, named = content_words(sentence), key_terms(sentence)
    new = (said - q.words - CHATTER_STEMS) | (named - q.terms - q.said)  # a lower-case question still names its names
    if not new:
        return False
    if restates_the_goal(q, text):
        return False  # "How do I copy a tree?" -- "To copy an entire directory tree rooted at src." restates the goal
    counted = _not_counted(sentence, q.counts) if q.counts is not None else sentence
    typed = q.kind in TYPED and bool(has_type(q.kind, counted, q.terms | q.said))
    if text.endswith(":") and not (typed and q.kind in _LEAD_TYPED):
        # it introduces what follows (a list, code): it answers by the code it names, unless it already
        # states the date or number asked ("Stage 3 has 4 parts, as follows:")
        return new_code(q, sentence)
    if q.way_verb is not None and q.way_verb not in said and not new_code(q, sentence):
        return False  # "How do I parse ...?" is not answered by "The `date` class is a built-in object."
    if q.way and q.way_verb is None and not tells_a_means(q, text):
        return False  # "How do I make a deep copy?" -- "A shallow copy constructs a new object ..." tells no means
    if q.kind not in TYPED or typed:
        return True
    if q.kind != "name":
        return False
    # a name is also code ("which function ...": `getrecursionlimit`), and "which"/"what" may ask for a
    # number ("which port ...": 8000); "who" and "where" never do
    if new_code(q, sentence):
        return True
    return not q.person and any(any(c.isdigit() for c in t) for t in named - q.terms)


def _without_markup(sentence: str) -> str:
    """``sentence`` less its HTML tags (`_MARKUP`), code spans kept whole: a badge
    copied from a README ("<img src=... alt=\"Package version\">") names nothing asked."""
    out, at = [], 0
    for m in CODE_SPAN.finditer(sentence):
        out += [_MARKUP.sub(" ", sentence[at:m.start()]), m.group(0)]
        at = m.end()
    out.append(_MARKUP.sub(" ", sentence[at:]))
    return "".join(out)


def _not_counted(sentence: str, counted: str) -> str:
    """``sentence`` less the numbers inside names (`_NAMED_NUMBER`: "the PEP 8 standard"), unless the
    word after one is what the question counts, ``counted`` (`Question.counts`: "Brazil has won the Cup 5 times",
    "He gave Alice 3 apples" for "How many apples ...?")."""
    def name_only(m: re.Match[str]) -> str:
        after = words(sentence[m.end():m.end() + 40])
        return m.group(0) if after and stem(after[0].lower()) == counted else m.group("name")

    return _NAMED_NUMBER.sub(name_only, sentence)


def on_topic(question: str | Question, s: Support, hits: Sequence[Hit]) -> bool:
    """Whether the passages backing ``s`` hold at least `ON_TOPIC` of the question's content words
    (module header); True when no hits are given."""
    asked = Question.read(question).words
    if not hits or not asked:
        return True
    return len(asked & _passage_words(s, hits)) >= ON_TOPIC * len(asked)


def _passage_words(s: Support, hits: Sequence[Hit]) -> set[str]:
    """The content words of the retrieved passages that back ``s``."""
    return set().union(*(content_words(h.text) for h in hits if h.label in s.labels))


def on_question(question: str | Question, s: Support, hits: Sequence[Hit] = (),
                before: Sequence[str] | None = None) -> bool:
    """Whether ``s``'s sentence and what backs it hold together at least `ON_QUESTION` of the question's
    content words (module header): its backing passage sentences (a signature line with the sentences
    it documents, `slimrag.rag.signatures.documented`), or for a code block (backed by passages, not
    sentences) the passages themselves. True for a question without content words. A bare
    value ("The answer is: 1978.") is not exempt: on the held-out set exempting it passed three wrong
    backed values for one right (docs/benchmarks.md, "The check, fourth pass"); the sentences just before its
    backing sentences count for it (`_bare`, module header); ``before``: those sentences
    (`_sentences_before`), when the caller has them already."""
    q = Question.read(question)
    asked = q.words - CHATTER_STEMS
    if not asked:
        return True
    held = content_words(s.sentence).union(*(content_words(e.text) for e in s.evidence))
    for e in s.evidence:  # a signature line holds what its body says: ".. function:: deepcopy(x)", "Return a deep copy"
        if hits and signature_line(e.text):
            held = held.union(*(content_words(t) for t in documented(e, hits)))
    if s.evidence and hits and _bare(q, s.sentence):  # "The role of Gen. Eisenhower went to Tony Jeffries"
        if before is None:
            before = _sentences_before(s.evidence, hits)
        held |= set().union(*(content_words(t) for t in before))
    if not s.evidence:
        held |= _passage_words(s, hits)
    return len(asked & held) >= ON_QUESTION * len(asked)


def _bare(q: Question, sentence: str) -> bool:
    """Whether all ``sentence`` adds to ``question`` is names ("The answer is: Tony Jeffries.", "Harrison
    Ford."): a bare value, whose backing sentence may leave the question's words to the sentences before it."""
    names = {stem(w) for w in words(sentence) if w[:1].isupper() or any(c.isdigit() for c in w)}
    said = content_words(sentence) - q.words - CHATTER_STEMS
    return bool(said) and said <= names


def _sentences_before(evidence: Sequence[Evidence], hits: Sequence[Hit]) -> list[str]:
    """The `CONTEXT_BACK` sentences before each of ``evidence``'s sentences in its passage (of ``hits``)."""
    out: list[str] = []
    for e in evidence:
        if (h := e.passage(hits)) is not None:
            out += [x.text for x in split_sentences(h.text) if x.end <= e.start][-CONTEXT_BACK:]
    return out


def qualified(question: str | Question, s: Support, hits: Sequence[Hit] = (),
              before: Sequence[str] | None = None) -> bool:
    """Whether each qualifier of ``question`` (`slimrag.rag.question.QUALIFIERS`: "default", "oldest")
    is held, in one of its words, by ``s``'s backing sentences or the sentences before them
    (``before``, `_sentences_before` when not given): a value stated for another case than the one
    asked ("When a logger is created, the level is set to NOTSET" for the root logger's default level)
    answers nothing. True for a sentence with no backing sentence."""
    asked = Question.read(question).qualifiers
    if not asked or not s.evidence:
        return True
    if before is None:
        before = _sentences_before(s.evidence, hits)
    held = {stem(w) for t in [*(e.text for e in s.evidence), *before] for w in words(t)}
    if not all(group & held for group in asked):
        return False
    return _DEFAULT not in asked or not only_set(s)


#: The "default" qualifier (`slimrag.rag.question.QUALIFIERS`).
_DEFAULT = frozenset({"default"})

def kind_of(question: str | Question, support: Sequence[Support], hits: Sequence[Hit] = (),
            ended: bool = False, text: str | None = None) -> str:
    """``supported``, ``partial`` or ``not_backed`` for an answer whose sentences are ``support``,
    checked against ``hits`` (the retrieved passages; none: the topic rule is skipped). ``ended``:
    the generator stopped by itself (finish reason ``stop``), so its last sentence is whole even
    without a stop ("- Python 3.10 and above"); False when that is unknown or it hit its token limit.
    ``text``: the answer ``support`` was cut from, which tells which sentence ends it (`_ending`);
    without it, the last of ``support``. The question is read once (`Question.read`) for every sentence."""
    q = Question.read(question)
    last = None if ended else (len(support) - 1 if text is None else _ending(text, support))
    if not any(s.supported and _responsive(q, support, i, hits, i == last) for i, s in enumerate(support)):
        return "not_backed"
    return "supported" if all(s.supported for s in support) else "partial"


def _ending(text: str, support: Sequence[Support]) -> int | None:
    """The index in ``support`` (`attribute`'s: the sentences of ``text`` out of its code blocks, then
    each block) of the unit that ends ``text``, where an answer stopped at its token limit is cut: its
    last sentence when prose ends it, though blocks come after it in ``support``; the last block when
    an unclosed fence runs to the end; None when a closed fence ends it (a block closed is whole), or
    when what follows the last block is only what attribution drops as claiming nothing."""
    blocks = [m for m in FENCE.finditer(text) if m.group(1).strip()]
    after = _CITED.sub("", text[blocks[-1].end():]) if blocks else ""  # a citation after a block ends nothing
    if blocks and not after.strip():
        return len(support) - 1 if not blocks[-1].group(0).rstrip().endswith("```") else None
    last = len(support) - 1 - len(blocks)
    if last < 0:
        return None
    if blocks and support[last].sentence[:24].strip() not in after:
        return None  # what follows the last block claims nothing ("Hope this helps!"): it cuts no claim
    return last


def _responsive(q: Question, support: Sequence[Support], i: int, hits: Sequence[Hit], last: bool) -> bool:
    """Whether ``support[i]``, a backed sentence, answers ``q`` (module header); ``last``: it ends an
    answer that may have been cut (`unfinished`). The sentences before its backing
    (`_sentences_before`) are found once for the two rules that read them, and only when one does:
    for a bare value (`_bare`) or a question with qualifiers."""
    s = support[i]
    if not answers(q, s.sentence, last_sentence=last) or not on_topic(q, s, hits):
        return False
    if i and not support[i - 1].supported and _REFERS.match(s.sentence):
        return False
    read = bool(s.evidence and hits and (q.qualifiers or _bare(q, s.sentence)))
    before = _sentences_before(s.evidence, hits) if read else []
    return (on_question(q, s, hits, before) and qualified(q, s, hits, before) and (q.dated or current(s, hits))
            and does_what_asked(q, s, hits) and names_what_is_documented(q, s))


def judge(question: str, text: str, check: Attribution, evidence: Sequence[Evidence],
          hits: Sequence[Hit] = (), ended: bool = False) -> Verdict:
    """The verdict on ``text`` and what to show: ``text`` with citations and marks when it is backed,
    else `NOT_BACKED` (`OFF_QUESTION` when every claim is backed and none answers) and the first
    `QUOTED` evidence sentences, each with its label. ``ended``: the generation stopped by itself,
    not at its token limit (`kind_of`)."""
    kind = kind_of(question, check.support, hits, ended, text)
    if kind != "not_backed":
        return Verdict(kind, with_markers(text, check))
    quoted = evidence_text(evidence[:QUOTED]) if evidence else "(no sentence of the passages answers it)"
    why = OFF_QUESTION if off_question(check.support, kind) else NOT_BACKED
    return Verdict(kind, f"{why}\n{quoted}", tuple(dict.fromkeys(e.label for e in evidence[:QUOTED])))
