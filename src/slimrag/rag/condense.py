"""Follow-ups that keep the subject: the query a chat turn is retrieved with.

"What is its default value?" after a question about autovacuum retrieved the page about column
defaults (issue 19): the follow-up alone names no subject. The query must carry the subject of the
conversation, and there are two ways to get it (`CONDENSERS`, chosen by `RAG`'s ``condense``):

- ``"words"`` (the default): the follow-up, then the content words of the previous questions
  (`CONTEXT_TURNS`, the last one) that the follow-up does not already hold, in their order
  (`slimrag.rag.sentences.content_words`: stop words out, compared by stem). No model runs, so it
  costs nothing and works with the embedded model; the extra words are the subject ("autovacuum")
  and some noise, which hybrid search tolerates (keyword search ORs the words, the embedding is
  dominated by the follow-up's own).
- ``"rewrite"``: the generator rewrites the follow-up as a standalone question, given the earlier
  questions (`REWRITE_SYSTEM`). Better when the model is capable (a remote one); a 135M model
  rewrites badly, so it is never the default. A failed or empty rewrite falls back to ``"words"``.
- ``"off"``: the follow-up alone.

The pipeline retrieves for the condensed query only. On `bench.followups` (200 conversations whose
second turn names its subject by a pronoun; docs/benchmarks.md, "Follow-ups"), gold passage in the
top 5 / top 1: the follow-up alone 0.88 / 0.71, condensed 0.98 / 0.95; merging the condensed
query's hits with the follow-up's own by score adds nothing (0.98 / 0.94), and hybrid scores are
normalised per query, so a merge by score mostly interleaves the two lists.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from slimrag.config import GenerationConfig
from slimrag.llm.base import Generator
from slimrag.prompt import Prompt
from slimrag.rag.sentences import STOPWORDS, stem, words

#: Earlier questions whose words join a follow-up's query.
CONTEXT_TURNS = 1

#: The instruction of the ``"rewrite"`` condenser.
REWRITE_SYSTEM = ("Rewrite the last question so that it can be understood without the conversation: replace "
                  "pronouns and references with what they mean. Reply with the rewritten question only.")

#: (follow-up, earlier questions oldest first, generator) -> the query to retrieve with.
Condenser = Callable[[str, Sequence[str], Generator], str]


def with_words(question: str, earlier: Sequence[str], llm: Generator | None = None) -> str:
    """``question`` followed by the content words of the last `CONTEXT_TURNS` earlier questions
    that it does not hold (compared by stem), in their first order."""
    have = {stem(w) for w in words(question)}
    extra: list[str] = []
    for q in earlier[-CONTEXT_TURNS:]:
        for w in words(q):
            s = stem(w)
            if w.lower() in STOPWORDS or len(w) < 2 or s in have:
                continue
            have.add(s)
            extra.append(w)
    return f"{question} {' '.join(extra)}" if extra else question


def alone(question: str, earlier: Sequence[str], llm: Generator | None = None) -> str:
    """The follow-up as it is."""
    return question


def rewrite(question: str, earlier: Sequence[str], llm: Generator | None = None) -> str:
    """The generator's standalone rewrite of ``question`` (module header); `with_words` when there
    is no earlier question or the rewrite comes back empty."""
    if not earlier or llm is None:
        return with_words(question, earlier)
    prompt = Prompt(question, (), REWRITE_SYSTEM, questions=tuple(earlier[-CONTEXT_TURNS:]))
    text = llm.generate(prompt, GenerationConfig(max_new_tokens=64)).text.strip().splitlines()
    return text[0].strip() if text and text[0].strip() else with_words(question, earlier)


#: Condenser names (`RAG`'s ``condense``) -> condenser.
CONDENSERS: dict[str, Condenser] = {"words": with_words, "rewrite": rewrite, "off": alone}
