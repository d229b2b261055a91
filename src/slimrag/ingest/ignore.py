"""Ignore patterns (gitignore syntax) matched in time linear in the path: a hostile ``.gitignore``
cannot hang a walk.

Why not `pathspec`'s own matching: it turns each pattern into a Python regular expression, and
Python's engine backtracks. Every ``**`` becomes ``(?:/.+)?`` and every ``*`` ``[^/]*``, so a
pattern with k of them tries every way of cutting the path into k pieces: ``*a*a*a*a*a*a*b``
against a name of 60 ``a`` took 3.6 s, ``**/a/**/a/**/a/**/a/**/a/**/a/**/b`` against a path 40
folders deep 1.9 s, per entry of the walk, and each added wildcard multiplies it by the path's
length. A repository's ``.gitignore`` is the input of whoever wrote the repository, so ``build``,
``sync`` and ``watch`` of a cloned folder would hang.

How: `pathspec` still parses each line (`GitWildMatchPattern.pattern_to_regex`: negation,
anchoring, folder-only patterns, classes, escapes, exactly git's rules as before), and the regular
expression it writes runs on one of two engines:

- Python's, when the expression has at most one repeat that crosses ``/`` (``**``) and one that
  does not (``*``): ``*.pyc``, ``build/``, ``docs/**/*.md``, most lines of any real file. Its
  backtracking is then bounded by the path's length times a name's (255 characters), and it is
  the faster engine (10,000 checks of 5 such patterns: 18 ms, against 28 ms for `pathspec`);
- otherwise a Thompson automaton (`Automaton`), built from the standard library's own parse of
  the expression and run on all its states at once, as a DFA made lazily (each step from a set of
  states on a character is computed once and cached, up to `DFA_CACHE` steps per pattern): one
  match costs O(length of the path) dictionary lookups whatever the pattern. The two hostile
  patterns above take under a millisecond on a 4,000-character path.

The expressions `pathspec` writes use literals, classes, ``.``, repeats, groups, alternation and
``^``/``$``; anything else (it never writes one) makes the pattern refused. One difference of the
automaton from Python's engine: ``$`` matches only at the very end of the path, not also before a
final newline (a file name ending in a newline is matched as git would).

Bounds (`MAX_PATTERN_CHARS`, `MAX_AUTOMATON_STATES`): a pattern line longer than 512 characters,
or whose automaton would have more than 2,048 states, is not used: it is logged as a warning
naming the file and line, and the rest of the file still applies. A pattern of a real
``.gitignore`` is a few dozen characters; the bounds keep a step the cache has not seen (a set
operation per state) cheap enough that a walk stays fast on any path. Not configurable: shorten
the pattern.

`IgnoreRules` is the compiled set: the last pattern that matches decides (a ``!`` pattern
includes again), as in git and `pathspec.PathSpec`.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pathspec.util import normalize_file

log = logging.getLogger("slimrag.ingest")

try:  # the standard library's regular-expression parser: `re._parser` from 3.11, `sre_parse` before
    from re import _constants as _c
    from re import _parser as _sre
except ImportError:  # pragma: no cover  (Python 3.10)
    import sre_constants as _c  # type: ignore[no-redef]
    import sre_parse as _sre  # type: ignore[no-redef]

#: pattern lines longer than this are not used (module header)
MAX_PATTERN_CHARS = 512
#: patterns whose automaton has more states than this are not used (module header)
MAX_AUTOMATON_STATES = 2048
#: (state set, character) steps remembered per pattern before the cache starts over
DFA_CACHE = 4096

Pred = Callable[[str], bool]


class PatternError(ValueError):
    """A pattern that is not used: too long, too complex, or an expression this matcher cannot run."""


# -- the automaton ----------------------------------------------------------------------------------
# A state is one of: ("char", pred, next), ("split", a, b), ("at", kind, next), ("match",).
_MATCH = ("match",)


class Automaton:
    """A Thompson automaton of one regular expression, run with every live state at once
    (module header). `search` has the meaning of `re.Pattern.search`, in O(states × len(text))."""

    def __init__(self, expr: str) -> None:
        self.states: list[tuple] = []
        try:
            tree = _sre.parse(expr)
        except re.error as e:
            raise PatternError(f"not a regular expression ({e})") from e
        self._match = self._add(_MATCH)
        self.start = self._seq(list(tree), self._match)
        self._dfa: dict[tuple[frozenset[int], str], frozenset[int]] = {}
        self._first = self._close([self.start], begin=True)
        self._end: dict[frozenset[int], bool] = {}

    def _add(self, state: tuple) -> int:
        if len(self.states) >= MAX_AUTOMATON_STATES:
            raise PatternError(f"over {MAX_AUTOMATON_STATES} automaton states")
        self.states.append(state)
        return len(self.states) - 1

    def _seq(self, items: list[tuple], nxt: int) -> int:
        """States for the sequence ``items`` followed by state ``nxt``; returns the entry state."""
        for op, arg in reversed(items):
            nxt = self._item(op, arg, nxt)
        return nxt

    def _item(self, op: object, arg: object, nxt: int) -> int:
        if op is _c.LITERAL:
            return self._add(("char", _eq(arg), nxt))
        if op is _c.NOT_LITERAL:
            return self._add(("char", _ne(arg), nxt))
        if op is _c.ANY:
            return self._add(("char", _not_newline, nxt))
        if op is _c.IN:
            return self._add(("char", _in(arg), nxt))
        if op is _c.SUBPATTERN:
            _group, add_flags, del_flags, sub = arg  # type: ignore[misc]
            if add_flags & ~re.UNICODE or del_flags:
                raise PatternError("inline flags are not supported")
            return self._seq(list(sub), nxt)
        if op is _c.BRANCH:
            _, alternatives = arg  # type: ignore[misc]
            entries = [self._seq(list(alt), nxt) for alt in alternatives]
            entry = entries[-1]
            for e in reversed(entries[:-1]):
                entry = self._add(("split", e, entry))
            return entry
        if op in (_c.MAX_REPEAT, _c.MIN_REPEAT):  # greedy or lazy: the same set of matches
            return self._repeat(arg, nxt)  # type: ignore[arg-type]
        if op is _c.AT and arg in (_c.AT_BEGINNING, _c.AT_BEGINNING_STRING, _c.AT_END, _c.AT_END_STRING):
            return self._add(("at", arg, nxt))
        raise PatternError(f"the expression uses {op}, which this matcher does not run")

    def _repeat(self, arg: tuple, nxt: int) -> int:
        lo, hi, sub = arg
        body = list(sub)
        if lo > 100 or (hi != _c.MAXREPEAT and hi > 100):
            raise PatternError("a counted repeat over 100")
        if hi == _c.MAXREPEAT:  # sub{lo,}: lo copies, then a loop
            loop = self._add(("split", -1, nxt))  # patched below: -1 is the body's entry
            entry_body = self._seq(body, loop)
            self.states[loop] = ("split", entry_body, nxt)
            tail = loop
        else:  # sub{lo,hi}: lo copies, then hi - lo optional ones
            tail = nxt
            for _ in range(hi - lo):
                tail = self._add(("split", self._seq(body, tail), nxt))
        for _ in range(lo):
            tail = self._seq(body, tail)
        return tail

    def _close(self, entries: Iterable[int], begin: bool) -> frozenset[int]:
        """The states reachable from ``entries`` without reading a character: char states, the
        match state, and ``$`` states (decided at the end of the text). ``^`` passes only when
        ``begin`` (at position 0)."""
        stack = list(entries)
        seen: set[int] = set()
        out: set[int] = set()
        while stack:
            s = stack.pop()
            if s in seen:
                continue
            seen.add(s)
            state = self.states[s]
            kind = state[0]
            if kind == "split":
                stack.append(state[1])
                stack.append(state[2])
            elif kind == "at" and state[1] in (_c.AT_BEGINNING, _c.AT_BEGINNING_STRING):
                if begin:
                    stack.append(state[2])
            else:  # char, match, or an end assertion
                out.add(s)
        return frozenset(out)

    def _step(self, live: frozenset[int], ch: str) -> frozenset[int]:
        """The set after reading ``ch`` from ``live`` (a search restarts at every position, so
        the start state joins), cached: the automaton is turned into a DFA as it runs."""
        key = (live, ch)
        nxt = self._dfa.get(key)
        if nxt is None:
            if len(self._dfa) > DFA_CACHE:
                self._dfa.clear()
                self._end.clear()
            moved = [st[2] for s in live if (st := self.states[s])[0] == "char" and st[1](ch)]
            nxt = self._dfa[key] = self._close([*moved, self.start], begin=False)
        return nxt

    def _accepts_at_end(self, live: frozenset[int]) -> bool:
        """True when an end assertion in ``live`` leads to the match state at the end of the text."""
        stack = [self.states[s][2] for s in live if self.states[s][0] == "at"]
        seen: set[int] = set()
        while stack:
            s = stack.pop()
            if s in seen:
                continue
            seen.add(s)
            state = self.states[s]
            if state[0] == "match":
                return True
            if state[0] == "split":
                stack.extend((state[1], state[2]))
            elif state[0] == "at" and state[1] in (_c.AT_END, _c.AT_END_STRING):
                stack.append(state[2])
        return False

    def search(self, text: str) -> bool:
        """True when the expression matches somewhere in ``text`` (`re.search`, except that ``$``
        matches only at the very end, not also before a final newline)."""
        live, match, dfa = self._first, self._match, self._dfa
        if match in live:
            return True
        for ch in text:
            nxt = dfa.get((live, ch))
            live = nxt if nxt is not None else self._step(live, ch)
            if match in live:
                return True
        end = self._end.get(live)
        if end is None:
            end = self._end[live] = self._accepts_at_end(live)
        return end


def _not_newline(ch: str) -> bool:
    return ch != "\n"


def _eq(code: object) -> Pred:
    c = chr(code)  # type: ignore[arg-type]
    return c.__eq__


def _ne(code: object) -> Pred:
    c = chr(code)  # type: ignore[arg-type]
    return c.__ne__


def _in(items: object) -> Pred:
    """The predicate of a class ``[...]``: literals, ranges, negation (what pathspec writes)."""
    negate = False
    chars: set[str] = set()
    ranges: list[tuple[int, int]] = []
    for op, arg in items:  # type: ignore[attr-defined]
        if op is _c.NEGATE:
            negate = True
        elif op is _c.LITERAL:
            chars.add(chr(arg))
        elif op is _c.RANGE:
            ranges.append(arg)
        else:
            raise PatternError(f"a class with {op}, which this matcher does not run")

    def pred(ch: str) -> bool:
        o = ord(ch)
        hit = ch in chars or any(lo <= o <= hi for lo, hi in ranges)
        return hit != negate

    return pred


# -- the rules --------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Rule:
    """One pattern line: ``include`` True for an ignore pattern, False for a ``!`` pattern;
    ``search`` tells whether a path matches (Python's engine or an `Automaton`, module header)."""

    line: str
    include: bool
    search: Callable[[str], object]


def _unbounded(items: Iterable[tuple], counts: list[int]) -> None:
    """Count the unbounded repeats of a parsed expression: ``counts[0]`` those that can cross a
    ``/`` (``.+``, from ``**``), ``counts[1]`` those that cannot (``[^/]*``, from ``*``)."""
    for op, arg in items:
        if op in (_c.MAX_REPEAT, _c.MIN_REPEAT):
            lo, hi, sub = arg
            body = list(sub)
            if hi == _c.MAXREPEAT:
                crosses = any(o is _c.ANY for o, _ in body)
                counts[0 if crosses else 1] += 1
            _unbounded(body, counts)
        elif op is _c.SUBPATTERN:
            _unbounded(list(arg[3]), counts)
        elif op is _c.BRANCH:
            for alt in arg[1]:
                _unbounded(list(alt), counts)


def backtracks_little(expr: str) -> bool:
    """True when Python's engine matches ``expr`` in O(path length x 255) at worst: at most one
    repeat that crosses ``/`` and one that does not (``*.pyc``, ``docs/**/*.md``, ``build/``). Such
    patterns, most of any real ``.gitignore``, keep Python's faster engine; others run on an
    `Automaton`."""
    counts = [0, 0]
    _unbounded(list(_sre.parse(expr)), counts)
    return counts[0] <= 1 and counts[1] <= 1


def _compile_line(line: str) -> Rule | None:
    """The rule of one line, None for a blank or comment line; raises `PatternError`."""
    from pathspec.patterns.gitwildmatch import GitWildMatchPattern

    if len(line) > MAX_PATTERN_CHARS:
        raise PatternError(f"{len(line)} characters, over the {MAX_PATTERN_CHARS} limit")
    with warnings.catch_warnings():  # 'gitwildmatch' is deprecated in pathspec 1.x; same rules
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            expr, include = GitWildMatchPattern.pattern_to_regex(line)
        except ValueError as e:  # pathspec refuses some malformed lines
            raise PatternError(str(e)) from e
    if expr is None or include is None:
        return None
    automaton = Automaton(expr)  # also refuses what it cannot run, whichever engine is used
    return Rule(line, include, re.compile(expr).search if backtracks_little(expr) else automaton.search)


class IgnoreRules:
    """Compiled gitignore patterns (module header). ``origin`` names where they came from in
    warnings (``docs/.gitignore``); a line that cannot be used is warned about and left out."""

    def __init__(self, lines: Iterable[str], origin: str = "ignore patterns") -> None:
        self.rules: list[Rule] = []
        #: ``(line number, reason)`` of each line left out
        self.refused: list[tuple[int, str]] = []
        for n, line in enumerate(lines, 1):
            try:
                rule = _compile_line(line)
            except PatternError as e:
                self.refused.append((n, str(e)))
                log.warning("%s line %d: pattern not used (%s); shorten or simplify it", origin, n, e)
                continue
            if rule is not None:
                self.rules.append(rule)

    def check(self, path: str) -> bool | None:
        """True when the last pattern matching ``path`` ignores it, False when it is a ``!``
        pattern, None when none matches. ``path`` is relative, with ``/``; a folder ends in ``/``
        (normalised as `pathspec` does: a leading ``/`` or ``./`` dropped)."""
        path = normalize_file(path)
        for rule in reversed(self.rules):
            if rule.search(path):
                return rule.include
        return None

    def match(self, path: str) -> bool:
        """True when ``path`` is ignored (`check` is True)."""
        return self.check(path) is True
