"""The vector stores of an open index, one per generation kind, behind one interface: opening a
generation with its delta parts, appending a committed part, and writing the next generation.

This is the one module that knows which kinds exist (`KINDS`): "flat" (`FlatVectors`: the exact
matrix) and "slim" (`SlimVectors`: graph + PQ codes, rows recomputed from text). Everything else
holds a `VectorStore` and asks it what it can do (``incremental``, ``wants_compaction``), never
which class it is.

Opening (`open_store`): the generation's arrays are memory-mapped, each delta part's vectors too
(`layout.map_delta_vectors`); nothing is read into memory but the chunk ids. A commit appends its
part the same way (`append_part`), so its cost does not grow with the rows already stored.

Writing the next generation (`write_next_generation`, the body of `compact`): the live rows,
one per chunk id, sorted by chunk id (`live_rows`: one argsort of the ids), are streamed in blocks
of `COPY_ROWS` from the store (`VectorStore.rows`: read for exact rows, re-embedded for slim graph
rows) to their file: a flat generation's ``vectors.npy`` directly, a slim build's float32 input to
a scratch file that `build_slim` reads memory-mapped (`layout.SCRATCH`, deleted after). No step
holds every float32 vector in memory: a flat compaction's peak is one block (~25 MB at d=384)
plus at most ``rows.RELEASE_BYTES`` (256 MB) of the mapped parts' pages, which the stream drops
from the process as it goes (`rows.release_file_pages`; before, all of them stayed resident). A slim
generation followed by a slim one is updated in place of a rebuild (`VectorStore.update_into`).
The slim package is imported only when a slim generation is opened or written.

Knob: `COPY_ROWS` (default 16,384): rows per block of that stream; larger blocks mean fewer
``write`` calls and more memory (``4 d`` bytes a row).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from slimrag.config import IndexConfig, SearchConfig
from slimrag.errors import IndexFormatError
from slimrag.index.store import layout
from slimrag.index.store.flat import FlatVectors
from slimrag.index.store.manifest import Manifest
from slimrag.index.store.recompute import Recompute
from slimrag.index.store.slim.rows import RELEASE_BYTES, release_file_pages

log = logging.getLogger("slimrag.index")

#: rows per block when a compaction streams vectors to a file
COPY_ROWS = 16_384

class VectorStore(Protocol):
    """What an open index asks of its vectors, whatever the generation kind."""

    #: the kind written to the manifest for a generation of this store (a `KINDS` key)
    kind: str
    #: True when `update_into` writes the next generation more cheaply than a rebuild
    incremental: bool

    @property
    def ids(self) -> np.ndarray: ...

    @property
    def live(self) -> np.ndarray: ...

    def __len__(self) -> int: ...

    def append(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Add a committed delta part's rows, live, without touching earlier rows."""

    def set_live(self, live_ids: np.ndarray) -> None:
        """Mark as live exactly the rows whose chunk id is in ``live_ids``."""

    def kill(self, chunk_ids: np.ndarray) -> None:
        """Mark the rows of ``chunk_ids`` removed."""

    def rows(self, rows: np.ndarray) -> np.ndarray:
        """float32 vectors of the given rows, in that order."""

    def live_vectors(self) -> tuple[np.ndarray, np.ndarray]:
        """(chunk ids, float32 vectors) of the live rows sorted by chunk id, in memory."""

    def wants_compaction(self, share: float) -> bool:
        """Whether the automatic policy of `add` should compact now (see the writer)."""

    def update_into(self, root: Path, gen: int, manifest: Manifest) -> None:
        """Write generation ``gen`` of the index at ``root`` by updating this one, with the
        knobs ``manifest`` records (only when ``incremental``); the manifest switch is the caller's."""

    def generation_bytes(self, folder: Path) -> dict[str, float] | None:
        """Kind-specific byte figures of the generation folder, or None."""

    def search(self, queries: np.ndarray, k: int, allow: np.ndarray | None = None,
               config: SearchConfig | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k chunk ids and scores per query, best first."""


def _load_flat(root: Path, manifest: Manifest, gen: dict[str, np.ndarray], recompute: Recompute) -> VectorStore:
    return FlatVectors(np.asarray(gen["ids"], dtype=np.int64), gen["vectors"])  # ids are narrowed on disk


def _load_slim(root: Path, manifest: Manifest, gen: dict[str, np.ndarray], recompute: Recompute) -> VectorStore:
    from slimrag.index.store.slim.artifacts import SlimArtifacts  # slim's modules load with a slim index only
    from slimrag.index.store.slim.store import SlimVectors
    from slimrag.index.store.slim.vcache import shared

    folder = layout.gen_dir(root, manifest.generation)
    art = SlimArtifacts.load(folder)
    empty = FlatVectors(np.zeros(0, np.int64), np.zeros((0, art.dim), manifest.config.dtype))
    # one cache of recomputed rows per generation in this process: every handle shares it (a
    # generation written before build ids has a cache of its own, as every handle had before)
    cache = None if art.build_id is None else shared(folder, art.build_id, manifest.slim.cache_bytes, art.dim)
    return SlimVectors(gen["ids"], art, empty, recompute, manifest.slim, cache=cache)


def _write_flat(root: Path, gen: int, store: VectorStore, rows: np.ndarray, ids: np.ndarray,
                manifest: Manifest) -> None:
    def vectors(folder: Path) -> None:
        layout.write_npy(folder / "vectors.npy", manifest.config.dtype, (len(rows), manifest.dim), _blocks(store, rows))
    layout.write_generation(root, gen, {"ids": layout.narrow_ids(ids)}, writer=vectors)


def _write_slim(root: Path, gen: int, store: VectorStore, rows: np.ndarray, ids: np.ndarray,
                manifest: Manifest) -> None:
    from slimrag.index.store.slim.build import build_slim

    scratch = Path(root) / f"{layout.SCRATCH}{gen:06d}.npy"
    try:
        layout.write_npy(scratch, np.float32, (len(rows), manifest.dim), _blocks(store, rows))
        art = build_slim(np.load(scratch, mmap_mode="r"), manifest.slim)
        layout.write_generation(root, gen, {"ids": layout.narrow_ids(ids)}, writer=art.save)
    finally:
        scratch.unlink(missing_ok=True)


class Kind:
    """How one generation kind is opened and written."""

    def __init__(self, load: Callable[[Path, Manifest, dict[str, np.ndarray], Recompute], VectorStore],
                 write: Callable[[Path, int, VectorStore, np.ndarray, np.ndarray, Manifest], None]) -> None:
        self.load, self.write = load, write


#: the generation kinds, by the name the manifest records
KINDS: dict[str, Kind] = {
    FlatVectors.kind: Kind(_load_flat, _write_flat),
    "slim": Kind(_load_slim, _write_slim),  # `SlimVectors.kind`
}


def open_store(root: Path, manifest: Manifest, recompute: Recompute) -> tuple[VectorStore, list[str]]:
    """The vectors of ``manifest``'s generation and delta parts, and the parts that could not be
    read. A missing or unreadable part (damage: a crash never leaves one) is skipped with a
    warning, so the index still opens and searches; its chunks have no vector until
    `check(repair=True)`."""
    kind = KINDS.get(manifest.gen_kind)
    if kind is None:
        raise IndexFormatError(f"{root}: generation kind {manifest.gen_kind!r} is unknown to this slimrag "
                               f"(known: {', '.join(KINDS)}); upgrade slimrag or rebuild the index")
    store = kind.load(root, manifest, layout.read_generation(root, manifest.generation), recompute)
    return store, append_parts(store, root, manifest.delta_parts)


def append_parts(store: VectorStore, root: Path, names: Sequence[str]) -> list[str]:
    """Append the named delta parts to ``store`` (memory-mapped); returns the unreadable ones."""
    bad = []
    for name in names:
        try:
            ids, vecs = layout.read_delta_part(Path(root) / layout.DELTA / name, mmap=True)
        except (IndexFormatError, FileNotFoundError) as e:
            log.warning("%s; until then its chunks are found by keyword search only", e)
            bad.append(name)
            continue
        store.append(ids, vecs)
    return bad


def append_part(store: VectorStore, root: Path, name: str, ids: np.ndarray) -> None:
    """Append the part this process just wrote: its vectors mapped, its ids as given (no read)."""
    store.append(ids, layout.map_delta_vectors(Path(root) / layout.DELTA / name))


def live_rows(store: VectorStore) -> tuple[np.ndarray, np.ndarray]:
    """(rows, chunk ids) of the live rows, sorted by chunk id, one row per id: a chunk id present
    twice (a generation and a delta part, left by the race of unlocked writers of older versions)
    keeps its first row."""
    rows = np.flatnonzero(store.live)
    rows = rows[np.argsort(store.ids[rows], kind="stable")]
    ids = store.ids[rows]
    first = np.ones(len(ids), dtype=bool)
    first[1:] = ids[1:] != ids[:-1]
    return rows[first], ids[first]


def target_kind(config: IndexConfig, live: int) -> str:
    """The kind of the next generation: ``config.storage``, with "auto" resolved by size (slim
    from ``auto_slim_chunks`` live chunks on), and flat for an empty index (a graph needs a row)."""
    storage = config.storage
    if storage == "auto":
        storage = "slim" if live >= config.auto_slim_chunks else FlatVectors.kind
    return FlatVectors.kind if live == 0 else storage


def write_next_generation(root: Path, manifest: Manifest, store: VectorStore,
                          rebuild: bool = False) -> tuple[int, str]:
    """Write the generation that holds ``store``'s live rows (module header) under a new number;
    returns (number, kind). The manifest switch is the caller's. A store of the target kind that
    updates incrementally is updated unless ``rebuild``."""
    rows, ids = live_rows(store)
    kind = target_kind(manifest.config, len(ids))
    gen = layout.next_generation(root, manifest.generation)
    if not rebuild and store.incremental and store.kind == kind:
        store.update_into(root, gen, manifest)
        return gen, kind
    KINDS[kind].write(root, gen, store, rows, ids, manifest)
    return gen, kind


def _blocks(store: VectorStore, rows: np.ndarray) -> Iterator[np.ndarray]:
    read = 0
    for s in range(0, len(rows), COPY_ROWS):
        block = store.rows(rows[s: s + COPY_ROWS])
        yield block
        # Every delta part is a mapping of its own whose read pages would stay resident: all the
        # vectors at once by the end of the stream (1.4 GB of RSS at 1M rows). Drop them as it goes.
        read += block.nbytes
        if read >= RELEASE_BYTES:
            release_file_pages()
            read = 0
