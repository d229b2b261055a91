"""A hostile ``.gitignore`` cannot hang the walk (issue 27, item 5): `slimrag.ingest.ignore` against
`pathspec`'s own matching as the reference, and a real deep folder tree walked within a second.
"""

from __future__ import annotations

import random
import re
import time
import warnings
from pathlib import Path

import pytest

from slimrag.ingest.crawl import crawl
from slimrag.ingest.ignore import MAX_PATTERN_CHARS, Automaton, IgnoreRules, backtracks_little
from slimrag.ingest.outcome import IGNORED, Skipped

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import pathspec
    from pathspec.patterns.gitwildmatch import GitWildMatchPattern

#: patterns on which pathspec's regular expressions backtrack (module header of ingest.ignore):
#: stars inside one name, and ``**`` folders against a deep path
HOSTILE = ["*a*a*a*a*a*a*a*a*a*a*b", "**/a/**/a/**/a/**/a/**/a/**/a/**/a/**/b", "a/**/a/**/a/**/a/**/a/**/c/"]


def _pathspec(lines: list[str]) -> pathspec.PathSpec:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return pathspec.PathSpec.from_lines("gitwildmatch", lines)


def test_the_automaton_agrees_with_python_regex_on_random_globs() -> None:
    """Every expression pathspec writes for random globs (stars, classes, escapes, anchors,
    folder patterns), against random paths: the automaton and `re.search` agree, case by case."""
    rng = random.Random(27)
    atoms = ["a", "b", "*", "**", "?", "[ab]", "[!a]", "[a-c]", "/", "\\*", ".", "x", "!", "#", " "]
    compared = 0
    for _ in range(1500):
        glob = "".join(rng.choice(atoms) for _ in range(rng.randint(1, 8)))
        glob = ("/" if rng.random() < 0.2 else "") + glob + ("/" if rng.random() < 0.2 else "")
        try:
            expr, _ = GitWildMatchPattern.pattern_to_regex(glob)
        except ValueError:
            continue
        if expr is None:
            continue
        rx, au = re.compile(expr), Automaton(expr)
        for _ in range(15):
            path = "".join(rng.choice("ab/x.c*") for _ in range(rng.randint(0, 14)))
            assert au.search(path) == bool(rx.search(path)), (glob, expr, path)
            compared += 1
    assert compared > 10_000


def test_rules_agree_with_pathspec_on_a_real_gitignore() -> None:
    """The last matching pattern decides, negations include again, folder-only patterns need the
    trailing slash: the same answers as `pathspec.PathSpec` on a typical file."""
    lines = ["# build output", "*.pyc", "build/", "/dist", "node_modules", "docs/**/*.md", "!docs/keep.md",
             "**/tmp/**", "*.min.*", "\\#notes", "logs/*.log", "!logs/important.log", ""]
    ours, theirs = IgnoreRules(lines), _pathspec(lines)
    paths = ["a.pyc", "src/a.pyc", "build/", "build", "src/build/", "dist", "src/dist", "node_modules/",
             "x/node_modules", "docs/a/b.md", "docs/keep.md", "docs/b.md", "a/tmp/b", "tmp", "app.min.js",
             "#notes", "logs/a.log", "logs/important.log", "logs/x/a.log", "readme.md"]
    for p in paths:
        assert ours.match(p) == theirs.match_file(p), p
        assert ours.check(p) == theirs.check_file(p).include, p


def test_common_patterns_keep_pythons_engine_and_hostile_ones_do_not() -> None:
    for glob in ["*.pyc", "build/", "docs/**/*.md", "/dist", "**/node_modules"]:
        assert backtracks_little(GitWildMatchPattern.pattern_to_regex(glob)[0]), glob
    for glob in HOSTILE:
        assert not backtracks_little(GitWildMatchPattern.pattern_to_regex(glob)[0]), glob


def test_an_overlong_pattern_is_left_out_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    rules = IgnoreRules(["*.log", "a" * (MAX_PATTERN_CHARS + 1), "*.tmp"], "docs/.gitignore")
    assert [n for n, _ in rules.refused] == [2]
    assert "docs/.gitignore line 2: pattern not used" in caplog.text
    assert rules.match("x.log") and rules.match("x.tmp")


def test_hostile_gitignore_against_a_deep_tree_is_walked_within_a_second(tmp_path: Path) -> None:
    """A real tree 200 folders deep with 255-character names of ``a``, and a ``.gitignore`` of the
    patterns pathspec backtracks on: the walk takes under a second, and
    the patterns still apply (one that matches ignores its file)."""
    root = tmp_path / "repo"
    root.mkdir()
    (root / ".gitignore").write_text("\n".join([*HOSTILE, "*a*a*a*a*a*a*a*a*a*a*c"]) + "\n")
    d = root
    for _ in range(200):
        d = d / "a"
    d.mkdir(parents=True)
    long_name = "a" * 250
    (d / f"{long_name}.txt").write_text("deep file, no ignore pattern matches it\n")
    (d / f"{long_name}c").write_text("ignored: the last pattern matches this name\n")
    (root / "top.txt").write_text("top\n")
    skipped: list[Skipped] = []
    start = time.perf_counter()
    found = [f.source for f in crawl(root, skipped=skipped)]
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, f"walk took {elapsed:.2f} s"
    deep = "/".join(["a"] * 200)
    assert found == ["top.txt", f"{deep}/{long_name}.txt"]
    assert [(s.source, s.kind) for s in skipped if s.source != ".gitignore"] == [(f"{deep}/{long_name}c", IGNORED)]


def test_pathspec_itself_backtracks_on_the_hostile_patterns() -> None:
    """The reason for the matcher: pathspec takes longer on a name of 24 characters than the
    automaton on one of 4,000 (each character more doubles pathspec's time: 40 took 40 s here)."""
    spec = _pathspec([HOSTILE[0]])
    start = time.perf_counter()
    spec.match_file("a" * 24)
    slow = time.perf_counter() - start
    start = time.perf_counter()
    IgnoreRules([HOSTILE[0]]).match("a" * 4000)
    fast = time.perf_counter() - start
    assert fast < slow, (fast, slow)


def test_sync_paths_rules_use_the_same_matcher(tmp_path: Path) -> None:
    """``sync PATHS`` and ``watch`` judge each named path by the ignore files on its way
    (`index.sync._Rules`), not through the walk: the same hostile ``.gitignore`` against a deep
    path is decided within a second, and a pattern that matches still ignores."""
    from slimrag.index.sync import _Rules

    root = tmp_path / "repo"
    d = root / "/".join(["a"] * 60)
    d.mkdir(parents=True)
    (root / ".gitignore").write_text("\n".join([*HOSTILE, "*a*a*a*a*a*a*a*a*a*a*c"]) + "\n")
    kept, ignored = d / ("a" * 200 + ".txt"), d / ("a" * 200 + "c")
    kept.write_text("kept\n")
    ignored.write_text("ignored\n")
    start = time.perf_counter()
    rules = _Rules(root, ())
    verdicts = (rules.admits(kept), rules.admits(ignored))
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, f"took {elapsed:.2f} s"
    assert verdicts == (True, False)
