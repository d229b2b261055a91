"""Fuzzing of issue 27's bounds with hypothesis: ignore patterns against `pathspec` as the reference,
and the JSON and table readers against their stated multiples (`slimrag.ingest.bounds`).
"""

from __future__ import annotations

import csv
import io
import json
import warnings
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from slimrag.ingest.bounds import (
    JSON_EXPANSION,
    KEY_PATH_CHARS,
    TABLE_EXPANSION,
    limit_for,
    output_chars,
)
from slimrag.ingest.ignore import IgnoreRules
from slimrag.ingest.outcome import PARSE_ERROR, TOO_LARGE, SkipFile
from slimrag.ingest.readers import read_json
from slimrag.ingest.tables import read_table

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import pathspec

GLOB_ATOMS = st.sampled_from(["a", "b", "*", "**", "?", "[ab]", "[!a]", "[a-c]", "/", "\\*", ".", "!", "#", " "])
globs = st.lists(GLOB_ATOMS, min_size=1, max_size=8).map("".join)
paths = st.text(alphabet="ab/.c*", max_size=16)


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(globs, min_size=1, max_size=4), path=paths)
def test_ignore_rules_decide_as_pathspec_does(lines: list[str], path: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            reference = pathspec.PathSpec.from_lines("gitwildmatch", lines)
        except ValueError:  # a line pathspec refuses is refused here too (left out, with a warning)
            return
    assert IgnoreRules(lines).check(path) == reference.check_file(path).include


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=300), children, max_size=6),
    max_leaves=60,
)


@settings(max_examples=200, deadline=None)
@given(value=json_values)
def test_json_output_is_within_its_multiple(value: object) -> None:
    data = json.dumps(value, ensure_ascii=False).encode()
    try:
        sections = read_json(data, Path("f.json"))
    except SkipFile as e:
        assert e.kind == TOO_LARGE
        return
    assert output_chars(sections) <= limit_for(len(data), JSON_EXPANSION)
    if isinstance(value, (dict, list)):  # each line is "path: value", the path cut to its bound
        for section in sections:
            for line in section.text.splitlines():
                key, sep, _ = line.partition(": ")
                assert not sep or len(key) <= KEY_PATH_CHARS, line  # a path's part, or a short value


cells = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\r\n"), max_size=150)


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.lists(cells, min_size=1, max_size=12), min_size=1, max_size=30))
def test_table_output_is_within_its_multiple(rows: list[list[str]]) -> None:
    buf = io.StringIO()
    csv.writer(buf).writerows(rows)
    data = buf.getvalue().encode()
    try:
        sections = read_table(data, Path("t.csv"))
    except SkipFile as e:
        assert e.kind in (TOO_LARGE, PARSE_ERROR)
        return
    assert output_chars(sections) <= limit_for(len(data), TABLE_EXPANSION)
