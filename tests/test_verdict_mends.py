"""The fourth pass's rules mended (issue 29, review of the session of 2026-11-29): a backed code block
is on the question through the passages that back it, every sentence backing an answer counts, a ':'
lead-in that already holds the asked value answers, "when" opening a question asks for a time, ordinary
words are no take-back, and the stemmer's undoubling leaves names and '-ff' words
alone. Passages are real (held-out disfl_qa #32, the Python docs), in an index built by the real embedder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_verdict_question import built, verdict

from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.rag.question import answer_type
from slimrag.rag.sentences import content_words, stem
from slimrag.rag.verdict import answers

DOCS = {
    "py/statistics.txt": "statistics.median(data) Return the median (middle value) of a list of numbers, using the "
                         "common mean of middle two method. If data is empty, StatisticsError is raised. data "
                         "can be a sequence or iterable.",
    "disfl_qa/0934.txt": ("The USSR ' s invasion of Afghanistan was only one sign of insecurity in the region , also marked"
                          " by increased American weapons sales , technology , and outright military presence . Saudi "
                          "Arabia and Iran became increasingly dependent on American security assurances to manage both "
                          "external and internal threats , including increased military competition between them over "
                          "increased oil revenues . Both states were competing for preeminence in the Persian Gulf and "
                          "using increased revenues to fund expanded militaries . By 1979 , Saudi arms purchases from the "
                          "US exceeded five times Israel ' s . Another motive for the large scale purchase of arms from the"
                          " US by Saudi Arabia was the failure of the Shah during January 1979 to maintain control of Iran "
                          ", a non - Arabic but largely Shiite Muslim nation , which fell to a theocratic Islamist "
                          "government under the Ayatollah Ruhollah Khomeini in the wake of the 1979 Iranian Revolution . "
                          "Saudi Arabia , on the other hand , is an Arab , largely Sunni Muslim nation headed by a near "
                          "absolutist"),
    "film/fugitive.txt": "The Fugitive is a 1993 American action thriller film . Its lead role went to a star of the "
                         "Indiana Jones films . Harrison Ford starred as "
                         "Richard Kimble , a surgeon wrongly convicted of his wife 's murder .",
}


@pytest.fixture(scope="module")
def idx(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Index]:
    yield from built(tmp_path_factory, embedder, DOCS, "mends")


def test_a_backed_code_block_is_on_the_question_through_its_passages(idx: Index) -> None:
    q = "How can I compute the median of a list of numbers?"
    assert verdict(idx, q, "```python\nstatistics.median([2, 3, 4, 5])\n```") == ("supported", [True])


def test_every_backing_sentence_counts_for_the_question(idx: Index) -> None:
    # held-out disfl_qa #32, grounded: labelled right, was withheld when only the first backing
    # sentence was read
    q = "Which country ' s arms purchase from the US became 4 oops 5 times more than Afghanistan no Israel ?"
    assert verdict(idx, q, "The answer is: Saudi Arabia.") == ("supported", [True])
    # a bare value is not exempt (three wrong backed values held-out for one right): what backs it must
    # be on the question, here through the sentence before "starred as Richard Kimble" (fifth pass:
    # `test_verdict_fifth`), which names the lead role
    assert verdict(idx, "Who played the lead?", "Harrison Ford.") == ("supported", [True])
    assert verdict(idx, "Who played the lead?", "The Fugitive is a 1993 American action thriller film .")[0] == "not_backed"


def test_a_lead_in_that_holds_the_asked_value_answers() -> None:
    assert answers("When did Kublai move the capital?", "In 1267 he moved the capital to the following city:")
    q = "How many parts does the consideration of a bill in Stage 3 have?"
    assert answers(q, "Stage 3 has 4 parts, as follows:")
    assert not answers(q, "The consideration of a bill in Stage 3 goes as follows:")


def test_when_opening_a_question_asks_for_a_time() -> None:
    for q in ("When exactly did the Berlin Wall fall?", "When in the 1990s was the euro introduced?",
              "When approximately was the pyramid built?"):
        assert answer_type(q) == "when", q
    assert answer_type("When I add files, what does git status show?") is None
    assert answer_type("When forces are at right angles to each other what can they be broken down to ?") is None


def test_ordinary_words_are_no_take_back() -> None:
    assert answer_type("How many people have no access to clean water where they live?") == "number"
    assert answer_type("How long does it actually take to boil an egg?") == "number"
    assert answer_type("How many stages no um parts does the consideration of a bill in Stage 3 have ?") == "number"
    assert answer_type("Where did Kublai um oh no rather when did he move the Mongol capital ?") == "when"
    assert answer_type("When did wait where did this pro - reform leader teach ?") == "name"


def test_undoubling_leaves_names_and_doubled_base_words_alone() -> None:
    meet = [("staffed", "staff"), ("stuffed", "stuff"), ("diffed", "diff"), ("sniffing", "sniff"),
            ("butted", "butt"), ("purring", "purr"), ("starring", "star"), ("stopped", "stop"),
            ("running", "run"), ("committed", "commit"), ("butts", "butt")]
    assert [a for a, b in meet if stem(a) != stem(b)] == []
    apart = [("earring", "ear"), ("Manning", "man"), ("Redding", "red"), ("Channing", "chan")]
    assert [a for a, b in apart if stem(a) == stem(b)] == []
    assert "kimble" in content_words("Harrison Ford starred as Richard Kimble")
