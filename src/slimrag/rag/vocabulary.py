"""The corpus's own vocabulary: names so common in an index that naming one claims nothing.

Attribution (`slimrag.rag.attribution`) holds every name of an answer sentence to its passages:
a name found in no passage was invented or brought from memory. But some names are the corpus's
subject rather than a claim about it: "Python" in the Python documentation, "PostgreSQL" in its
manual. "You can use `statistics.median()` in Python" names Python, and the four statistics
passages retrieved for the question need not: the reader of that corpus learns nothing false from
it, and marking the sentence `[not in the passages]` for it flags a right answer.

Rule
    A word (letters only: numbers are always claims) is *common* when at least `SHARE` (half) of
    the index's documents hold it, and the index has at least `MIN_DOCUMENTS` (5) documents:
    below that, half the documents is one or two, and a name they share is still a claim. The
    count comes from the keyword index (the chunks holding the word), then one distinct-document
    count of those chunks in the catalog (`Catalog.document_count`, no chunk text read); a word held
    by fewer chunks than half the documents is rejected without that count.

Cache
    Per index generation: the document and chunk counts and every word's answer are kept until
    `slimrag.index.core.Index.version` changes (the manifest replaced by an add or a compact through
    any handle, or another connection's commit: a remove elsewhere) or this handle's catalog
    connection writes (SQLite's ``total_changes``: a remove through this handle, which moves neither).
    The key is a stat, a pragma and an attribute, so an answer reads the catalog only for words not
    yet decided, instead of counting its documents and chunks each time.

Knobs
    `SHARE` (0.5): a word in half the documents is what the corpus is about; nationalities and
    other frequent names of an encyclopaedic corpus stay claims (on nq_conflicts' 1,500 passages,
    "American" is in about 20% of them).
    `MIN_DOCUMENTS` (5): smaller indexes have no common vocabulary.

Cost: `Index.version` per answer; one count of documents and chunks per index generation; one
keyword lookup per distinct word not already decided in that generation, and for the few words held
by enough chunks one count of those chunks' distinct documents.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slimrag.index.core import Index

#: Share of the documents a word must be in to be the corpus's vocabulary (module header).
SHARE = 0.5
#: Fewest documents an index needs to have a common vocabulary at all (module header).
MIN_DOCUMENTS = 5


class Vocabulary:
    """Which words an index's documents share (module header). One per index handle and thread,
    like the index itself."""

    def __init__(self, index: Index) -> None:
        self.index = index
        self._known: dict[str, bool] = {}
        self._version: tuple[tuple[int, int, int], int] | None = None
        self._sizes = (0, 0)  # documents, chunks of the generation `_version` names

    def common(self, words: Iterable[str]) -> set[str]:
        """Those of ``words`` (lower-cased) that are in at least `SHARE` of the documents (module
        header)."""
        version = (self.index.version(), self.index.catalog.db.total_changes)
        if version != self._version:  # an add, a compact or a remove through any handle (module header, "Cache")
            counts = self.index.catalog.counts()
            self._known.clear()
            self._version, self._sizes = version, (counts["documents"], counts["chunks"])
        out = set()
        for w in {w.lower() for w in words}:
            if w not in self._known:
                self._known[w] = w.isalpha() and self._count(w, *self._sizes)
            if self._known[w]:
                out.add(w)
        return out

    def _count(self, word: str, documents: int, chunks: int) -> bool:
        if documents < MIN_DOCUMENTS:
            return False
        need = SHARE * documents
        ids = [cid for cid, _ in self.index.catalog.keyword_search(word, chunks, None)]
        if len(ids) < need:  # each document holding it has a chunk holding it
            return False
        return self.index.catalog.document_count(ids) >= need
