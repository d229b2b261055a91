"""Evidence quotes each sentence once (`slimrag.rag.evidence.rank_sentences`): neighbouring chunks
overlap, and on the folder sets 3-4 of 49 answers led with the same sentence twice, from two chunks,
leaving one line of the lead for nothing new. The real embedder ranks the sentences."""

from __future__ import annotations

from slimrag.embed.local import LocalEmbedder
from slimrag.rag.evidence import EvidenceConfig, rank_sentences
from slimrag.types import Hit

FIRST = ("Generate a UUID from a host ID, sequence number, and the current time. "
         "Generate a random UUID.")
SECOND = "Generate a random UUID. Generate a UUID based on the SHA-1 hash of a namespace identifier."


def test_a_sentence_two_chunks_share_is_quoted_once(embedder: LocalEmbedder) -> None:
    hits = [Hit(10, 0.9, FIRST, "uuid.html", {}), Hit(11, 0.8, SECOND, "uuid.html", {})]
    ev = rank_sentences("How do I generate a random UUID?", hits, embedder, EvidenceConfig(top=3))
    texts = [e.text for e in ev]
    assert len(texts) == 3 and len(set(texts)) == 3, texts
    assert texts.count("Generate a random UUID.") == 1
    best = next(e for e in ev if e.text == "Generate a random UUID.")
    assert best.chunk_id == 10  # from the better-ranked passage


def test_the_copy_under_its_signature_is_quoted(embedder: LocalEmbedder) -> None:
    # the better-ranked chunk starts after the signature that the other chunk still holds
    cut = "A value of ``None`` indicates that new socket objects have no timeout. Set the timeout too."
    whole = (".. function:: getdefaulttimeout()\n\n   Return the default timeout in seconds for new socket objects.\n"
             "   A value of ``None`` indicates that new socket objects have no timeout.")
    hits = [Hit(20, 0.9, cut, "socket.rst", {}), Hit(19, 0.8, whole, "socket.rst", {})]
    ev = rank_sentences("What does a default timeout of None mean for new socket objects?", hits, embedder,
                        EvidenceConfig(top=3))
    none = [e for e in ev if e.text.startswith("A value of ``None``")]
    assert len(none) == 1 and none[0].signature == "getdefaulttimeout()" and none[0].chunk_id == 19
