"""The index's store floor: what an index folder holds and how it is read and written.

- `layout`: the folder (manifest, generations, delta parts), written atomically.
- `manifest`: the typed manifest.
- `lock`: the writer lock.
- `vectors`: `VectorStore`, the interface of every kind of vectors, and the one registry of kinds.
- `flat`: the exact matrix; `slim/`: graph + PQ codes, rows recomputed from text.
- `recompute`: the `Recompute` contract a store reranks with.

Nothing here imports the façade above it (`slimrag.index.core` and its helpers: state, writer,
query, browse, check, sync, watch, coverage, progress); `tests/test_layers.py` holds it so.
"""
