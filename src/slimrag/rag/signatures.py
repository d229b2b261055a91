"""Signatures: what a sentence of API documentation documents.

Reference documentation names a function once, in its signature line, and then documents it in
sentences that do not repeat the name: under ``.. function:: uuid4()`` the only sentence is
"Generate a random UUID." Quoted alone, as evidence is, that sentence answers "How do I generate a
random UUID?" without the one word the reader needs. On the folder set (the Python docs) 9 of the 17
grounded answers that lacked the gold answer, whose passage was retrieved, quoted such a sentence
whose signature stood in the same passage (docs/benchmarks.md, "Evidence under its signature").

`signature_of` finds, for a sentence at an offset of its passage, the signature whose body holds it;
evidence carries it (`slimrag.types.Evidence.signature`) and shows it before the sentence. Three forms
of documentation are read:

- reStructuredText: a signature directive (`signature_line`: function, method, class, data, attribute,
  exception, decorator, ...) and the lines indented under it; a note (``.. versionchanged:: 3.5.1``)
  names nothing, and a signature continued on the lines right under it (``.. data:: I`` then
  ``IGNORECASE`` aligned under the ``I``) names each;
- the text of a built HTML page (Sphinx's, as `slimrag.ingest.readers.read_html` gives it): a dotted
  or called name alone on its line before the permalink's "¶" (`HTML_SIGNATURE`:
  "sys.getrecursionlimit()¶"), and the lines after it up to the next line ending in "¶" (another
  signature or a heading, "Example¶"); signatures with only blank lines between them ("re.I¶",
  "re.IGNORECASE¶") document one body;
- Markdown (a source named ``.md``, `MARKDOWN_SUFFIXES`): a heading that names code ("##
  `shutil.rmtree(path)`") and its section, to the next heading of its level or higher (not
  measured on a set of questions: no Markdown API docs among the benchmark's folders).

A signature in another passage (the chunk starts mid-body) is not looked for: evidence reads the
retrieved passages only.

A passage is read once: each form's rules run in one pass over its lines, which `sections` cuts into
the runs that document one signature, and `signature_of` looks its offset up there. Evidence,
attribution and the verdict ask about the same passages, so the sections of the last `CACHED` (256)
passages are kept; a larger cache serves a server's repeated passages, a smaller one holds less text.

The other way round, a signature's sentences say what its code does: `does_what_asked` reads them
when the verdict (`slimrag.rag.verdict`) asks whether code named for "which function returns ...?"
is documented as doing that.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter

from slimrag.rag.code import CODE_SPAN, identifiers
from slimrag.rag.question import Question
from slimrag.rag.sentences import content_words, split_sentences, words
from slimrag.types import Evidence, Hit, Support

#: A reStructuredText directive line (".. function:: uuid4()", ".. versionchanged:: 3.5"): its kind
#: and what follows it.
DIRECTIVE = re.compile(r"(?P<indent>[ \t]*)\.\. (?:\w+:)?(?P<kind>[\w-]+)::(?:[ \t]+(?P<names>\S[^\n]*))?")

#: Directives whose body goes on documenting what the signature around them documents: a note, a
#: version, an index entry ("Flags may now be combined." under ``.. versionchanged:: 3.7`` in a flag's
#: body documents the flag). Any other directive that is no signature (``.. code-block::``, ``..
#: productionlist::``) opens a body that documents nothing named.
_NOTES = frozenset("""versionadded versionchanged versionremoved deprecated deprecated-removed note warning
seealso important tip hint caution attention danger error admonition impl-detail index audit-event
availability""".split())

#: Signature directives, Python's and C's (".. c:function::"): the sentences indented under one
#: document what it names. Others (``.. module::``, ``.. toctree::``) name nothing a sentence documents.
_SIGNATURES = frozenset("""function method classmethod staticmethod abstractmethod class data attribute exception
decorator decoratormethod property coroutinefunction coroutinemethod awaitablefunction awaitablemethod describe
envvar option cmdoption opcode pdbcommand macro member type var struct enum enumerator""".split())

#: A name that code documents: a dotted name or a call, with its arguments ("sys.getrecursionlimit()",
#: "re.IGNORECASE", "uuid.UUID(hex=None)"); a word alone ("Example") is none. Read by the HTML and the
#: Markdown forms (`HTML_SIGNATURE`, `_MD_CODE`).
_CODE_NAME = r"@?[A-Za-z_]\w*(?:(?:\.\w+)+(?:\(.*\))?|\(.*\))"

#: A signature in the text of a built HTML page: a dotted or called name alone on its line, after an
#: optional keyword ("class", "exception", "async", ...), before the permalink's "¶" that the page's
#: text keeps ("sys.getrecursionlimit()¶", "class uuid.UUID(hex=None, ...)¶", "re.IGNORECASE¶"); a heading
#: ("Example¶", "Module contents¶") has neither a dot nor a call.
HTML_SIGNATURE = re.compile(r"(?:(?:class|exception|async|await|classmethod|staticmethod|abstractmethod|property|"
                            r"decorator|coroutine|awaitable)\s+)*(?P<names>" + _CODE_NAME + r"(?:\s*→\s*\S.*)?)¶")

#: A Markdown heading at the start of its line ("## `shutil.rmtree(path)`"): its level and title.
_MD_HEADING = re.compile(r"(#{1,6})[ \t]+(.*?)[ \t#]*")
#: A heading title that names code, in backticks or not: a dotted or called name after an optional
#: keyword ("class uuid.UUID(hex=None)", "`rmtree(path)`"), or one name in backticks ("`rmtree`").
_MD_CODE = re.compile(r"(?:(?:class|exception|async|def|function|method|property|decorator)\s+)?`?"
                      r"(?P<names>" + _CODE_NAME + r")`?|`(?P<name>[A-Za-z_][\w.]*)`")
#: The underline of a setext heading ("=====" for level 1, "-----" for level 2).
_MD_SETEXT = re.compile(r"[ \t]{0,3}(?:=+|-{2,})[ \t]*")
#: A Markdown code fence: its lines are code (a "# comment" there is no heading).
_MD_FENCE = re.compile(r"[ \t]{0,3}(```|~~~)")

#: An option line under a directive (":noindex:", ":type: int"): no continued signature.
_OPTION = re.compile(r"\s*:[\w-]+:")


#: Sources whose text is Markdown (`_markdown_signature` reads only them: a "# comment" at the start of
#: a line of code, or of an example in a page's text, is no heading).
MARKDOWN_SUFFIXES = (".md", ".markdown", ".mdx")


#: How many passages' sections (`sections`) are kept: evidence, attribution and the verdict of one
#: answer ask about the same few passages, a server's answers about many.
CACHED = 256


@dataclass(frozen=True, slots=True)
class Section:
    """A run of whole lines of a passage whose every offset, from ``start`` up to ``end`` (the newline
    after its last line included), `signature_of` answers with ``signature`` ("" where none)."""

    start: int
    end: int
    signature: str


def sections(text: str, source: str = "") -> tuple[Section, ...]:
    """Passage ``text`` as the runs of lines that document one signature (`Section`), read once in one
    pass over its lines by each form (`_rst_lines`, `_html_lines` and, in a Markdown ``source``,
    `_markdown_lines`); they cover every offset from 0 to ``len(text)`` in order. The last `CACHED`
    passages' sections are kept."""
    return _sections(text, source.lower().endswith(MARKDOWN_SUFFIXES))


def signature_of(text: str, start: int, source: str = "") -> str:
    """What the sentence at offset ``start`` of passage ``text`` documents: the names of the signature
    whose body holds it, in reStructuredText (`_rst_lines`), in the text of a built HTML page
    (`_html_lines`) or, in a Markdown ``source`` (`MARKDOWN_SUFFIXES`), under a heading that names
    code (`_markdown_lines`); "" when none holds it, when the sentence is a signature itself, or when
    ``start`` is not in ``text``. Read from the passage's `sections`."""
    if not 0 <= start <= len(text):
        return ""
    runs = sections(text, source)
    return runs[bisect.bisect_right(runs, start, key=_START) - 1].signature


_START = attrgetter("start")


@functools.lru_cache(maxsize=CACHED)
def _sections(text: str, markdown: bool) -> tuple[Section, ...]:
    """`sections` of ``text``, Markdown headings read when ``markdown``. A line's signature is the
    first form's that gives one (reST, HTML, Markdown); an offset at a line's end (its newline)
    belongs to that line."""
    lines = text.split("\n")
    md: Iterable[str] = _markdown_lines(lines) if markdown else itertools.repeat("", len(lines))
    out: list[Section] = []
    at = 0
    for line, rst, html, mark in zip(lines, _rst_lines(lines), _html_lines(lines), md, strict=True):
        signature = rst or html or mark
        end = at + len(line) + 1
        if out and out[-1].signature == signature:
            out[-1] = Section(out[-1].start, end, signature)
        else:
            out.append(Section(at, end, signature))
        at = end
    return tuple(out)


def signature_names(signature: str) -> list[str]:
    """The names a signature gives (`signature_of`'s), without their arguments, defaults or return
    type: "memoize", "re.I", "uuid.UUID" of "memoize(maxsize=256)", "re.I, re.IGNORECASE", "class
    uuid.UUID(hex=None)". A default in the arguments (``maxsize=256``) is no name of what the body
    says: the body may give another value for another case."""
    out, depth, part = [], 0, []
    for c in signature.split("→", 1)[0]:
        depth += (c in "([{") - (c in ")]}")
        if depth == 0 and c == ",":
            out.append("".join(part))
            part = []
        elif depth == 0 and c not in ")]}":
            part.append(c)
    out.append("".join(part))
    return [m.group(1) for x in out if (m := _NAME.search(x)) is not None]


#: The name in a part of a signature: a dotted name, after a keyword ("class") or "@".
_NAME = re.compile(r"@?([A-Za-z_][\w.]*)\s*$")


def _innermost(scopes: Sequence[tuple[int, list[str] | None]], depth: int | None = None) -> str:
    """The names of the innermost reST scope (of those less indented than ``depth``, when given)."""
    for indent, names in reversed(scopes):
        if depth is None or indent < depth:
            return ", ".join(names) if names else ""
    return ""


def _rst_lines(lines: Iterable[str]) -> Iterator[str]:
    """For each line, the names of the reST signature whose indented body holds it ("uuid4()"; "I,
    IGNORECASE" for a signature continued on the lines under it; both names of two signature lines
    with no body between them); "" on a signature line. Bodies nest: a line as little indented as a
    directive ends its body, and the signature around it documents what follows (a class's body after
    a method's); a note's body (`_NOTES`) documents what the signature around it does, another
    directive's nothing named."""
    scopes: list[tuple[int, list[str] | None]] = []  # (indentation, names; None: a body naming nothing)
    fresh = False  # the innermost signature has had no body line yet
    continued = False  # the line just before was a signature line or its continuation
    for line in lines:
        body = line.strip()
        if not body:
            yield _innermost(scopes)
            continued = False
            continue
        depth = len(line) - len(line.lstrip())
        m = DIRECTIVE.match(line)
        kind = m.group("kind") if m is not None else None
        option = _OPTION.match(line) is not None
        if kind in _SIGNATURES:
            yield ""  # a signature line documents nothing itself
        elif continued and option:
            yield _innermost(scopes)
        else:  # what stays open once this line has ended the bodies it ends
            yield _innermost(scopes, depth) if kind is None or kind in _NOTES else ""
        if continued and m is None and depth > scopes[-1][0] and not option:
            names = scopes[-1][1]
            assert names is not None
            if names[-1].endswith("\\"):  # a signature continued after a backslash: one name
                names[-1] = f"{names[-1][:-1].rstrip()} {body}"
            else:
                names.append(body)  # ".. data:: I" / "IGNORECASE": one signature, two names
            continue
        if continued and option:
            continue
        popped = None
        while scopes and scopes[-1][0] >= depth:
            popped = scopes.pop()
        if m is None:
            fresh = continued = False
            continue
        if kind in _SIGNATURES and m.group("names"):
            names = [m.group("names").strip()]
            if fresh and popped is not None and popped[0] == depth and popped[1] is not None:
                names = popped[1] + names  # ".. exception:: ExceptionGroup(...)" then "BaseExceptionGroup(...)"
            scopes.append((depth, names))
            fresh = continued = True
        else:
            if kind not in _NOTES:
                scopes.append((depth, None))
            fresh = continued = False


def _markdown_lines(lines: Iterable[str]) -> Iterator[str]:
    """For each line, the names of the Markdown heading that names code (`_MD_CODE`: "##
    `shutil.rmtree(path)`") whose section holds it: the lines after it up to the next heading of its
    level or higher; "" on a heading. A deeper heading that names no code ("### Example") is part of
    its section; one that does opens its own. Lines in a code fence are code, never headings."""
    scopes: list[tuple[int, str]] = []  # (level, names) of the open sections that name code
    fence = ""  # the open fence's marker ("```" or "~~~"): only the same one closes it
    for line in lines:
        inner = scopes[-1][1] if scopes else ""
        f = _MD_FENCE.match(line)
        if f is not None and fence in ("", f.group(1)):
            yield inner
            fence = "" if fence else f.group(1)
            continue
        if fence:
            yield inner
            continue
        m = _MD_HEADING.fullmatch(line)
        yield "" if m is not None else inner
        if _MD_SETEXT.fullmatch(line):
            scopes = [x for x in scopes if x[0] < (1 if line.lstrip()[0] == "=" else 2)]  # "Title\n====="
            continue
        if m is None:
            continue
        level = len(m.group(1))
        while scopes and scopes[-1][0] >= level:
            scopes.pop()
        code = _MD_CODE.fullmatch(m.group(2))
        if code is not None:
            scopes.append((level, code.group("names") or code.group("name")))


def _html_lines(lines: Iterable[str]) -> Iterator[str]:
    """For each line, the names of the signature of a built HTML page (`HTML_SIGNATURE`:
    "sys.getrecursionlimit()¶", the permalink's "¶" kept by the page's text) whose body holds it: the
    lines after it up to the next line ending in "¶" (another signature, or a heading: "Example¶"),
    which gets "". Signatures with nothing between them but blank lines ("re.I¶", "re.IGNORECASE¶")
    document the same body."""
    names: list[str] = []
    fresh = False  # no body line since the last signature
    for line in lines:
        body = line.strip()
        if body.endswith("¶"):
            yield ""
            m = HTML_SIGNATURE.fullmatch(body)
            if m is None:
                names, fresh = [], False  # a heading ends what the signature documents
            else:
                names, fresh = ([*names] if fresh else []) + [m.group("names")], True
            continue
        yield ", ".join(names)
        if HTML_SIGNATURE.fullmatch(body + "¶") and "(" in body:
            names, fresh = [], False  # a signature without its permalink (":noindex:"): another's body
        elif body:
            fresh = False


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
    signed = [e for e in s.evidence if signature_line(e.text)]
    texts = [t for e in signed for t in [e.text, *documented(e, hits)]] if signed else [e.text for e in s.evidence]
    return any(_says(verb, t) for t in texts)


def names_what_is_documented(question: str | Question, s: Support) -> bool:
    """Whether the code ``s`` names for a "which <kind> ...?" question whose answer a signature names
    (`_NAMED_KINDS`: "Which regular expression flag makes matching case-insensitive?") is what its
    backing sentences document, when they stand under a signature (`Evidence.signature`) or are one:
    some part of the code it names that the question does not (an identifier's dotted parts, a code
    span's words) is in such a signature. "``[A-Z]`` is the only one that makes case-insensitive
    matching." is backed by the sentence under ``.. data:: I / IGNORECASE``, where ``[A-Z]`` is an
    example, not the flag asked. True for other questions, for a sentence that names no new code, and
    when no backing sentence stands under a signature."""
    q = Question.read(question)
    if q.code_kind not in _NAMED_KINDS or not s.evidence:
        return True
    held = {w for e in s.evidence for w in _parts(e.signature or signature_line(e.text))}
    if not held:
        return True
    named = {w for i in identifiers(s.sentence) for w in _parts(i)}
    named |= {w for span in CODE_SPAN.findall(s.sentence) for w in _parts(span)}
    named -= {w for t in q.said | q.code for w in _parts(t)}
    return not named or bool(named & held)


#: Kinds of code whose signature names the answer: not "exception" nor "module" ("Which exception does
#: json.loads raise ...?" is answered in the body of ``loads``, which names ``JSONDecodeError``), nor a
#: parameter, an option or a variable, which a body names as often.
_NAMED_KINDS = frozenset("function method class flag constant attribute decorator".split())


def _parts(text: str) -> set[str]:
    """The words of ``text`` lower-cased, a dotted name cut at its dots ("logger.setlevel" -> "logger",
    "setlevel"): code named as ``setLevel()`` is the signature's ``Logger.setLevel(level)``."""
    return {p for w in words(text) for p in w.lower().split(".") if p}


def signature_line(text: str) -> str:
    """What ``text`` names when it opens with a reST signature directive (`DIRECTIVE` of a kind in
    `_SIGNATURES`: ".. function:: pbkdf2_hmac(...)", ".. c:function:: ..."); "" for any other text
    (".. versionchanged:: 3.5.1" names nothing a sentence documents)."""
    m = DIRECTIVE.match(text)
    return m.group("names") or "" if m is not None and m.group("kind") in _SIGNATURES else ""


#: The shortest verb stem that a longer word may carry and still say the verb ("deriv" in "derivation"):
#: shorter ones ("set", "get") begin unrelated words ("settings", "getter").
_STEM_IN_WORD = 5


def _says(verb: str, text: str) -> bool:
    """Whether ``text`` says ``verb`` (a stem): one of its content words is the verb, or, for a stem of
    `_STEM_IN_WORD` letters or more, begins with it."""
    said = content_words(text)
    return verb in said or (len(verb) >= _STEM_IN_WORD and any(w.startswith(verb) for w in said))


def documented(signature: Evidence, hits: Sequence[Hit]) -> list[str]:
    """The sentences under evidence sentence ``signature`` (a signature line) in its passage of
    ``hits`` that it documents (`signature_of`: its indented body, to the first sentence it does not)."""
    names = signature_line(signature.text).strip()
    h = signature.passage(hits)
    out: list[str] = []
    for x in split_sentences(h.text) if h is not None else ():
        if x.start < signature.end:
            continue
        if names not in signature_of(h.text, x.start):
            break
        out.append(x.text)
    return out
