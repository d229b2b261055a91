"""The slim graph's partition builds as Ray tasks, merged and pruned on the driver.

A partitioned build (``pool.py``) builds one HNSW per k-means partition, and each partition's
candidate lists depend only on its own rows. So the partitions are independent tasks: the driver
computes the partitions (k-means on a sample, one pass over the rows), reads each partition's
rows from its (memory-mapped) vectors and puts them in Ray's object store; a task builds the
HNSW and returns the level-0 lists in local row numbers (``len(part) x 2 hnsw_m`` int64, ~64 MB
per 250k rows); the driver maps them to global ids, merges them per row and runs the prune, the
reverse-edge merge and the connectivity repair as a local build does. The result is the same
graph as a local build up to HNSW's own nondeterminism (parallel insertion).

Usage::

    with ray_partitions(address=None):     # None: a local Ray on this machine; or "auto", "ray://h:10001"
        art = build_slim(vectors, config)  # any build inside uses Ray for its partitions

What a cluster needs: Ray (``pip install 'slimrag[ray]'``) and this package with faiss-cpu on
every worker (a runtime env or the same image); nothing else: vectors travel through the object
store, so workers need no shared filesystem. Each task holds one partition's float32 vectors
twice (the object-store copy and faiss's) plus its links: ~0.8 GB at 250k rows of d=384, so
``partition_rows`` sets the memory a worker needs. ``max_in_flight`` partitions are in the
object store at once (default: the cluster's CPUs divided by ``threads``), which bounds the
driver's and the store's memory. ``threads``: CPUs (and faiss OpenMP threads) per task.

Thread-safety: `ray_partitions` installs a process-wide runner (`pool.set_runner`); one build at
a time per process while it is active.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import numpy as np

from slimrag.index.store.slim import pool
from slimrag.index.store.slim.rows import RowReader


def _partition_task(vectors: np.ndarray, config: dict[str, Any], knn: bool, threads: int) -> np.ndarray:
    """Runs on a Ray worker: the partition's candidate lists in local row numbers."""
    import faiss

    from slimrag.index.store.slim.config import GraphConfig

    faiss.omp_set_num_threads(threads)
    return pool.local_lists(vectors, GraphConfig(**config), knn)


class RayRunner:
    """A `pool.PartitionRunner` that builds each partition in a Ray task."""

    def __init__(self, ray: Any, threads: int = 1, max_in_flight: int = 0) -> None:
        self.ray = ray
        self.threads = max(1, threads)
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.max_in_flight = max_in_flight or max(1, cpus // self.threads)
        self.task = ray.remote(num_cpus=self.threads)(_partition_task)

    def __call__(self, x: np.ndarray, parts: list[np.ndarray], config: Any, knn: bool) -> list[np.ndarray]:
        reader = RowReader(x)
        cfg = asdict(config)
        out: list[np.ndarray | None] = [None] * len(parts)
        pending: dict[Any, int] = {}

        def collect(ready: list[Any]) -> None:
            for ref in ready:
                i = pending.pop(ref)
                out[i] = pool.to_global(parts[i], self.ray.get(ref))

        for i, rows in enumerate(parts):
            if len(pending) >= self.max_in_flight:
                ready, _ = self.ray.wait(list(pending), num_returns=1)
                collect(ready)
            vectors = self.ray.put(reader.take(rows))
            reader.done()
            pending[self.task.remote(vectors, cfg, knn, self.threads)] = i
        while pending:
            ready, _ = self.ray.wait(list(pending), num_returns=1)
            collect(ready)
        return [o for o in out if o is not None]


@contextlib.contextmanager
def ray_partitions(address: str | None = None, *, num_cpus: int | None = None, threads: int = 1,
                   max_in_flight: int = 0) -> Iterator[RayRunner]:
    """Run the partition builds of slim graphs built inside this block as Ray tasks. Connects to
    ``address`` (or starts a local Ray with ``num_cpus`` CPUs when None) unless Ray is already
    initialised, and shuts down only what it started."""
    try:
        import ray
    except ImportError as exc:
        raise RuntimeError("Ray is not installed: pip install 'slimrag[ray]'") from exc
    started = False
    if not ray.is_initialized():
        if address is None:
            ray.init(num_cpus=num_cpus, include_dashboard=False)
        else:
            ray.init(address=address)
        started = True
    runner = RayRunner(ray, threads, max_in_flight)
    previous = pool.set_runner(runner)
    try:
        yield runner
    finally:
        pool.set_runner(previous)
        if started:
            ray.shutdown()
