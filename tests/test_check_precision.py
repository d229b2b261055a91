"""The check's precision as `bench.answers` counts it (issue 29): an answer is flagged when any part of
what is shown is withheld or marked; ``check_precision`` counts every flag on a model text holding the
gold string as a miss, ``mark_precision`` only one whose withheld or marked text holds it, and
``read_precision`` forgives a miss that a hand label calls a right flag."""

from __future__ import annotations

from typing import Any

from bench.answers import _flagged_text, summarize
from slimrag.types import Support


def view(verdict: str, model_gold: bool, marked_gold: bool, shown_gold: bool) -> dict[str, Any]:
    return {"verdict": verdict, "abstained": False, "model_gold": model_gold, "marked_gold": marked_gold,
            "shown_gold": shown_gold, "ttfb_s": 0.1, "total_s": 1.0, "model": f"text {verdict} {model_gold}"}


RECORDS = [
    # withheld, no gold: a right flag by every count
    {"question": "q1", "retrieved": True, "free": view("not_backed", False, False, True)},
    # withheld, gold in the text: a miss by every count but a label's
    {"question": "q2", "retrieved": True, "free": view("not_backed", True, True, True)},
    # partial: gold in a backed, cited sentence, another sentence marked
    {"question": "q3", "retrieved": True, "free": view("partial", True, False, True)},
    # supported and right; supported and wrong (confidently wrong)
    {"question": "q4", "retrieved": True, "free": view("supported", True, False, True)},
    {"question": "q5", "retrieved": False, "free": view("supported", False, False, False)},
]


def test_precisions_count_what_is_withheld_or_marked() -> None:
    m = summarize(RECORDS)["free"]
    assert m["withheld_or_marked"] == 3 / 5
    assert m["check_precision"] == 1 - 2 / 3  # q2 and q3 hold the gold string
    assert m["mark_precision"] == 1 - 1 / 3  # q3's gold is shown backed: only q2 is a miss
    assert m["read_precision"] is None  # no labels given
    assert m["confidently_wrong"] == 1 / 5


def test_a_label_forgives_only_a_flag_it_calls_right() -> None:
    labels = {"s|free|q2": "right", "s|free|q3": "wrong", "other|free|q2": "wrong"}
    assert summarize(RECORDS, labels, "s")["free"]["read_precision"] == 1 - 1 / 3  # q2 forgiven, q3 not
    assert summarize(RECORDS, labels, "other")["free"]["read_precision"] == 1 - 2 / 3


def test_a_label_read_on_another_text_forgives_nothing() -> None:
    # the model wrote something else in a later run: the reader's label judged the old text
    read = {"label": "right", "reason": "an invented year", "text": "text not_backed True"}
    assert summarize(RECORDS, {"s|free|q2": read}, "s")["free"]["read_precision"] == 1 - 1 / 3
    stale = {**read, "text": "what the model wrote before"}
    assert summarize(RECORDS, {"s|free|q2": stale}, "s")["free"]["read_precision"] == 1 - 2 / 3


def test_the_flagged_text_is_what_the_reader_does_not_see_as_backed() -> None:
    support = (Support("Pitt ordered it.", ("a#0",), (), True), Support("He was born in 1971.", (), (), False))
    said = "Pitt ordered it. He was born in 1971."
    assert _flagged_text("not_backed", said, support) == said
    assert _flagged_text("partial", said, support) == "He was born in 1971."
    assert _flagged_text("supported", said, support) == ""
