"""Signatures: what a sentence of API documentation documents.

Reference documentation names a function once, in its signature line, and then documents it in
sentences that do not repeat the name: under ``.. function:: uuid4()`` the only sentence is
"Generate a random UUID." Quoted alone, as evidence is, that sentence answers "How do I generate a
random UUID?" without the one word the reader needs. On the folder set (the Python docs) 9 of the 17
grounded answers that lacked the gold answer, whose passage was retrieved, quoted such a sentence
whose signature stood in the same passage (docs/benchmarks.md, "Evidence under its signature").

`signature_of` finds, for a sentence at an offset of its passage, the reStructuredText signature
line whose indented body holds it; evidence carries it (`slimrag.types.Evidence.signature`) and shows
it before the sentence. Only signature directives count (`SIGNATURE`: function, method, class, data,
attribute, exception, decorator, ...); a note (``.. versionchanged:: 3.5.1``) names nothing. A
signature continued on the lines right under it (``.. data:: I`` then ``IGNORECASE`` aligned under
the ``I``) names each. A signature in another passage (the chunk starts mid-body) is not looked for:
evidence reads the retrieved passages only.

The other way round, a signature's sentences say what its code does: `does_what_asked` reads them
when the verdict (`slimrag.rag.verdict`) asks whether code named for "which function returns ...?"
is documented as doing that.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from slimrag.rag.code import CODE_SPAN, identifiers
from slimrag.rag.question import Question
from slimrag.rag.sentences import content_words, split_sentences, words
from slimrag.types import Evidence, Hit, Support

#: A reStructuredText signature line (".. function:: uuid4()", ".. data:: I", ".. c:function:: int
#: f(void)"): the sentences indented under it document what it names.
SIGNATURE = re.compile(r"(?P<indent>[ \t]*)\.\. (?:\w+:)?(?:function|method|classmethod|staticmethod|class|data|"
                       r"attribute|exception|decorator|decoratormethod|property|macro|member|type|var)::"
                       r"[ \t]+(?P<names>\S[^\n]*)")

#: An option line under a directive (":noindex:", ":type: int"): no continued signature.
_OPTION = re.compile(r"\s*:[\w-]+:")


def signature_of(text: str, start: int) -> str:
    """What the sentence at offset ``start`` of passage ``text`` documents: the names of the signature
    line whose indented body holds it ("uuid4()"; "I, IGNORECASE" for a signature continued on the
    next line), "" when none holds it (a line as little indented as the signature ends its body) or
    when the sentence is a signature itself."""
    indent = -1  # the open signature's indentation; -1: none
    names: list[str] = []
    continued = False  # the line just before was the signature or its continuation
    at = 0
    for line in text.split("\n"):
        holds = at <= start <= at + len(line)
        at += len(line) + 1
        body = line.strip()
        if not body:
            continued = False
            if holds:
                break
            continue
        depth = len(line) - len(line.lstrip())
        m = SIGNATURE.match(line)
        if m is not None:
            if holds:
                return ""
            indent, names, continued = depth, [m.group("names").strip()], True
        elif indent >= 0 and depth <= indent:
            indent, names, continued = -1, [], False
        elif continued and not _OPTION.match(line) and not holds:
            names.append(body)  # ".. data:: I" / "IGNORECASE": one signature, two names
        else:
            continued = False
        if holds:
            break
    return ", ".join(names) if indent >= 0 else ""


def does_what_asked(question: str | Question, s: Support, hits: Sequence[Hit] = ()) -> bool:
    """Whether the code a "which function returns ..." question asks for is documented by what backs
    ``s`` as doing what is asked: the verb after the kind of code (``Question.code_verb``; "returns", a
    light verb aside) is in a backing sentence or, when a signature line backs it, in what that
    signature documents (the sentences under it in its passage of ``hits``, to the next signature:
    ".. function:: pbkdf2_hmac(...)", then "The function provides ... key derivation ..."), not in a
    sentence before it (the function documented before is another). ".. function::
    setdefaulttimeout(timeout)" is backed, and its passage says "Set the default timeout ...", not
    "Return". A word made from the verb says it too ("derivation" for "derives": `_says`). True for
    other questions and for a sentence with no backing sentence."""
    verb = Question.read(question).code_verb
    if verb is None or not s.evidence:
        return True
    signed = [e for e in s.evidence if SIGNATURE.match(e.text)]
    texts = [t for e in signed for t in [e.text, *_documented(e, hits)]] if signed else [e.text for e in s.evidence]
    return any(_says(verb, t) for t in texts)


def names_what_is_documented(question: str | Question, s: Support) -> bool:
    """Whether the code ``s`` names for a "which <kind> ...?" question (``Question.code_kind``: "Which
    regular expression flag makes matching case-insensitive?") is what its backing sentences
    document, when they stand under a signature (`Evidence.signature`) or are one: some word of the
    code it names that the question does not (an identifier's parts, a code span's words) is in
    such a signature. "``[A-Z]`` is the only one that makes case-insensitive matching." is backed by
    the sentence under ``.. data:: I / IGNORECASE``, where ``[A-Z]`` is an example, not the flag asked.
    True for other questions, for a sentence that names no new code, and when no backing sentence
    stands under a signature."""
    q = Question.read(question)
    if q.code_kind is None or not s.evidence:
        return True
    documented = [e.signature or _names(e.text) for e in s.evidence]
    held = {w.lower() for d in documented for w in words(d)}
    if not held:
        return True
    named = {w.lower() for i in identifiers(s.sentence) for w in words(i.replace(".", " "))}
    named |= {w.lower() for span in CODE_SPAN.findall(s.sentence) for w in words(span)}
    named -= q.said | q.code
    return not named or bool(named & held)


def _names(text: str) -> str:
    """What the signature line ``text`` names ("" when it is none)."""
    m = SIGNATURE.match(text)
    return m.group("names") if m is not None else ""


#: The shortest verb stem that a longer word may carry and still say the verb ("deriv" in "derivation"):
#: shorter ones ("set", "get") begin unrelated words ("settings", "getter").
_STEM_IN_WORD = 5


def _says(verb: str, text: str) -> bool:
    """Whether ``text`` says ``verb`` (a stem): one of its content words is the verb, or, for a stem of
    `_STEM_IN_WORD` letters or more, begins with it."""
    said = content_words(text)
    return verb in said or (len(verb) >= _STEM_IN_WORD and any(w.startswith(verb) for w in said))


def _documented(signature: Evidence, hits: Sequence[Hit]) -> list[str]:
    """The sentences under evidence sentence ``signature`` (a signature line) in its passage of
    ``hits``, up to the next signature line: what documents it."""
    out: list[str] = []
    for h in hits:
        if h.label == signature.label:
            for x in split_sentences(h.text):
                if x.start < signature.end:
                    continue
                if SIGNATURE.match(x.text):
                    break
                out.append(x.text)
            break
    return out
