"""A passage read once into its sections (`slimrag.rag.signatures.sections`): the runs of lines that
document one signature, from which `signature_of` answers every offset. Checked against the reading
it replaced: a sentence's signature is what the passage's lines up to the sentence's own line say, so
the last section of that prefix read alone gives it (later lines never change it)."""

from __future__ import annotations

import itertools

import pytest
from test_signatures import FLAGS, HTML, MARKDOWN, NESTED, UUID

from slimrag.rag.signatures import Section, sections, signature_of

PASSAGES = [(UUID, ""), (FLAGS, "re.rst.txt"), (NESTED, ""), (HTML, "re.html"), (MARKDOWN, "shutil.md"),
            (MARKDOWN, "shutil.txt")]


@pytest.mark.parametrize(("text", "source"), PASSAGES)
def test_sections_cover_every_offset_in_runs_of_whole_lines(text: str, source: str) -> None:
    runs = sections(text, source)
    assert runs[0].start == 0 and runs[-1].end == len(text) + 1
    for a, b in itertools.pairwise(runs):
        assert a.end == b.start  # no gap, no overlap
        assert text[b.start - 1] == "\n"  # a run begins a line
        assert a.signature != b.signature  # runs are as long as they go


@pytest.mark.parametrize(("text", "source"), PASSAGES)
def test_every_offset_is_signed_as_the_lines_up_to_it_say(text: str, source: str) -> None:
    for start in range(len(text) + 1):
        line_end = text.find("\n", start)
        prefix = text if line_end < 0 else text[:line_end]
        assert signature_of(text, start, source) == sections(prefix, source)[-1].signature, start


def test_a_passage_is_read_once_and_markdown_only_by_its_source() -> None:
    assert sections(MARKDOWN, "shutil.md") is sections(MARKDOWN, "other.MD")  # kept, keyed by its form
    assert Section(0, len(MARKDOWN) + 1, "") == sections(MARKDOWN, "shutil.txt")[0]  # no heading outside Markdown
    assert "shutil.rmtree(path, ignore_errors=False)" in [r.signature for r in sections(MARKDOWN, "shutil.md")]
