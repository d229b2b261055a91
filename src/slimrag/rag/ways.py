"""What answers a question that asks a way ("How do I copy a directory tree?", `Question.way`).

The verdict (`slimrag.rag.verdict.answers`) asks these of a backed sentence when the question asks how
to do something. A way is told by code (`new_code`: an identifier or a code span the question does not
name), by a main clause that says what to do, or by an instruction; it is not told by the goal said
again (`restates_the_goal`: "To copy an entire directory tree rooted at *src* to a new location
*dst*.", a span copied from the passage's docs), nor, for a way asked with a light verb ("How do I
make a deep copy ...?", whose verb asks for nothing), by a description of what is asked about
(`tells_a_means`: "A shallow copy constructs a new object with references to the original." is true,
backed, and no way). Each rule came from a free answer of the folder set presented as backed.
"""

from __future__ import annotations

import re

from slimrag.rag.code import CODE_SPAN, identifiers
from slimrag.rag.question import Question
from slimrag.rag.sentences import STOPWORDS, stem, words

_PURPOSE = re.compile(r"^\W*[Tt]o [a-z]+\b")
"""A sentence opening with a purpose clause ("To copy a tree ..."): for a question asking a way, it
restates the goal, and states the way only in a main clause after it ("..., use ..."; `main_clause`)
or by the code it names. For another question it may answer ("To monitor the carbon cycle ..." for
"To monitor what event ...?")."""
_MAIN_CLAUSE = re.compile(r",\s+(?:you|we|one|it|this|they|use|call|run|pass|set|simply|just)\b", re.I)
"""A main clause after a purpose clause, as a way is told ("..., use ...", "..., you can ..."); one that
opens with a name is `_NAMED_CLAUSE`'s."""
_NAMED_CLAUSE = re.compile(r",\s+(?:(?:the|a|an)\s+)?(?P<subject>[\w.]+(?:\s+[\w.]+)?)\s+"
                           r"(?:can|will|should|must|may|\w+s(?<!ss)(?<!us)(?<!is))\s+[\w`'\"(]", re.I)
"""A main clause that opens with a name, one or two words that are no stop words ("the shutil module"),
then a verb with something after it: a modal or one in the present ("..., shutil provides copytree.");
"..., its files and links." has none (`main_clause`), and a noun phrase that ends the sentence ("...,
class attributes.", "..., ISO 8601 strings.") is no clause, though its last word looks like a verb
(a plural noun's "s"). A plural subject with a plain verb ("..., scientists use ...") is not read."""


def main_clause(text: str) -> bool:
    """Whether a main clause follows the purpose clause ``text`` opens with (`_MAIN_CLAUSE`, `_NAMED_CLAUSE`)."""
    return _MAIN_CLAUSE.search(text) is not None or any(
        not any(w.lower() in STOPWORDS for w in m.group("subject").split()) for m in _NAMED_CLAUSE.finditer(text))


def restates_the_goal(q: Question, sentence: str) -> bool:
    """Whether ``sentence``, for question ``q`` asking a way, opens with a purpose clause (`_PURPOSE`)
    and says nothing more: no main clause after it (`main_clause`), no code (`new_code`)."""
    return q.way and _PURPOSE.match(sentence) is not None and not main_clause(sentence) \
        and not new_code(q, sentence)


#: Words that tell a means ("use the ... module", "by calling ...") for a way asked with a light verb
#: ("How do I make a deep copy ...?"), whose verb asks for nothing (`tells_a_means`).
_MEANS = frozenset(stem(w) for w in "use using call calling run running pass passing by via import".split())
#: Code named in words ("the deepcopy function", "the copy module's deepcopy function"): a means when a
#: name the question lacks stands before the kind, not a determiner ("This module provides ...").
_NAMED_CODE = re.compile(r"\b([\w.]+?)(?:'s)?\s+(?:function|method|module|class|command)\b", re.I)
#: What opens a description, not an instruction ("A shallow copy constructs ...", "The difference
#: between ..."): a sentence opening with another word tells a way ("Convert the list to a set.").
_DESCRIBES = frozenset("a an the this these that those it its they their there".split())


def tells_a_means(q: Question, sentence: str) -> bool:
    """Whether ``sentence`` tells a way to do what a light verb asks ("How do I make a deep copy?"):
    it names code the question does not, a call ("len()") or code in words (`_NAMED_CODE`), says a
    means (`_MEANS`), or opens as an
    instruction does, not as a description (`_DESCRIBES`): "Convert the list to a set." tells one,
    "A deep copy constructs a new compound object." tells what it is."""
    said = [w.lower() for w in words(sentence)]
    if not said or new_code(q, sentence) or _CALL.search(sentence):
        return True
    if _MEANS & {stem(w) for w in said} or any(
            m.group(1).lower() not in STOPWORDS and stem(m.group(1).lower()) not in q.words
            for m in _NAMED_CODE.finditer(sentence)):
        return True
    return _OPENS.match(sentence) is not None and said[0] not in _DESCRIBES


#: A sentence's opening word, after a list marker: an instruction opens with one ("Convert the list
#: ..."); a directive copied from reStructuredText (".. function:: deep") opens with none.
_OPENS = re.compile(r"\s*(?:[*\-•]\s+|\d+[.)]\s+)?[A-Z]")


#: A call written in prose ("the built-in len()").
_CALL = re.compile(r"\w\(\)")


def new_code(q: Question, sentence: str) -> bool:
    """Whether ``sentence`` names code that question ``q`` does not: an identifier (`identifiers`), or
    a code span with a word the question lacks (a shell command: "Run `make demo`." for "How do I
    install slimrag?"; "`slimrag`" names nothing new there)."""
    if any(i.lower() not in q.code and i.lower() not in q.said for i in identifiers(sentence)):
        return True
    return any({w.lower() for w in words(span)} - q.said for span in CODE_SPAN.findall(sentence))
