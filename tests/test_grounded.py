"""Grounded answers and the verdict (issue 29): `slimrag.rag.grounded`, `slimrag.rag.verdict` and the
pairing and code checks of `slimrag.rag.attribution`, against a real index built by the real embedder
and real `Generator` subclasses that stream a fixed reply and record their prompts (no mock library)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from slimrag.config import GenerationConfig
from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.llm.base import Delta, Generator
from slimrag.prompt import Prompt
from slimrag.rag.attribution import OFF_QUESTION_MARK, UNSUPPORTED_MARK, attribute
from slimrag.rag.code import identifiers
from slimrag.rag.grounded import IN_SHORT, LEAD
from slimrag.rag.pipeline import RAG
from slimrag.rag.verdict import NOT_BACKED, OFF_QUESTION, QUOTED, answers
from slimrag.types import FINISH_NOTICES, GROUNDED_CUT, Answer, Usage

DOCS = {
    "store/crates.md": "# Crates\n\nCrate 1 holds 3 gears. Crate 2 holds 17 gears. Crate 3 is empty.\n",
    "lib/json.txt": "loads(s, *, cls=None) Deserialize s (a str instance containing a JSON document) to a "
                    "Python object.\n\ndumps(obj) Serialize obj to a JSON formatted str.\n",
    "lib/statistics.txt": "median(data) Return the median (middle value) of numeric data. "
                          "median([1, 3, 5]) is 3. When the number of data points is even, the median is "
                          "interpolated by taking the average of the two middle values.\n",
    "notes/recipes.rst": "Soup\n====\n\nSimmer lentils with onion and cumin for half an hour.\n",
    "film/kubo.md": "# Kubo and the Two Strings\n\nMatthew McConaughey as Beetle, Kubo's father. "
                    "Charlize Theron as Monkey, Kubo's guardian.\n",
}


class Fixed(Generator):
    """Streams ``reply`` in pieces of 4 characters and records the prompts it was given."""

    thread_safe = True

    def __init__(self, reply: str, answer_mode: str = "free") -> None:
        self.reply = reply
        self.default_answer_mode = answer_mode
        self.prompts: list[Prompt] = []
        self.configs: list[GenerationConfig | None] = []

    def stream(self, prompt: Prompt, config: GenerationConfig | None = None) -> Iterator[Delta]:
        self.prompts.append(prompt)
        self.configs.append(config)
        for i in range(0, len(self.reply), 4):
            yield Delta(self.reply[i : i + 4])
        yield Delta("", finish_reason="stop", usage=Usage(prompt_tokens=10, completion_tokens=5))


@pytest.fixture(scope="module")
def idx(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Index]:
    root: Path = tmp_path_factory.mktemp("grounded")
    index = Index.build(list(DOCS.items()), root / "g.slimrag", embedder=embedder, storage="flat")
    yield index
    index.close()


CRATE = "How many gears does crate 2 hold?"


@pytest.mark.parametrize(("answer", "supported"), [
    ("Crate 2 holds 17 gears.", True),
    ("Crate 2 holds 3 gears.", False),  # 3 is crate 1's: the term check alone passed it (2 is asked)
    ("It holds 17 gears.", True),
])
def test_a_value_must_stand_with_its_subject(idx: Index, answer: str, supported: bool) -> None:
    check = attribute(CRATE, answer, idx.search(CRATE, k=4), idx.embedder)
    assert [s.supported for s in check.support] == [supported]


@pytest.mark.parametrize(("answer", "supported"), [
    ("The voice of the monkey in Kubo is Charlize Theron.", True),
    ("The voice of the monkey in Kubo is Matthew McConaughey.", False),  # his sentence is about Beetle
])
def test_a_name_must_stand_with_the_answers_topic(idx: Index, answer: str, supported: bool) -> None:
    q = "who does the voice of the monkey in kubo?"
    check = attribute(q, answer, idx.search(q, k=4), idx.embedder)
    assert [s.supported for s in check.support] == [supported]


def test_a_backed_sentence_from_passages_about_something_else_answers_nothing(idx: Index) -> None:
    from slimrag.rag.verdict import kind_of

    q = "How long should lentil soup simmer on the stove?"
    hits = idx.search(q, k=4)
    on = attribute(q, "Lentil soup simmers for half an hour.", hits, idx.embedder)
    assert kind_of(q, on.support, hits) == "supported"
    off_q = "How many gears does the red crate in the cellar hold, by the inventory?"
    off = attribute(off_q, "Crate 2 holds 17 gears.", hits := idx.search(off_q, k=4), idx.embedder)
    assert off.support[0].supported and kind_of(off_q, off.support, hits) == "not_backed"
    assert kind_of(off_q, off.support) == "supported"  # without the passages, the topic rule is not applied


def test_code_must_be_in_the_passages(idx: Index) -> None:
    q = "How do I parse a JSON string into a Python object?"
    hits = idx.search(q, k=4)
    assert identifiers("Call json.loads(s) or median(data), e.g. for the file(s).") == {"json.loads", "median"}
    good = attribute(q, "Use json.loads:\n```python\nobj = json.loads(text)\n```\n", hits, idx.embedder)
    assert [s.supported for s in good.support][-1] is True
    bad = attribute(q, "Use a decoder:\n```python\nobj = json.JSONDecoder(strict=False).decode(text)\n```\n",
                    hits, idx.embedder)
    block = bad.support[-1]
    assert "JSONDecoder" in block.sentence and not block.supported and block.unknown_terms == ("json.JSONDecoder",)
    prose = attribute(q, "Call json.JSONEncoder(indent=4) on the string.", hits, idx.embedder)
    assert not prose.support[0].supported and "json.JSONEncoder" in prose.support[0].unknown_terms


@pytest.mark.parametrize(("sentence", "answered"), [
    ("To copy an entire directory tree rooted at *src* to a new location *dst*.", False),  # a purpose clause alone
    ("To copy a directory tree, use `shutil.copytree`.", True),
    ("To copy a tree, call copytree(src, dst).", True),
    ("You can copy it with shutil.copytree.", True),
])
def test_a_purpose_clause_alone_answers_nothing(sentence: str, answered: bool) -> None:
    assert answers("How do I copy an entire directory tree?", sentence) is answered


def test_a_title_opening_with_to_is_no_purpose_clause() -> None:
    assert answers("Who wrote To Kill a Mockingbird?", "To Kill a Mockingbird was written by Harper Lee.")


def test_a_purpose_clause_answers_a_question_that_asks_no_way() -> None:
    assert answers("To monitor what event would measuring radiance from vegetation provide information?",
                   "To monitor carbon cycle from satellites on a global scale.")


def test_restating_the_question_is_no_answer() -> None:
    assert not answers("How many gears does crate 2 hold?", "Crate 2 holds gears.")
    assert answers("How many gears does crate 2 hold?", "Crate 2 holds 17 gears.")
    assert not answers("When was the bridge opened?", "The bridge was opened by the mayor.")
    assert not answers("who played austin reed?", "The answer to this question is: Austin Reed.")
    assert not answers("who plays arthur?", "Who plays King Arthur in the film?")


def test_free_answer_no_passage_backs_is_not_shown_as_the_answer(idx: Index) -> None:
    rag = RAG(idx, Fixed("Crate 2 holds 3 gears."), answer="free")
    ans = rag.ask(CRATE)
    assert ans.mode == "free" and ans.verdict == "not_backed" and not ans.backed
    assert ans.shown.startswith(NOT_BACKED) and "[store/crates.md#0]" in ans.shown and "3 gears" not in ans.shown.split(
        "\n", 1)[0]
    right = RAG(idx, Fixed("Crate 2 holds 17 gears."), answer="free").ask(CRATE)
    assert right.verdict == "supported" and right.shown == "Crate 2 holds 17 gears [store/crates.md#0]."


def test_an_unsupported_sentence_inside_a_backed_answer_is_marked_where_it_stands(idx: Index) -> None:
    text = "Crate 2 holds 17 gears. Crate 2 was built by Chef Ramsay. That is all."
    ans = RAG(idx, Fixed(text), answer="free").ask(CRATE)
    assert ans.verdict == "partial"
    assert ans.shown == ("Crate 2 holds 17 gears [store/crates.md#0]. Crate 2 was built by Chef Ramsay "
                         f"{UNSUPPORTED_MARK}. That is all.")


def test_grounded_streams_the_passages_first_and_marks_the_models_sentence(idx: Index) -> None:
    gen = Fixed("Crate 2 holds 3 gears.", answer_mode="grounded")  # the generator's default decides
    pieces = list(RAG(idx, gen).stream_answer(CRATE, 4))
    ans = pieces[-1]
    assert isinstance(ans, Answer) and ans.mode == "grounded"
    text = [p for p in pieces if isinstance(p, str)]
    lead = text[0]
    assert lead.splitlines()[0].endswith("[store/crates.md#0]") and "17 gears" in lead
    assert len(lead.splitlines()) == LEAD
    assert text[1] == IN_SHORT and text[-1] == f" {UNSUPPORTED_MARK}"  # the last thing streamed is the mark
    assert ans.text == "".join(text).strip() and ans.verdict == "not_backed" and ans.shown.startswith(NOT_BACKED)
    # the model read a few evidence sentences, not the passages, and wrote one short line
    prompt = gen.prompts[0]
    assert sum(len(p.text) for p in prompt.passages) < sum(len(h.text) for h in ans.sources)
    assert gen.configs[0] is not None and "\n" in gen.configs[0].stop and gen.configs[0].max_new_tokens <= 48
    assert ans.usage.ttft_s <= ans.usage.total_s
    # it may copy only from what it read and the question (a generator that copies honours it)
    read = " ".join(p.text for p in prompt.passages)
    copy_from = gen.configs[0].copy_from
    assert copy_from[-1] == CRATE and all(t in read for t in copy_from[:-1]) and gen.configs[0].copy_spans == 1


def test_grounded_backed_sentence_is_cited_and_free_overrides_the_default(idx: Index) -> None:
    gen = Fixed("Crate 2 holds 17 gears.", answer_mode="grounded")
    ans = RAG(idx, gen).ask(CRATE)
    assert ans.verdict == "supported" and ans.text.endswith("Crate 2 holds 17 gears. [store/crates.md#0]")
    assert ans.shown.endswith("Crate 2 holds 17 gears [store/crates.md#0].") and "store/crates.md#0" in ans.used
    free = RAG(idx, gen, answer="free").ask(CRATE)
    assert free.mode == "free" and free.text == "Crate 2 holds 17 gears."
    with pytest.raises(ValueError, match="answer must be one of"):
        RAG(idx, gen, answer="quoted")
    per_request = RAG(idx, Fixed("Crate 2 holds 17 gears.")).respond(CRATE, answer="grounded").answer
    assert per_request.mode == "grounded" and per_request.text.startswith("Crate 2 holds 17 gears.")


def test_the_answer_stream_is_text_then_the_checked_answer(idx: Index) -> None:
    import json

    from slimrag.rag.wire import answer_json

    stream = RAG(idx, Fixed("Crate 2 holds 17 gears."), answer="free").respond(CRATE)
    text = "".join(stream)
    assert all(isinstance(p, str) for p in stream) and text == "Crate 2 holds 17 gears."
    ans = stream.answer
    assert ans.text == text and stream.text() == text
    wire = json.loads(json.dumps(answer_json(ans)))
    assert wire["verdict"] == "supported" and wire["backed"] and wire["mode"] == "free"
    assert wire["sources"][0]["label"] == ans.sources[0].label and wire["used"] == ["store/crates.md#0"]
    assert wire["support"][0]["supported"] and wire["usage"]["completion_tokens"] == 5


def test_a_backed_sentence_that_answers_nothing_asked_is_said_so_not_marked_unbacked(idx: Index) -> None:
    """Copied from a passage but answering another question ("Crate 2 holds gears.": the question said again):
    free, the notice says it repeats the passages and the sources used are those quoted in its
    place; grounded, the sentence keeps its label and the mark says it does not answer."""
    free = RAG(idx, Fixed("Crate 2 holds gears."), answer="free").ask(CRATE)
    assert free.verdict == "not_backed" and free.shown.startswith(OFF_QUESTION)
    assert free.used and set(free.used) <= {e.label for e in free.evidence[:QUOTED]}
    pieces = list(RAG(idx, Fixed("Crate 2 holds gears.", answer_mode="grounded")).stream_answer(CRATE, 4))
    ans = pieces[-1]
    assert isinstance(ans, Answer) and ans.verdict == "not_backed" and ans.shown.startswith(OFF_QUESTION)
    assert pieces[-2] == f" [store/crates.md#0] {OFF_QUESTION_MARK}" and UNSUPPORTED_MARK not in ans.text
    unbacked = RAG(idx, Fixed("Crate 9 holds 40 gears.", answer_mode="grounded")).ask(CRATE)
    assert unbacked.shown.startswith(NOT_BACKED) and unbacked.text.endswith(UNSUPPORTED_MARK)
    assert set(unbacked.used) == {e.label for e in unbacked.evidence[:LEAD]}  # the lead's sources alone


def test_a_grounded_cut_says_its_limit_is_fixed() -> None:
    cut = Answer("x", [], Usage(), finish_reason="length", mode="grounded", verdict="supported")
    assert cut.notice == GROUNDED_CUT and "more tokens" not in cut.notice
    assert replace(cut, mode="free").notice == FINISH_NOTICES["length"]


def test_a_lead_sentence_from_a_passage_far_below_the_best_is_left_out() -> None:
    """`lead_of`: the first sentence always leads; a later one whose passage scores under
    `LEAD_FLOOR` of the best hit is left out (a new user saw an unrelated package's changelog line
    at 0.164 quoted and listed as used)."""
    from slimrag.rag.grounded import LEAD_FLOOR, lead_of
    from slimrag.types import Evidence, Hit

    hits = [Hit(1, 0.6, "a", "a.md", {"ordinal": 0}), Hit(2, 0.5, "b", "b.md", {"ordinal": 0}),
            Hit(3, 0.6 * LEAD_FLOOR - 0.01, "c", "c.md", {"ordinal": 0})]
    ev = [Evidence("c", hits[2].label, 3, 0, 1, 0.9), Evidence("a", hits[0].label, 1, 0, 1, 0.8),
          Evidence("c2", hits[2].label, 3, 0, 1, 0.7), Evidence("b", hits[1].label, 2, 0, 1, 0.6)]
    assert [e.text for e in lead_of(ev, hits)] == ["c", "a"]  # the first stays; c2 (same low passage) goes
    assert [e.text for e in lead_of(ev, hits[:2])] == ["c", "a", "c2"]  # a passage not among the hits: kept
