"""`Index.catch_up` after the folder under an open index was replaced (``slimrag build --force``:
`slimrag.index.replace.swap_in`): the open handle must drop the old folder's vectors, not keep them
mapped against the new catalog's chunk ids (two fresh builds both end at generation 1, flat, no
delta parts, so the manifests alone look alike)."""

from __future__ import annotations

from pathlib import Path

from bench.crash import HashEmbedder, docs
from slimrag.index.core import Index


def test_catch_up_after_a_forced_rebuild_searches_the_new_corpus(tmp_path: Path) -> None:
    root = tmp_path / "i"
    old, new = docs("a", 60, 1), docs("b", 60, 2)
    Index.build(old, root, embedder=HashEmbedder(), storage="flat").close()
    with Index.open(root, HashEmbedder()) as idx:
        assert idx.search(old[7][1], k=1, mode="vector")[0].source == "a/007.txt"
        Index.build(new, root, embedder=HashEmbedder(), storage="flat", overwrite=True).close()
        assert idx.catch_up()
        for source, text in (new[7], new[31], new[59]):
            hit = idx.search(text, k=1, mode="vector")[0]
            assert (hit.source, hit.text) == (source, text)
        assert all(h.source.startswith("b/") for h in idx.search(old[7][1], k=10, mode="vector"))
        assert not idx.catch_up()  # followed: nothing moved since


def test_catch_up_while_the_folder_is_missing_is_nothing_moved_yet(tmp_path: Path) -> None:
    """Between `swap_in`'s two renames the folder is gone: catch_up answers False (no error), and
    once a folder is back the next call reads it whole."""
    root, away = tmp_path / "i", tmp_path / "away"
    corpus = docs("a", 40, 1)
    Index.build(corpus, root, embedder=HashEmbedder(), storage="flat").close()
    with Index.open(root, HashEmbedder()) as idx:
        root.rename(away)
        assert idx.catch_up() is False
        Index.build(docs("b", 40, 2), root, embedder=HashEmbedder(), storage="flat").close()
        assert idx.catch_up() is True
        hit = idx.search(docs("b", 40, 2)[5][1], k=1, mode="vector")[0]
        assert hit.source == "b/005.txt"


def test_followed_index_reopens_when_the_rebuilt_folder_has_another_embedder(tmp_path: Path) -> None:
    """A ``build --force`` with another embedder (another dimension): `FollowedIndex.current` closes
    the old handle and opens the new index, whose embedder matches its vectors."""
    from slimrag.embed.synthetic import SyntheticEmbedder
    from slimrag.index.follow import FollowedIndex

    root = tmp_path / "i"
    Index.build(docs("a", 40, 1), root, embedder=SyntheticEmbedder(dim=32, topics=16), storage="flat").close()
    followed = FollowedIndex(root)
    first = followed.current()
    assert first.embedder.dim == 32
    new = docs("b", 40, 2)
    Index.build(new, root, embedder=SyntheticEmbedder(dim=48, topics=16), storage="flat", overwrite=True).close()
    second = followed.current()
    assert second is not first and second.embedder.dim == 48 and second.manifest.dim == 48
    assert {h.source for h in second.search(new[3][1], k=40, mode="vector")} == {s for s, _ in new}
    assert followed.current() is second
    followed.close()
