"""One lock for every use of transformers in a process.

transformers exposes its classes through a lazy module: ``from transformers import X`` and the
auto classes' own look-ups resolve names on first use, and that resolution is not safe when two
threads do it at once. One of them gets ``ImportError: cannot import name 'AutoModelForCausalLM'``
while the other is half-way through. slimrag met this on the first ``ask`` on a new machine
(issue 22): the preload thread converted the GGUF model with transformers while the main thread
exported the embedder to ONNX with transformers. The LLM engine now reads the GGUF itself
(`slimrag.llm.model`), so the answer path imports no transformers at all; what is left is the
embedder's one-time ONNX export and its torch runtime, which serve's worker threads can start side
by side. A cached run uses neither, so the lock costs nothing then.

Rule: code that imports from or calls into transformers or sentence-transformers (which imports
transformers) does it inside ``with using_transformers():``. The lock is re-entrant, so a guarded
function may call another.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_LOCK = threading.RLock()


@contextmanager
def using_transformers() -> Iterator[None]:
    """Hold the process-wide transformers lock; hub downloads are forbidden first (offline)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    with _LOCK:
        yield
