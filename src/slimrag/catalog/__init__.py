"""The catalog: documents, chunk text and metadata, and keyword search in one SQLite file.

- `store`: `Catalog`, the one class callers use.
- `schema`: the tables of the compact layout and of the legacy one (indexes built before it).
- `codec`: how a chunk's text and metadata are compressed (zstd with a trained dictionary).
- `keyword`: a query's words, and FTS5 match expressions and searches.
- `postings`: the default keyword index: BM25 postings without positions in zstd blocks
  (`postings_block`), tokenized by FTS5's own tokenizer (`tokenizer`); FTS5's scores, bit for bit.
- `upgrade`: converting a legacy catalog, training a missing dictionary, choosing the keyword
  index's detail, merging and vacuuming.
"""

from slimrag.catalog.store import Catalog

__all__ = ["Catalog"]
