"""The benchmarks' sets are indexed once (`bench.datasets.saved_index`): the first call builds the
index from its inputs, later calls open the saved one without reading the inputs again."""

from __future__ import annotations

from pathlib import Path

from bench.datasets import saved_index
from slimrag.embed.local import LocalEmbedder

PAIRS = [("bread.txt", "Bread is baked at 230 degrees for half an hour in a hot oven."),
         ("cats.txt", "Whiskers sleeps on the warm windowsill every afternoon.")]


def test_built_once_then_opened_without_its_inputs(tmp_path: Path, embedder: LocalEmbedder) -> None:
    reads: list[int] = []

    def inputs() -> list[tuple[str, str]]:
        reads.append(1)
        return PAIRS

    path = tmp_path / "set.slimrag"
    with saved_index(path, inputs, storage="flat", embedder=embedder) as built:
        assert built.manifest.storage == "flat" and len(built.documents()) == 2
    with saved_index(path, inputs, storage="flat", embedder=embedder) as opened:
        assert opened.search("How hot is the oven for bread?", k=1)[0].source == "bread.txt"
    assert reads == [1]  # read to build, not to open
