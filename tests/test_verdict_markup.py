"""An HTML tag states no claim (a new user's walkthrough: "Which Python version does fastapi
require?" was answered, backed and cited, by a README badge copied word for word,
``<img src="https://img.shields.io/pypi/v/fastapi..." alt="Package version">``). `answers` reads a
sentence without its tags; code spans keep theirs, and a bare URL still answers where one is asked."""

from __future__ import annotations

from slimrag.rag.verdict import answers

BADGE = ('<img src="https://img.shields.io/pypi/v/fastapi?color=%2334D058&label=pypi%20package" '
         'alt="Package version">')


def test_a_badge_answers_nothing_and_the_words_around_a_tag_still_do() -> None:
    q = "Which Python version does fastapi require?"
    assert not answers(q, BADGE)
    assert not answers(q, f"{BADGE} {BADGE}")
    assert answers(q, "FastAPI requires Python 3.8 or newer.")
    assert answers(q, "<p>FastAPI requires Python 3.8 or newer.</p>")


def test_code_spans_keep_their_angle_brackets_and_a_url_still_answers_where() -> None:
    assert answers("How do I declare a list of ints in C++?", "Use `std::vector<int>`.")
    assert answers("Where is the documentation?", "The documentation is at https://fastapi.tiangolo.com.")


def test_a_sentence_ending_on_an_article_or_of_was_cut_however_the_generator_stopped() -> None:
    """A new user's walkthrough: a grounded sentence whose copied span ran out, "... or other
    modification of the", stopped by itself and was shown as backed. No phrase ends on "the",
    "a", "an" or "of" without a stop; a capital one may be a name ("plan A")."""
    from slimrag.rag.verdict import unfinished

    cut = "Certifi does not support any addition/removal or other modification of the"
    assert unfinished(cut, last_sentence=False) and unfinished(cut)
    assert not answers("Does certifi support modifying its bundle?", cut, last_sentence=False)
    assert not unfinished("Use plan A", last_sentence=False)
    assert not unfinished("- Python 3.10 and above", last_sentence=False)  # a list item stays whole
