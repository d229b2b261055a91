"""`Recompute`: how a vector store gets the exact embedding of a stored chunk it keeps no vector
for (a slim generation's graph rows): by chunk id, re-embedded from the catalog's text
(`slimrag.index.state.StoredText`). Its own module so that the store's interface and the slim
package both name it without importing each other."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

#: exact embeddings of stored chunks by chunk id, recomputed from their text
Recompute = Callable[[np.ndarray], np.ndarray]
