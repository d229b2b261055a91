"""`SlimArtifacts`: what one slim generation stores on disk (graph, PQ, codes, hubs, entry layer)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slimrag.errors import IndexFormatError
from slimrag.index.store.slim.graph import (
    INDICES_FILE,
    INDPTR_FILE,
    Graph,
)
from slimrag.index.store.slim.pq import (
    CODEBOOKS_FILE,
    CODES_FILE,
    ROTATION_FILE,
    ProductQuantizer,
    load_pq,
    save_pq,
)

HUB_ROWS_FILE = "hub_rows.npy"
HUB_VECTORS_FILE = "hub_vectors.npy"
ENTRY_ROWS_FILE = "entry_rows.npy"
META_FILE = "slim.json"
FORMAT_VERSION = 1
SLIM_FILES = (
    INDPTR_FILE, INDICES_FILE, CODEBOOKS_FILE, CODES_FILE, HUB_ROWS_FILE, HUB_VECTORS_FILE, ENTRY_ROWS_FILE, META_FILE,
)


@dataclass(frozen=True, slots=True)
class SlimArtifacts:
    """What one generation of a slim index stores: graph, PQ, codes, hubs and the PQ error bound."""

    graph: Graph
    pq: ProductQuantizer
    codes: np.ndarray
    hub_rows: np.ndarray
    hub_vectors: np.ndarray
    entry_rows: np.ndarray
    pq_error: float
    #: mean `ProductQuantizer.direction_error` of the rows the codebooks were trained for: the
    #: baseline of the drift check of incremental updates; None for generations written before it
    pq_mse: float | None = None
    #: build-time calibration of the adaptive rerank depth (`build.calibrate_stop`): rows of
    #: (stop margin, recall@10, median rows recomputed) by increasing margin, measured on sample
    #: rows used as queries; `SlimSearcher` picks the smallest margin reaching
    #: `SearchConfig.recall`. None for generations written before it (fixed depth ``rerank``)
    stop_table: tuple[tuple[float, float, float], ...] | None = None
    #: a random id written by `save` (None for generations written before it): what tells two
    #: generations apart when one folder's name is used again (`vcache.shared` keys on it)
    build_id: str | None = None

    @property
    def n(self) -> int:
        """Number of rows."""
        return self.graph.n

    @property
    def dim(self) -> int:
        """Embedding dimension."""
        return self.pq.dim

    def save(self, folder: str | Path) -> None:
        """Write every artifact into ``folder`` (created if missing). The caller fsyncs and renames
        the folder into place; nothing here touches other files."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.graph.save(folder)
        save_pq(folder, self.pq, self.codes)
        np.save(folder / HUB_ROWS_FILE, self.hub_rows.astype(self.graph.indices.dtype))
        np.save(folder / HUB_VECTORS_FILE, self.hub_vectors.astype(np.float16))
        np.save(folder / ENTRY_ROWS_FILE, self.entry_rows.astype(self.graph.indices.dtype))
        meta = {"format": FORMAT_VERSION, "n": self.n, "dim": self.dim, "bits": self.pq.bits, "pq_error": self.pq_error,
                "pq_mse": self.pq_mse, "stop_table": None if self.stop_table is None else [list(r) for r in self.stop_table],
                "build_id": uuid.uuid4().hex}
        (folder / META_FILE).write_text(json.dumps(meta, indent=1))

    @classmethod
    def load(cls, folder: str | Path, mmap: bool = True) -> SlimArtifacts:
        """Read what :meth:`save` wrote; large arrays are memory-mapped by default. Raises
        IndexFormatError when a file is missing or corrupt or the format version is unknown."""
        folder = Path(folder)
        try:
            meta = json.loads((folder / META_FILE).read_text())
            if meta.get("format") != FORMAT_VERSION:
                raise IndexFormatError(
                    f"{folder} holds slim format {meta.get('format')!r}, this slimrag reads {FORMAT_VERSION}; rebuild the index"
                )
            pq, codes = load_pq(folder, int(meta["bits"]), mmap=mmap)
            art = cls(
                graph=Graph.load(folder, mmap=mmap),
                pq=pq,
                codes=codes,
                hub_rows=np.load(folder / HUB_ROWS_FILE).astype(np.int64),
                hub_vectors=np.load(folder / HUB_VECTORS_FILE),
                entry_rows=np.load(folder / ENTRY_ROWS_FILE).astype(np.int64),
                pq_error=float(meta["pq_error"]),
                pq_mse=None if meta.get("pq_mse") is None else float(meta["pq_mse"]),
                stop_table=None if not meta.get("stop_table") else tuple(
                    (float(m), float(r), float(c)) for m, r, c in meta["stop_table"]),
                build_id=meta.get("build_id"),
            )
        except (OSError, KeyError, ValueError) as exc:  # missing file, truncated .npy, bad JSON
            raise IndexFormatError(f"slim index files in {folder} are missing or corrupt ({exc}); rebuild the index") from exc
        if len(art.codes) != art.n or art.n != meta["n"]:
            raise IndexFormatError(f"{folder}: graph has {art.n} rows, codes {len(art.codes)}, manifest {meta['n']}; rebuild")
        return art


def slim_bytes(folder: str | Path) -> dict[str, float]:
    """Bytes on disk of a saved slim generation: per file, ``per_vector`` (graph + codes + hubs,
    the part that grows with n, divided by n), ``fixed`` (codebooks, the PQ rotation when there is
    one, and metadata: independent of n) and ``total_per_vector`` (everything divided by n)."""
    folder = Path(folder)
    sizes = {name: (folder / name).stat().st_size for name in SLIM_FILES}
    if (folder / ROTATION_FILE).exists():
        sizes[ROTATION_FILE] = (folder / ROTATION_FILE).stat().st_size
    n = json.loads((folder / META_FILE).read_text())["n"]
    fixed = sizes[CODEBOOKS_FILE] + sizes[META_FILE] + sizes.get(ROTATION_FILE, 0)
    scaling = sum(sizes.values()) - fixed
    return {**sizes, "n": n, "per_vector": scaling / n, "fixed": fixed, "total_per_vector": (scaling + fixed) / n}
