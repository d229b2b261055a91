"""`Chat` with real retrieval over a small two-topic corpus (baking, bicycles) and a real
`Generator` subclass that records its prompts: follow-ups, topic switches, what the model is shown
of earlier turns, the cached prefix, and the order of sources."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
from conftest import write_tree
from openai_server import OpenAIServer

from slimrag.config import GenerationConfig
from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.llm.base import Delta, Generator
from slimrag.prompt import Exchange, Passage, Prompt, Segment
from slimrag.rag.pipeline import RAG, merge_hits
from slimrag.types import Hit, Usage

CORPUS = {
    "baking/sourdough.md": "# Sourdough\n\nA sourdough loaf proofs for twelve hours in the fridge before baking. "
                           "Feed the starter with flour and water the evening before.",
    "baking/oven.md": "# Oven\n\nBake the sourdough loaf at 250 degrees in a covered Dutch oven for twenty "
                      "minutes, then uncovered for twenty more.",
    "baking/scoring.md": "# Scoring\n\nScore the top of the dough with a razor blade so the loaf opens evenly "
                         "in the oven.",
    "bikes/puncture.md": "# Flat tyre\n\nTo fix a flat bicycle tyre, lever the tyre off the rim, find the hole "
                         "in the inner tube, and glue a rubber patch over it.",
    "bikes/chain.md": "# Chain\n\nOil the bicycle chain every few hundred kilometres and wipe off the excess "
                      "oil with a rag.",
    "bikes/brakes.md": "# Brakes\n\nReplace the brake pads of a bicycle when the grooves in the rubber are worn "
                       "away.",
}

EARLIER_ANSWER = "It proofs for twelve hours in the fridge."


class Recorder(Generator):
    """Answers every prompt with the same sentence and keeps the prompts (and what it is asked to
    keep warm)."""

    def __init__(self) -> None:
        self.prompts: list[Prompt] = []
        self.kept: list[list[Segment]] = []

    def keep(self, segments: Sequence[Segment]) -> int:
        self.kept.append(list(segments))
        return 0

    def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
        self.prompts.append(prompt)
        yield Delta(EARLIER_ANSWER)
        yield Delta("", usage=Usage(prompt_tokens=1, completion_tokens=1), finish_reason="stop")


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Index]:
    root = tmp_path_factory.mktemp("chat")
    idx = Index.build(write_tree(root / "docs", CORPUS), root / "c.slimrag", embedder=embedder)
    yield idx
    idx.close()


def test_topic_switch_keeps_the_new_topics_best_passage(index: Index) -> None:
    gen = Recorder()
    chat = RAG(index, gen).chat()
    chat.ask("How long does a sourdough loaf proof before baking?", k=2)
    follow = chat.ask("And at what temperature?", k=2)
    # the follow-up alone says nothing of bread; its context finds the oven passage
    assert "baking/oven.md" in [h.source for h in follow.sources]
    switch = "How do I fix a flat bicycle tyre?"
    best = index.search(switch, k=1)[0]
    answer = chat.ask(switch, k=2)
    assert best.source == "bikes/puncture.md"
    assert answer.sources[0].chunk_id == best.chunk_id
    scores = [h.score for h in answer.sources]
    assert scores == sorted(scores, reverse=True)  # sources by relevance, not cache order
    assert len(gen.prompts) == 3


def test_each_turn_starts_with_the_last_turn_and_its_answer(index: Index) -> None:
    gen = Recorder()
    chat = RAG(index, gen).chat(replay=True)
    chat.ask("How long does a sourdough loaf proof before baking?", k=2)
    chat.ask("And at what temperature?", k=2)
    chat.ask("How do I fix a flat bicycle tyre?", k=2)
    prompts = [p.segments() for p in gen.prompts]
    for before, after, kept in zip(prompts, prompts[1:], gen.kept, strict=False):
        n = len(before)
        # byte for byte: the earlier prompt (its question now cacheable), then its answer
        assert [s.text for s in after[:n]] == [s.text for s in before]
        assert after[n - 1].key is not None and before[-1].key is None
        assert after[n].text.startswith(EARLIER_ANSWER) and after[n].key is not None
        # what the generator was asked to keep is exactly that prefix
        assert [(s.key, s.text) for s in kept] == [(s.key, s.text) for s in after[: n + 1]]
    assert len(gen.kept) == 3  # the third turn is kept too, ready for a fourth
    assert EARLIER_ANSWER in gen.prompts[1].messages()[2]["content"]
    assert [m["role"] for m in gen.prompts[2].messages()] == ["system", "user", "assistant", "user", "assistant", "user"]


def test_exchanges_own_the_first_passages() -> None:
    passages = tuple(Passage(str(i), f"doc#{i}", f"text {i}") for i in range(3))
    prompt = Prompt("q", passages, exchanges=(Exchange(2, "Question: a", "A."),))
    keys = [s.key for s in prompt.segments()]
    assert keys[1:3] == [prompt.passage_key(p) for p in passages[:2]]
    assert keys[3].startswith("asked@") and keys[4].startswith("answer@") and keys[5] == prompt.passage_key(passages[2])
    with pytest.raises(ValueError, match="exchanges add 4 passages"):
        Prompt("q", passages, exchanges=(Exchange(4, "Question: a", "A."),))


def test_the_model_sees_earlier_questions_not_earlier_answers(index: Index) -> None:
    gen = Recorder()
    chat = RAG(index, gen).chat()  # the default: no replay
    first_q = "How long does a sourdough loaf proof before baking?"
    chat.ask(first_q, k=2)
    chat.ask("And at what temperature?", k=2)
    first, second = gen.prompts
    tail = second.segments()[-1].text
    assert first_q in tail and "Earlier questions in this conversation" in tail
    assert all(EARLIER_ANSWER not in s.text for s in second.segments())
    assert EARLIER_ANSWER not in "".join(m["content"] for m in second.messages())
    # the system segment and the first turn's passages are a byte-identical prefix of turn two
    n = len(first.passages) + 1
    assert [s.text for s in second.segments()[:n]] == [s.text for s in first.segments()[:n]]
    assert [m["role"] for m in second.messages()] == ["system", "user"]
    body = "".join(first.passage_text(p) for p in first.passages)
    assert second.messages()[1]["content"].startswith("Passages:\n" + body)
    assert chat.history[1] == ("assistant", EARLIER_ANSWER)  # the caller still has the answers


def test_remote_chat_replays_the_last_turn_as_messages(index: Index) -> None:
    with OpenAIServer() as srv:
        chat = RAG(index, llm=srv.base_url).chat()
        assert not chat.replaying  # the default: earlier questions only
        chat.replay = True
        first = chat.ask("How long does a sourdough loaf proof before baking?", k=2)
        second = chat.ask("And at what temperature?", k=2)
        assert second.text.endswith("And at what temperature?")
        sent = [r["body"]["messages"] for r in srv.requests_to("/v1/chat/completions")]
        assert [m["role"] for m in sent[1]] == ["system", "user", "assistant", "user"]
        assert sent[1][:2] == sent[0]  # the earlier request, message for message
        assert sent[1][2]["content"] == first.text
        assert second.usage.cached_tokens > 0


def test_remote_chat_without_replay_sends_one_user_message_that_extends_the_last(index: Index) -> None:
    with OpenAIServer() as srv:
        chat = RAG(index, llm=srv.base_url).chat()
        chat.ask("How long does a sourdough loaf proof before baking?", k=2)
        second = chat.ask("And at what temperature?", k=2)
        sent = [r["body"]["messages"] for r in srv.requests_to("/v1/chat/completions")]
        assert [m["role"] for m in sent[1]] == ["system", "user"]
        passages = sent[0][1]["content"].split("Question:")[0]
        assert sent[1][1]["content"].startswith(passages)  # earlier passages first, byte for byte
        assert second.usage.cached_tokens > 0


def test_a_turn_below_the_floor_adds_no_passages(index: Index) -> None:
    gen = Recorder()
    chat = RAG(index, gen).chat()
    off = chat.ask("Who won the 1998 World Cup?", k=2)
    assert off.abstained and off.sources == [] and gen.prompts == []
    chat.ask("How do I fix a flat bicycle tyre?", k=2)
    assert [len(t) for t in chat.turn_passages] == [0, 2] and len(chat.history) == 4 and len(gen.prompts) == 1
    # Later in a conversation the question in its context counts too (that is what lets "and at
    # what temperature?" through), so an off-topic turn is answered from the context's passages.
    assert not chat.ask("Who won the 1998 World Cup?", k=2).abstained


def test_merge_keeps_each_chunks_best_score() -> None:
    a = [Hit(1, 0.9, "a", "x"), Hit(2, 0.5, "b", "x")]
    b = [Hit(2, 0.7, "b", "x"), Hit(3, 0.6, "c", "x"), Hit(1, 0.1, "a", "x")]
    merged = merge_hits(a, b, k=3)
    assert [(h.chunk_id, h.score) for h in merged] == [(1, 0.9), (2, 0.7), (3, 0.6)]
    assert [h.chunk_id for h in merge_hits(a, b, k=2)] == [1, 2]
