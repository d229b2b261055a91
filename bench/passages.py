"""Synthetic clustered passages of 40–80 words, deterministic by seed, for scale benchmarks.

Text shaped so that every layer of an index does its usual work (chunking, the catalog's text and
FTS5 index, embedding) at any N without a real corpus:

- A vocabulary of `VOCAB` pronounceable pseudo-words (two to four syllables), drawn once per seed.
- `TOPICS` topics (default 1024), each with a name (its first word) and `TOPIC_WORDS` words of its
  own. A passage starts with its topic's name, then 40–80 words (`SHARES`): 45% from its topic's
  words, 20% from the whole vocabulary (both Zipf-weighted), 35% English function words, so
  keyword search sees topic terms, rarer words and stop words as in prose, and a passage stays
  one chunk at the default 200 tokens (125 tokens on average). About 360 bytes of text per passage.
- Passage i depends on (seed, i // BLOCK) only: any prefix is the same whatever N, and a block
  can be regenerated alone (the benchmark's ground truth streams them again).

With the stand-in embedder (`slimrag.embed.synthetic`, topics from the first word), passages of one
topic share a vector cluster, and `queries` (a topic's name and 6–12 of its words) land in them.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

VOCAB = 20_000
TOPICS = 1024
TOPIC_WORDS = 300
#: passages drawn per random generator: the unit of regeneration
BLOCK = 4096
_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
#: English function words: a third of prose, one tokenizer token each, so a passage of 80 words
#: stays within one 200-token chunk (pseudo-words cost ~2.6 tokens each)
FUNCTION_WORDS = tuple("""the of and to in is that for it as with was on be by this are or from at
which an not but have has can its also more one all their when they into than other these only
may such used will each most then some two over new first both between after where while""".split())
#: shares of a passage's words: its topic's words, the whole vocabulary, function words
SHARES = (0.45, 0.2, 0.35)


class Passages:
    """The passage stream of one seed: vocabulary and topics drawn once."""

    def __init__(self, seed: int = 0, topics: int = TOPICS) -> None:
        if topics < 1:
            raise ValueError(f"topics must be >= 1, got {topics}")
        self.seed, self.topics = seed, topics
        rng = np.random.default_rng([seed, 1 << 30])
        words: set[str] = set()
        while len(words) < VOCAB + topics:
            k = int(rng.integers(1, 4))
            words.add("".join(_SYLLABLES[i] for i in rng.integers(0, len(_SYLLABLES), k)))
        vocab = sorted(words)
        order = rng.permutation(len(vocab))
        self.names = np.array([vocab[i] for i in order[:topics]], dtype=object)
        self.vocab = np.array([vocab[i] for i in order[topics:]], dtype=object)
        self.topic_words = rng.integers(0, VOCAB, (topics, TOPIC_WORDS))
        zipf = 1.0 / np.arange(1, VOCAB + 1)
        self._p_vocab = zipf / zipf.sum()
        self._function = np.array(FUNCTION_WORDS, dtype=object)
        zt = 1.0 / np.arange(1, TOPIC_WORDS + 1)
        self._p_topic = zt / zt.sum()

    def block(self, b: int) -> list[tuple[int, str]]:
        """Block ``b``: `BLOCK` (topic, text) pairs."""
        rng = np.random.default_rng([self.seed, b])
        topic = rng.integers(0, self.topics, BLOCK)
        lengths = rng.integers(40, 81, BLOCK)
        total = int(lengths.sum())
        kind = rng.choice(3, total, p=SHARES)
        t_rows = np.repeat(topic, lengths)
        idx = np.where(kind == 0, self.topic_words[t_rows, rng.choice(TOPIC_WORDS, total, p=self._p_topic)],
                       rng.choice(VOCAB, total, p=self._p_vocab))
        words = self.vocab[idx]
        fw = kind == 2
        words[fw] = self._function[rng.integers(0, len(FUNCTION_WORDS), int(fw.sum()))]
        out, s = [], 0
        for t, n in zip(topic.tolist(), lengths.tolist(), strict=True):
            out.append((t, f"{self.names[t]} {' '.join(words[s: s + n])}."))
            s += n
        return out

    def iter(self, n: int, start: int = 0) -> Iterator[tuple[int, str]]:
        """Passages ``start`` .. ``n - 1`` as (topic, text), in order."""
        for b in range(start // BLOCK, (n + BLOCK - 1) // BLOCK):
            lo = b * BLOCK
            for i, pair in enumerate(self.block(b)):
                if start <= lo + i < n:
                    yield pair

    def pairs(self, n: int) -> Iterator[tuple[str, str]]:
        """``(source, text)`` pairs of the first ``n`` passages, for `Index.build`; the source
        ``p0000042`` names passage 42 (`index_of` reads it back)."""
        for i, (_, text) in enumerate(self.iter(n)):
            yield f"p{i:07d}", text

    def queries(self, nq: int, seed: int = 1) -> list[str]:
        """``nq`` queries: a topic's name then 6–12 of its words (Zipf-weighted), seeded."""
        rng = np.random.default_rng([self.seed, 1 << 31, seed])
        out = []
        for _ in range(nq):
            t = int(rng.integers(0, self.topics))
            w = self.vocab[self.topic_words[t, rng.choice(TOPIC_WORDS, int(rng.integers(6, 13)), p=self._p_topic)]]
            out.append(f"{self.names[t]} {' '.join(w)}")
        return out


def index_of(source: str) -> int:
    """The passage number a `Passages.pairs` source names."""
    return int(source[1:])
