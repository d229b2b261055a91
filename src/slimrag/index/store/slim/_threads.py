"""Run a block of many small numpy products with single-threaded BLAS.

Robust prune (``graph.py``) and per-subspace k-means (``pq.py``) make thousands of tiny matrix
products (48x384 by 384x48, or 16384x8 by 8x256). Multi-threaded OpenBLAS synchronises its threads
on each call, which costs far more than the product itself and gets 10-100x worse when other
processes compete for the cores. Limiting BLAS to one thread for those loops is the fix; large
products (the kNN blocks) keep all threads.

``threadpoolctl`` comes with scikit-learn, which sentence-transformers requires; where it is missing
the block simply runs with the default threads (correct, only slower).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def single_thread_blas() -> Iterator[None]:
    """Context manager: BLAS calls inside use one thread."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # optional speed-up only; behaviour is identical without it
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield
