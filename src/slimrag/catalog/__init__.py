"""The catalog: documents, chunk text and metadata, and keyword search in one SQLite file.

- `store`: `Catalog`, the one class callers use.
- `schema`: the tables of the compact layout and of the legacy one (indexes built before it).
- `compact`, `legacy`: each layout's reads and writes of documents and chunks.
- `codec`: how a chunk's text and metadata are compressed (zstd with a trained dictionary).
- `keyword/`: the keyword index behind one interface (`KeywordIndex`): the default postings
  (BM25 without positions in zstd blocks; FTS5's scores, bit for bit) or FTS5 itself.
- `upgrade`: converting a legacy catalog, training a missing dictionary, choosing the keyword
  index's detail, merging and vacuuming.
"""

from slimrag.catalog.store import Catalog

__all__ = ["Catalog"]
