"""A dropped final "g" ("thinkin'") is written back unless its "'" closes a quote still open there
(`slimrag.rag.sentences._restore_g`): a quote opened and closed before it ("my 'cousin'") does not count."""

from __future__ import annotations

from slimrag.rag.sentences import content_words, stem


def test_a_quote_closed_before_the_word_does_not_keep_its_g_dropped() -> None:
    # the quote opened before "cousin" closes after it: the "'" of "thinkin'" closes nothing
    assert content_words("my 'cousin' was thinkin' of") == {"cousin", stem("thinking")}


def test_a_tokenized_dropped_g_is_written_back() -> None:
    assert content_words("Thinkin ' Bout You") == {stem("thinking"), "bout"}


def test_a_quote_still_open_keeps_the_word_as_it_is() -> None:
    # the "'" closes the quote opened before "stop": it is the quote's, not a dropped g
    assert content_words("he said 'stop thinkin'") == {"said", "stop", "thinkin"}
    assert content_words("my 'cousin'") == {"cousin"}
