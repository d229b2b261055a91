"""`ConnectionLimits`: the numbers that bound a server's connections (the knobs are explained in
`slimrag.api.connections`, which enforces them). Apart from it so the CLI reads the defaults
without importing uvicorn."""

from __future__ import annotations

import resource
from dataclasses import dataclass

#: Most sockets accepted each time the listening socket is readable (see "Accepting in bursts" in `slimrag.api.connections`).
ACCEPT_BATCH = 16


def default_max_connections() -> int:
    """Half the soft descriptor limit, between 16 and 4096 (why: `slimrag.api.connections`)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(16, min(4096, soft // 2))


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """How long a connection may take to send a request, and how many are held; see
    `slimrag.api.connections` for each knob's default and trade-off. ``max_connections`` None: `default_max_connections`."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int | None = None
    max_header_bytes: int = 64 * 1024
    keep_alive_s: int = 5

    def __post_init__(self) -> None:
        if not self.header_timeout_s > 0 or not self.body_timeout_s > 0:
            raise ValueError("header_timeout_s and body_timeout_s must be positive seconds")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")
        if self.max_header_bytes < 1024:
            raise ValueError(f"max_header_bytes must be >= 1024, got {self.max_header_bytes}")
        if self.keep_alive_s < 1:
            raise ValueError(f"keep_alive_s must be >= 1, got {self.keep_alive_s}")

    def connections(self) -> int:
        """The cap in force: ``max_connections``, or the default from the descriptor limit."""
        return self.max_connections if self.max_connections is not None else default_max_connections()

    def accept_batch(self) -> int:
        """Most connections accepted in one go: `ACCEPT_BATCH`, or fewer under a small cap."""
        return max(1, min(ACCEPT_BATCH, self.connections() // 4))


