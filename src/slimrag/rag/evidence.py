"""Evidence: the sentences of the retrieved passages that best answer the question.

A small model often writes a wrong answer from the right passages (issue 19: 4 of 12 right on the
PostgreSQL manual while the answer was in the passages every time). Evidence lets the reader check
at a glance: the few passage sentences that answer the question, each with its passage label, shown
with every answer and usable as the answer on their own (``slimrag ask --no-llm``).

Algorithm
    Every passage is cut into sentences (`slimrag.rag.sentences.split_sentences`); the question and
    all sentences are embedded in one batch by the index's own embedder. Each sentence gets six
    features, each in [0, 1]:

    ========== ==================================================================================
    cos        cosine of the sentence's and the question's embeddings
    overlap    share of the question's content words (stemmed, stop words out) the sentence
               holds, each word weighted by its rarity among the candidate sentences
               (``log(1 + n / df)``): a word every sentence has says nothing
    terms      share of the question's numbers and names the sentence holds (0 when it has none)
    answer     1 when the sentence holds what the question's type asks for and the question does
               not already state: a year, month, date or period ("during the reign of Augustus": on
               disfl_qa 6 of 31 "when" questions gain such a sentence, ev1 and ev2 unchanged) for
               *when* / *what year*; a number for
               *how many / much / long / old / far*; a name (a capitalised word, not a number word) for *who* /
               *where* / *which*; otherwise 0 (`slimrag.rag.question`: `answer_type`, `has_type`)
    rank       1 / (1 + passage rank): the retriever's opinion of the whole passage
    neighbour  the best (cos + overlap) / 2 of the sentences just before and after: an answer
               sentence often follows the one that names the subject ("Its default is 128MB.")
    ========== ==================================================================================

    score = the weighted sum (`Weights`). The weights are not learned: they were chosen on one QA
    set (disfl_qa) among a small grid by `bench.answers --tune`, and checked on another
    (nq_conflicts, real Natural Questions queries); both figures are in docs/benchmarks.md
    ("Evidence"). The defaults are that choice.

Knobs
    `EvidenceConfig.top` (3): how many sentences are kept; the acceptance figure reads the first 2.
    `EvidenceConfig.weights`: the six weights above.

Cost: one embedder batch of (1 + sentences) short texts, about 30 sentences for 4 passages; the
rest is set arithmetic. No model beyond the embedder is loaded, so `evidence_answer` (the
``--no-llm`` answer) needs only the open index.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from slimrag.config import SearchConfig
from slimrag.rag.guards import DEFAULT_FLOOR, NO_ANSWER, answerable
from slimrag.rag.question import answer_type, has_type
from slimrag.rag.sentences import Sentence, content_words, key_terms, split_sentences, words
from slimrag.rag.signatures import signature_of
from slimrag.types import Answer, Evidence, Hit, Usage

#: Shortest candidate sentence, in words.
MIN_WORDS = 3

#: The feature names, in the order of `Weights`' fields and of `features`' columns.
FEATURES = ("cos", "overlap", "terms", "answer", "rank", "neighbour")


@dataclass(frozen=True, slots=True)
class Weights:
    """The weight of each evidence feature (module header); defaults chosen by `bench.answers`."""

    cos: float = 1.0
    overlap: float = 0.5
    terms: float = 0.25
    answer: float = 0.25
    rank: float = 0.25
    neighbour: float = 0.25

    def __post_init__(self) -> None:
        for name in FEATURES:
            if getattr(self, name) < 0:
                raise ValueError(f"evidence weight {name} must be >= 0, got {getattr(self, name)}")

    def vector(self) -> np.ndarray:
        """The weights as an array in `FEATURES` order."""
        return np.array([getattr(self, n) for n in FEATURES], dtype=np.float64)


@dataclass(frozen=True, slots=True)
class EvidenceConfig:
    """How evidence is chosen: ``top`` sentences by the weighted score of ``weights``."""

    top: int = 3
    weights: Weights = field(default_factory=Weights)

    def __post_init__(self) -> None:
        if self.top < 1:
            raise ValueError(f"top must be >= 1, got {self.top}")


class Embeds(Protocol):
    """What evidence needs of an embedder: `Embedder.embed`."""

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


class Memo:
    """An `Embeds` that remembers the vectors of the texts it has embedded, so evidence and then
    attribution of one answer embed its passage sentences once. For one answer; not thread-safe."""

    def __init__(self, embedder: Embeds) -> None:
        self.embedder = embedder
        self.vectors: dict[str, np.ndarray] = {}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """The vectors of ``texts``, embedding in one batch only those not seen before."""
        new = list(dict.fromkeys(t for t in texts if t not in self.vectors))
        if new:
            self.vectors.update(zip(new, np.asarray(self.embedder.embed(new)), strict=True))
        return np.stack([self.vectors[t] for t in texts]) if texts else np.zeros((0, 0), dtype=np.float32)


@dataclass(frozen=True, slots=True)
class Candidates:
    """The sentences of some hits, flattened: ``at[i]`` = (hit index, sentence); ``pos[i]``: its
    position among all sentences of its passage (kept or not)."""

    at: list[tuple[int, Sentence]]
    pos: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, hits: Sequence[Hit]) -> Candidates:
        """Every sentence of ``hits`` of at least `MIN_WORDS` words (a heading alone, "Bread",
        answers nothing), in passage order."""
        kept = [(r, i, s) for r, h in enumerate(hits) for i, s in enumerate(split_sentences(h.text))
                if len(words(s.text)) >= MIN_WORDS]
        return cls([(r, s) for r, _, s in kept], [i for _, i, _ in kept])

    def neighbours(self, i: int) -> list[int]:
        """The candidates just before and after candidate ``i`` in its passage: adjacent sentences
        only (one past a dropped heading belongs to another section)."""
        return [j for j in (i - 1, i + 1) if 0 <= j < len(self.at) and self.at[j][0] == self.at[i][0]
                and abs(self.pos[j] - self.pos[i]) == 1]

    @property
    def texts(self) -> list[str]:
        return [s.text for _, s in self.at]


def features(question: str, hits: Sequence[Hit], cands: Candidates, q_vec: np.ndarray,
             s_vecs: np.ndarray) -> np.ndarray:
    """The (sentences, 6) feature matrix of `FEATURES` (module header)."""
    n = len(cands.at)
    out = np.zeros((n, len(FEATURES)), dtype=np.float64)
    if n == 0:
        return out
    out[:, 0] = np.clip(s_vecs @ q_vec, 0.0, 1.0)
    q_words = content_words(question)
    s_words = [content_words(t) for t in cands.texts]
    df = {w: sum(w in sw for sw in s_words) for w in q_words}
    idf = {w: math.log(1 + n / df[w]) if df[w] else math.log(1 + n) for w in q_words}
    total = sum(idf.values())
    q_terms = key_terms(question)
    kind = answer_type(question)
    for i, ((rank, sent), sw) in enumerate(zip(cands.at, s_words, strict=True)):
        out[i, 1] = sum(idf[w] for w in q_words & sw) / total if total else 0.0
        if q_terms:
            low = sent.text.lower().replace(",", "")
            out[i, 2] = sum(t in low for t in q_terms) / len(q_terms)
        out[i, 3] = has_type(kind, sent.text, q_terms)
        out[i, 4] = 1.0 / (1.0 + rank)
    base = (out[:, 0] + out[:, 1]) / 2
    for i in range(n):
        out[i, 5] = max((base[j] for j in cands.neighbours(i)), default=0.0)
    return out


def rank_sentences(question: str, hits: Sequence[Hit], embedder: Embeds,
                   config: EvidenceConfig | None = None) -> list[Evidence]:
    """The ``config.top`` best evidence sentences of ``hits`` (best first) for ``question``, each once:
    neighbouring chunks overlap, and a sentence they share is quoted from the better-ranked one, or
    from the other chunk of the same file when only that one holds the signature it documents ("A value of None indicates
    ..." under ``getdefaulttimeout()``, whose signature the next chunk cut off)."""
    cfg = config or EvidenceConfig()
    cands = Candidates.of(hits)
    if not cands.at:
        return []
    vecs = np.asarray(embedder.embed([question, *cands.texts]), dtype=np.float64)
    scores = features(question, hits, cands, vecs[0], vecs[1:]) @ cfg.weights.vector()
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], cands.at[i][0], cands.at[i][1].start))
    out: list[Evidence] = []
    at: dict[str, tuple[int, str]] = {}  # a sentence's text -> its place in ``out``, its source
    for i in order:
        rank, s = cands.at[i]
        h = hits[rank]
        said = " ".join(s.text.split())
        k, source = at.get(said, (None, ""))
        if k is None and len(out) == cfg.top or k is not None and (out[k].signature or source != h.source):
            continue
        e = Evidence(s.text, h.label, h.chunk_id, s.start, s.end, round(float(scores[i]), 4),
                     signature_of(h.text, s.start, h.source))
        if k is None:
            at[said] = (len(out), h.source)
            out.append(e)
        elif e.signature:  # the same sentence in the overlap of two chunks of one file: quoted once, at
            out[k] = replace(e, score=out[k].score)  # its best rank, from the chunk that holds its signature
    return out


def evidence_text(evidence: Sequence[Evidence]) -> str:
    """Evidence as an answer's text: each sentence (`Evidence.quoted`: after its signature, if any)
    followed by its passage label in brackets, the citation form answers use, one sentence per line."""
    return "\n".join(f"{e.quoted} [{e.label}]" for e in evidence)



class Index(Protocol):
    """What an evidence-only answer reads of an index: `Index.search` and its embedder."""

    embedder: Embeds

    def search(self, query: str, k: int = 5, mode: str | None = None,
               source: str | None = None) -> list[Hit]: ...


def evidence_answer(index: Index, question: str, k: int = 4, *, mode: str | None = None,
                    source: str | None = None, floor: float | None = DEFAULT_FLOOR,
                    config: EvidenceConfig | None = None) -> Answer:
    """An answer made of evidence alone, no model (``slimrag ask --no-llm``): retrieve ``k``
    passages in ``mode`` (default `SearchConfig`'s), apply the relevance ``floor``
    (`slimrag.rag.guards.answerable`, on the search's own `Hits`, as `RAG` does), and answer with the best sentences, each cited
    (`evidence_text`). ``used`` holds the labels the evidence came from."""
    t0 = time.perf_counter()
    mode = mode or SearchConfig().mode
    found = index.search(question, k=k, mode=mode, source=source)
    # the floor reads the search's own result: its `Hits.similarity` (the best vector candidate's
    # cosine, cut from the hits or not) is what `RAG` reads; a sorted copy is a plain list without it
    if not answerable(index, mode, [question], found, floor, source):  # type: ignore[arg-type]
        elapsed = time.perf_counter() - t0
        return Answer(NO_ANSWER, [], Usage(ttft_s=elapsed, total_s=elapsed), "stop", abstained=True)
    hits = sorted(found, key=lambda h: (-h.score, h.chunk_id))
    evidence = rank_sentences(question, hits, index.embedder, config)
    elapsed = time.perf_counter() - t0
    used = tuple(dict.fromkeys(e.label for e in evidence))
    return Answer(evidence_text(evidence), hits, Usage(ttft_s=elapsed, total_s=elapsed), "stop",
                  evidence=tuple(evidence), used=used)
