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

from slimrag.index.slim.graph import GraphConfig
from slimrag.index.slim.pq import PQConfig

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

