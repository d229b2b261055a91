"""One block of the postings keyword index (`slimrag.catalog.keyword.postings`): up to its `BLOCK_TERMS`
sorted terms with their chunk ids and term counts, as bytes that zstd compresses well.

Layout (little-endian): the numbers of terms and of postings and the byte length of the names
(three uint32), the names joined by NUL, postings per term, then each posting's chunk-id gap
(the first of a term from -1, so gaps are >= 1) and its term count. Numbers are stored as byte
planes (all low bytes, then the next ...): gaps and counts are small, so the high planes are
runs of zeros. On disfl_qa that is 0.22x of the text for the whole index, against 0.53x for
FTS5 with positions.
"""

from __future__ import annotations

import bisect

import numpy as np


class Block:
    """One decoded block: sorted ``terms``; term ``i``'s chunk ids are ``ids[starts[i]:starts[i+1]]``
    (ascending) and its counts ``tfs`` at the same places."""

    __slots__ = ("terms", "starts", "ids", "tfs")

    def __init__(self, terms: list[str], starts: np.ndarray, ids: np.ndarray, tfs: np.ndarray) -> None:
        self.terms, self.starts, self.ids, self.tfs = terms, starts, ids, tfs

    def get(self, term: str) -> tuple[np.ndarray, np.ndarray] | None:
        i = bisect.bisect_left(self.terms, term)
        if i == len(self.terms) or self.terms[i] != term:
            return None
        a, b = self.starts[i], self.starts[i + 1]
        return self.ids[a:b], self.tfs[a:b]


def _planes(x: np.ndarray, width: int) -> bytes:
    """Little-endian bytes of ``x`` as ``width`` planes (all low bytes, then the next, ...)."""
    return np.ascontiguousarray(x.astype(f"<u{width}").view(np.uint8).reshape(-1, width).T).tobytes()


def _unplanes(buf: bytes, n: int, width: int) -> np.ndarray:
    return np.frombuffer(buf, dtype=np.uint8).reshape(width, n).T.copy().view(f"<u{width}").reshape(n).astype(np.int64)


def encode(terms: list[str], counts: np.ndarray, ids: np.ndarray, tfs: np.ndarray) -> bytes:
    """A block's body (uncompressed) for sorted ``terms``, ``counts[i]`` postings each, whose
    chunk ids (ascending within a term) and term counts are ``ids`` and ``tfs`` end to end. A
    count above 65,535 is stored as 65,535 (a chunk that long does not occur)."""
    counts = np.asarray(counts, dtype=np.int64)
    ids = np.asarray(ids, dtype=np.int64)
    gaps = np.diff(ids, prepend=-1)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)[counts > 0]
    gaps[starts] = ids[starts] + 1
    names = "\0".join(terms).encode("utf-8")
    head = np.array([len(terms), len(ids), len(names)], dtype="<u4").tobytes()
    return head + names + _planes(counts, 4) + _planes(gaps, 4) + _planes(np.minimum(tfs, 65535), 2)


def decode(body: bytes) -> Block:
    """The inverse of `encode`."""
    nterms, total, nnames = (int(x) for x in np.frombuffer(body, dtype="<u4", count=3))
    at = 12
    terms = body[at: at + nnames].decode("utf-8").split("\0") if nterms else []
    at += nnames
    counts = _unplanes(body[at: at + 4 * nterms], nterms, 4)
    at += 4 * nterms
    gaps = _unplanes(body[at: at + 4 * total], total, 4)
    at += 4 * total
    tfs = _unplanes(body[at: at + 2 * total], total, 2)
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    cs = np.cumsum(gaps)
    before = np.concatenate([[0], cs])[starts[:-1]]
    ids = cs - np.repeat(before, counts) - 1
    return Block(terms, starts, ids, tfs)


def alive(ids: np.ndarray, live: np.ndarray) -> np.ndarray:
    """Which of ``ids`` are stored chunks, by `Postings._live_lengths` (-1: not stored)."""
    inside = ids < len(live)
    out = np.zeros(len(ids), dtype=bool)
    out[inside] = live[ids[inside]] >= 0
    return out


def by_term(rank: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The order of postings by term rank, then chunk id. A stable sort by rank alone when that
    leaves each term's ids ascending (a commit's rows, or segments, in chunk-id order: timsort
    merges the sorted runs), else a full two-key sort."""
    order = np.argsort(rank, kind="stable")
    ids_sorted = ids[order]
    later = np.diff(rank[order]) == 0  # a posting after another of its term
    if (ids_sorted[1:] > ids_sorted[:-1])[later].all():
        return order
    return np.lexsort((ids, rank))
