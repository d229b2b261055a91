"""`SlimConfig`: the knobs a slim generation is built with (and its open-time cache budget),
validated; see the package header for trade-offs.

It is written into the index manifest, so it holds only what is fixed for a generation: graph,
PQ, hubs, entry layer, the error quantile behind early stop, and ``cache_bytes`` (memory only,
sized when the index is opened). The per-query knobs (ef, rerank, wave, early_stop) are in
`slimrag.config.SearchConfig`; manifests written before the move still carry them, and
`SlimConfig.from_dict` drops those keys.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from slimrag.index.store.slim.pq import PQConfig

#: how a partition's candidate pool is found (`GraphConfig.pool`; `slimrag.index.store.slim.pool`)
POOLS = ("auto", "exact", "hnsw", "hnsw-knn")


@dataclass(frozen=True, slots=True)
class GraphConfig:
    """Graph construction settings; see `slimrag.index.store.slim.graph`'s header for each knob's trade-off."""

    base_degree: int = 12
    max_degree: int = 32
    hub_fraction: float = 0.05
    candidates: int = 48
    alpha: float = 1.0
    long_range: int = 8
    block: int = 0
    seed: int = 0
    pool: str = "auto"
    exact_below: int = 50_000
    hnsw_m: int = 16
    hnsw_ef: int = 64
    partition_rows: int = 250_000
    overlap: int = 2

    def __post_init__(self) -> None:
        if not 1 <= self.base_degree <= self.max_degree:
            raise ValueError(
                f"need 1 <= base_degree <= max_degree, got base_degree={self.base_degree}, "
                f"max_degree={self.max_degree}"
            )
        if self.max_degree > 1024:
            raise ValueError(f"max_degree above 1024 is never useful, got {self.max_degree}")
        if self.candidates < self.max_degree:
            raise ValueError(f"candidates ({self.candidates}) must be >= max_degree ({self.max_degree})")
        if not 0.0 <= self.hub_fraction <= 1.0:
            raise ValueError(f"hub_fraction must be in [0, 1], got {self.hub_fraction}")
        if self.alpha < 1.0:
            raise ValueError(f"alpha must be >= 1.0, got {self.alpha}")
        if self.long_range < 0:
            raise ValueError(f"long_range must be >= 0, got {self.long_range}")
        if self.block < 0:
            raise ValueError(f"block must be >= 0 (0 = automatic), got {self.block}")
        if self.pool not in POOLS:
            raise ValueError(f"pool must be one of {POOLS}, got {self.pool!r}")
        if self.exact_below < 0 or self.hnsw_m < 2 or self.hnsw_ef < 1:
            raise ValueError(
                f"need exact_below >= 0, hnsw_m >= 2, hnsw_ef >= 1, got {self.exact_below}, {self.hnsw_m}, {self.hnsw_ef}"
            )
        if self.partition_rows < 1000 or self.overlap < 1:
            raise ValueError(f"need partition_rows >= 1000 and overlap >= 1, got {self.partition_rows}, {self.overlap}")


#: per-query knobs kept in manifests written before they moved to `SearchConfig`; dropped on read
MOVED_TO_SEARCH = ("ef", "rerank", "wave", "early_stop")


@dataclass(frozen=True, slots=True)
class SlimConfig:
    """The build knobs of a slim generation and its cache budget; see the package header (and
    graph.py, pq.py) for trade-offs. Query knobs are in `slimrag.config.SearchConfig`."""

    graph: GraphConfig = field(default_factory=GraphConfig)
    pq: PQConfig = field(default_factory=PQConfig)
    hubs: int = 0
    entry_points: int = 0
    entries: int = 4
    error_quantile: float = 0.999
    cache_bytes: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.hubs < 0 or self.entry_points < 0:
            raise ValueError(
                f"hubs and entry_points must be >= 0 (0 = automatic), got {self.hubs}, {self.entry_points}"
            )
        if self.entries < 1:
            raise ValueError(f"entries must be >= 1, got {self.entries}")
        if not 0.5 <= self.error_quantile <= 1.0:
            raise ValueError(f"error_quantile must be in [0.5, 1], got {self.error_quantile}")
        if self.cache_bytes < 0:
            raise ValueError(f"cache_bytes must be >= 0, got {self.cache_bytes}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (for a manifest)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SlimConfig:
        """Inverse of :meth:`to_dict`. The keys of `MOVED_TO_SEARCH` (old manifests) are dropped;
        other unknown keys raise TypeError rather than being dropped."""
        data = {k: v for k, v in data.items() if k not in MOVED_TO_SEARCH}
        graph = GraphConfig(**data.pop("graph", {}))
        pq = PQConfig(**data.pop("pq", {}))
        return cls(graph=graph, pq=pq, **data)

    def hub_count(self, n: int) -> int:
        """Hubs kept for ``n`` rows (resolves ``hubs=0``)."""
        if self.hubs:
            return min(self.hubs, n)
        return min(n, 4096, max(8, n // 512))

    def entry_count(self, n: int) -> int:
        """Entry-layer rows for ``n`` rows (resolves ``entry_points=0``)."""
        if self.entry_points:
            return min(self.entry_points, n)
        return min(n, 8192, max(64, n // 16))

