"""The demo's corpus (`slimrag.demo.write_corpus`) is the same text on every run: pydoc prints a
default value's memory address, which changed every run and moved the chunk boundaries after it."""

from __future__ import annotations

from pathlib import Path

from slimrag import demo


def test_two_renderings_are_the_same_text_and_hold_no_address(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    assert demo.write_corpus(first) == demo.write_corpus(second) > 0
    for path in sorted(first.iterdir()):
        text = path.read_text(encoding="utf-8")
        assert text == (second / path.name).read_text(encoding="utf-8"), path.name
        assert not demo.ADDRESS.search(text), path.name
    assert "re.Pattern object>" in (first / "json.txt").read_text(encoding="utf-8")  # the value, without its address
