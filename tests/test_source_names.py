"""One naming rule for stored sources (`slimrag.ingest.source.source_name`): a file inside the
indexed folder by its path relative to it, any other file by its absolute path, whether it comes
from `build`, `add` (a file or a folder), `sync` or a partial sync; an index with no indexed
folder names every file absolutely. `remove`, `sync` and ``--source`` find files of both kinds by
the path the shell shows, and indexes built before the rule keep working.

Ground truth: the expected names are formed by the test itself from the paths it wrote
(``relative_to`` the folder, or ``resolve().as_posix()``), and the SHA-256 of each file's bytes.
The embedder is bench.crash's `HashEmbedder` (no model to load), as in tests/test_sync.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import write_tree

from bench.crash import HashEmbedder
from slimrag.cli import cli
from slimrag.index.core import Index
from slimrag.ingest.source import InputItem, PreparedDoc, prepare, source_name

DOCS = {"guide/cats.md": "# Cats\n\nCats purr when they are content.", "a.txt": "Anchors hold ships in the bay."}
NOTES = {"dogs.md": "# Dogs\n\nDogs bark at the postman.", "deep/eels.txt": "Eels swim up the river at night."}


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def stored(idx: Index) -> dict[str, str]:
    return {d.source: d.doc_id for d in idx.documents()}


def age(folder: Path) -> None:
    """Files that have existed a while, so a sync trusts their stat (see sync.RACY_S)."""
    t = time.time() - 100
    for p in folder.rglob("*"):
        os.utime(p, (t, t))


def expected(folder: Path, files: dict[str, str], inside: bool) -> dict[str, str]:
    """The names the rule gives ``files`` of ``folder``: relative when ``inside`` the indexed folder."""
    return {(name if inside else (folder / name).resolve().as_posix()): sha(folder / name) for name in files}


@pytest.fixture()
def trees(tmp_path: Path) -> tuple[Path, Path]:
    docs, notes = write_tree(tmp_path / "docs", DOCS), write_tree(tmp_path / "notes", NOTES)
    age(docs)
    age(notes)
    return docs, notes


def test_files_from_inside_and_outside_follow_one_rule_from_every_entry_point(trees: tuple[Path, Path],
                                                                              tmp_path: Path) -> None:
    docs, notes = trees
    root = docs.resolve()
    assert source_name(docs / "guide/cats.md", root) == "guide/cats.md"
    assert source_name(notes / "dogs.md", root) == (notes / "dogs.md").resolve().as_posix()
    assert source_name(notes / "dogs.md", None) == (notes / "dogs.md").resolve().as_posix()
    (tmp_path / "link").symlink_to(notes)  # a path through a symlink is named by its target
    assert source_name(tmp_path / "link/dogs.md", root) == (notes / "dogs.md").resolve().as_posix()

    truth = {**expected(docs, DOCS, True), **expected(notes, NOTES, False)}
    with Index.build(docs, tmp_path / "by-folder.slimrag", embedder=HashEmbedder()) as idx:
        idx.add(notes)  # a folder from outside
        assert stored(idx) == truth
    with Index.build(docs, tmp_path / "by-file.slimrag", embedder=HashEmbedder()) as idx:
        idx.add([notes / "dogs.md", docs / "guide/cats.md"])  # files named one by one, one inside
        idx.add([notes / "deep/eels.txt"])
        assert stored(idx) == truth
        rep = idx.sync(notes)  # sync names the folder's files as add did: nothing new, nothing removed
        assert (rep.added, rep.updated, rep.removed, rep.unchanged, rep.read) == (0, 0, 0, 2, 0)
        (notes / "dogs.md").write_text("# Dogs\n\nDogs sleep by the fire.")
        rep = idx.sync(notes, paths=["dogs.md"])  # a partial sync (what watch sends) too
        assert not rep.full and rep.files["updated"] == [(notes / "dogs.md").resolve().as_posix()]
        idx.add([("pairs/owls.md", "Owls hunt at night.")])  # a (source, text) pair keeps its name
        assert stored(idx) == {**expected(docs, DOCS, True), **expected(notes, NOTES, False),
                               "pairs/owls.md": hashlib.sha256(b"Owls hunt at night.").hexdigest()}


def test_an_index_with_no_indexed_folder_names_every_file_absolutely(tmp_path: Path) -> None:
    a = write_tree(tmp_path / "a", {"README.md": "Apples grow in orchard a."})
    b = write_tree(tmp_path / "b", {"README.md": "Bananas grow in orchard b."})
    age(a)
    age(b)
    with Index.build([a, b], tmp_path / "ab.slimrag", embedder=HashEmbedder()) as idx:
        assert idx.manifest.source_root is None
        # before the rule both were stored as "README.md": the second was dropped as a duplicate
        assert stored(idx) == {**expected(a, {"README.md": ""}, False), **expected(b, {"README.md": ""}, False)}
        (a / "README.md").unlink()
        rep = idx.sync(a)  # owns a's absolute prefix only
        assert rep.removed_sources == [(a / "README.md").resolve().as_posix()]
        assert stored(idx) == expected(b, {"README.md": ""}, False)


def test_remove_sync_and_source_find_both_kinds_by_the_path_the_shell_shows(
        trees: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs, notes = trees
    out = tmp_path / "docs.slimrag"
    Index.build(docs, out, embedder=HashEmbedder()).close()
    runner = CliRunner()
    res = runner.invoke(cli, ["add", str(out), str(notes)])
    assert res.exit_code == 0, res.output
    monkeypatch.chdir(tmp_path)
    for typed, source in (("docs/guide", "guide/cats.md"), ("notes/deep", (notes / "deep/eels.txt").resolve())):
        res = runner.invoke(cli, ["search", str(out), "night purr", "--mode", "keyword", "--json",
                                  "--source", typed])
        assert res.exit_code == 0, res.output
        assert {h["source"] for h in json.loads(res.stdout)} == {str(source)}
    res = runner.invoke(cli, ["remove", str(out), "notes/dogs.md", "docs/a.txt"])  # relative to the cwd
    assert res.exit_code == 0 and "removed 2 documents" in res.output, res.output
    with Index.open(out, embedder=HashEmbedder()) as idx:
        assert stored(idx) == {**expected(docs, {"guide/cats.md": ""}, True),
                               **expected(notes, {"deep/eels.txt": ""}, False)}
        (notes / "deep/eels.txt").unlink()
        rep = idx.sync(notes)  # mirrors the folder: eels.txt gone, dogs.md (removed above) back
        assert rep.removed_sources == [(notes / "deep/eels.txt").resolve().as_posix()]
        assert rep.files["added"] == [(notes / "dogs.md").resolve().as_posix()]
        assert stored(idx) == {**expected(docs, {"guide/cats.md": ""}, True),
                               **expected(notes, {"dogs.md": ""}, False)}


def test_indexes_built_before_the_rule_keep_working(trees: tuple[Path, Path], tmp_path: Path) -> None:
    docs, notes = trees
    # An index with an indexed folder stored outside files by absolute name before, as now: the
    # same file added again is recognised (unchanged), not stored twice.
    with Index.build(docs, tmp_path / "old.slimrag", embedder=HashEmbedder()) as idx:
        idx.add(notes)
        before = stored(idx)
        rep = idx.add(notes)
        assert (rep.unchanged, rep.added) == (2, 0) and stored(idx) == before
        assert idx.remove_matching([str(notes / "dogs.md")]).sources == [(notes / "dogs.md").resolve().as_posix()]

    # An index with no indexed folder stored a folder's files relative to that folder (the old
    # rule, written here through the writer as the old listing named them). They stay findable by
    # their stored name, and the first sync of the folder replaces them by the absolute names.
    with Index.create(tmp_path / "legacy.slimrag", embedder=HashEmbedder()) as idx:
        items = [InputItem(name, notes / name, None, (notes / name).stat().st_mtime) for name in NOTES]
        docs_ = [prepare(item, None, idx.chunker) for item in items]
        assert all(isinstance(d, PreparedDoc) for d in docs_)
        idx.write(d for d in docs_ if isinstance(d, PreparedDoc))
        assert stored(idx) == expected(notes, NOTES, True)
        assert [h.source for h in idx.search("postman", k=1, mode="keyword", source="dogs.md")] == ["dogs.md"]
        rep = idx.sync(notes)
        assert sorted(rep.removed_sources) == sorted(NOTES) and rep.added == 2
        assert stored(idx) == expected(notes, NOTES, False)
        assert idx.sync(notes).read == 0
