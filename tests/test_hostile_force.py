"""``build --force`` and ``Index.build(..., overwrite=True)`` delete only an index, and only once its
replacement is built (issue 27, item 6).

An index is recognised by its manifest parsing as one (format and required fields), not by a file
named ``manifest.json``: a browser extension's folder holds one too. The replacement is built in a
hidden sibling folder and swapped in by renames, so a rebuild that fails (here: a real HTTP
embedder that starts answering 500 mid-build) leaves the old index whole and openable. The
embedder is the stdlib OpenAI-compatible server of the tests (`openai_server`), so nothing is
mocked and no model is loaded.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from openai_server import OpenAIServer

from slimrag.cli import cli
from slimrag.embed.remote import RemoteEmbedder
from slimrag.errors import IndexFormatError, SlimragError
from slimrag.index.core import Index

#: a browser extension's manifest (Manifest V3), as found in any extension's source folder
EXTENSION_MANIFEST = {"manifest_version": 3, "name": "Tab Notes", "version": "1.2.0",
                      "background": {"service_worker": "src/background.js"}, "permissions": ["storage"]}


#: the model the test server serves
MODEL = "test-model"


def _remote(server: OpenAIServer) -> list[str]:
    """The build flags that embed through ``server``."""
    return ["--embedder-url", server.base_url, "--embedder-model", MODEL]


@pytest.fixture()
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as srv:
        yield srv


def _extension(folder: Path) -> Path:
    (folder / "src").mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps(EXTENSION_MANIFEST))
    (folder / "src" / "background.js").write_text("chrome.runtime.onInstalled.addListener(() => {});\n")
    return folder


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _siblings(folder: Path) -> list[str]:
    """Names beside ``folder`` other than itself: a replacement must leave none behind."""
    return sorted(p.name for p in folder.parent.iterdir() if p != folder)


def test_force_refuses_a_foreign_manifest_and_keeps_the_files(tmp_path: Path, server: OpenAIServer) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("zebra stripes are black and white")
    ext = _extension(tmp_path / "out" / "extension")
    before = _files(ext)
    result = CliRunner().invoke(cli, ["build", str(docs), "-o", str(ext), "--force", *_remote(server)])
    assert result.exit_code == 2, result.output
    assert "not a slimrag index" in result.output and "--force never deletes" in result.output
    assert _files(ext) == before
    with pytest.raises(IndexFormatError, match="not a slimrag index"):
        Index.build(str(docs), ext, embedder=RemoteEmbedder(server.base_url, MODEL), overwrite=True)
    assert _files(ext) == before
    assert _siblings(ext) == []  # no sibling folder was made for a refused replacement


@pytest.mark.parametrize("manifest", [
    {"format": 1},  # the right format number, but none of an index's fields
    {"format": 2, "storage": "flat", "embedder": {"id": "x", "dim": 3}, "config": {}},  # a format we do not read
    [1, 2, 3],  # JSON, not an object
])
def test_a_manifest_must_parse_as_an_index(tmp_path: Path, server: OpenAIServer, manifest: object) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps(manifest))
    (out / "keep.txt").write_text("mine")
    with pytest.raises(IndexFormatError, match="not a slimrag index"):
        Index.build([("a.txt", "zebra")], out, embedder=RemoteEmbedder(server.base_url, MODEL), overwrite=True)
    assert (out / "keep.txt").read_text() == "mine"


def test_a_failing_rebuild_leaves_the_old_index(tmp_path: Path, server: OpenAIServer) -> None:
    out = tmp_path / "idx.slimrag"
    embedder = RemoteEmbedder(server.base_url, MODEL)
    Index.build([("old.txt", "the lighthouse keeper lights the lamp at dusk")], out, embedder=embedder).close()
    before = _files(out)
    server.fail_status = 500  # the embedder fails after the create, in the add of the rebuild
    with pytest.raises(SlimragError):
        Index.build([("new.txt", "penguins nest on the ice")], out, embedder=embedder, overwrite=True)
    assert _files(out) == before
    assert _siblings(out) == []  # the half-built replacement is gone
    server.fail_status = None
    with Index.open(out, embedder) as idx:
        assert [h.source for h in idx.search("lighthouse lamp", k=1, mode="keyword")] == ["old.txt"]


def test_a_successful_rebuild_replaces_the_index(tmp_path: Path, server: OpenAIServer) -> None:
    out = tmp_path / "idx.slimrag"
    embedder = RemoteEmbedder(server.base_url, MODEL)
    Index.build([("old.txt", "the lighthouse keeper lights the lamp at dusk")], out, embedder=embedder).close()
    with Index.build([("new.txt", "penguins nest on the ice")], out, embedder=embedder, overwrite=True) as idx:
        assert idx.root == out
        assert [d.source for d in idx.documents()] == ["new.txt"]
        assert idx.last_report is not None and idx.last_report.added == 1
    assert _siblings(out) == []
    with Index.open(out, embedder) as idx:
        assert [h.source for h in idx.search("penguins ice", k=1, mode="keyword")] == ["new.txt"]


def test_cli_force_failing_rebuild_keeps_the_old_index(tmp_path: Path, server: OpenAIServer) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("zebra stripes are black and white")
    out = tmp_path / "idx.slimrag"
    ok = CliRunner().invoke(cli, ["build", str(docs), "-o", str(out), *_remote(server)])
    assert ok.exit_code == 0, ok.output
    before = _files(out)
    server.fail_status = 500
    failed = CliRunner().invoke(cli, ["build", str(docs), "-o", str(out), "--force", *_remote(server)])
    assert failed.exit_code != 0
    assert _files(out) == before and _siblings(out) == ["docs"]
    server.fail_status = None
    again = CliRunner().invoke(cli, ["build", str(docs), "-o", str(out), "--force", *_remote(server)])
    assert again.exit_code == 0, again.output
    assert _siblings(out) == ["docs"]


def test_create_with_overwrite_replaces_only_after_it_succeeds(tmp_path: Path, server: OpenAIServer) -> None:
    """`Index.create(overwrite=True)` follows the same rule: a create that fails (the embedder's
    dimension probe answered 500) leaves the old index; one that succeeds replaces it."""
    out = tmp_path / "idx.slimrag"
    Index.build([("old.txt", "the lighthouse keeper")], out, embedder=RemoteEmbedder(server.base_url, MODEL)).close()
    before = _files(out)
    server.fail_status = 500
    with pytest.raises(SlimragError):
        Index.create(out, embedder=RemoteEmbedder(server.base_url, MODEL), overwrite=True)  # dim unknown: probes
    assert _files(out) == before and _siblings(out) == []
    server.fail_status = None
    with Index.create(out, embedder=RemoteEmbedder(server.base_url, MODEL), overwrite=True) as idx:
        assert idx.documents() == []
    assert _siblings(out) == []


def test_a_replaced_index_keeps_the_folder_mode(tmp_path: Path, server: OpenAIServer) -> None:
    """The replacement is built in a temporary folder (mode 0700): it gets the old index's mode, so
    a server reading the index as another user still can."""
    out = tmp_path / "idx.slimrag"
    embedder = RemoteEmbedder(server.base_url, MODEL)
    Index.build([("a.txt", "the lighthouse keeper")], out, embedder=embedder).close()
    out.chmod(0o750)
    Index.build([("b.txt", "penguins nest on the ice")], out, embedder=embedder, overwrite=True).close()
    assert out.stat().st_mode & 0o777 == 0o750
