"""The check's fifth pass (issue 29): a sentence cut off mid-phrase answers nothing, a "when" answer may
name a period, a bare value's backing sentence may leave the question's words to the sentences before
it, "Gen." ends no sentence, and a dropped final "g" ("Thinkin'") meets its word. Passages and answers
are the tuning slices' and the folder set's (`bench.answers --recheck`), in a real index built by the
real embedder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_verdict_question import built, verdict

from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.rag.sentences import content_words, split_sentences, stem
from slimrag.rag.verdict import answers, unfinished

DOCS = {
    "nq/1254.txt": "Former US President Dwight D. Eisenhower was considered for the role of himself in the film , and "
                   "he indicated his willingness . However , it was decided that makeup artists could n't make him "
                   "appear young enough to play his World War II self . The role of Gen. Eisenhower went to Tony "
                   "Jeffries , a set decorator with no acting experience but who had been in the film industry since "
                   "the mid-1930s . He was a dead ringer for the younger Eisenhower , though his voice differed .",
    "nq/0482.txt": "`` What Was I Thinkin ' '' is a song co-written and recorded by American country music artist "
                   "Hema Malini . It was released in October 2003 as the first single from the album .",
    "library/copy.rst.txt": (".. function:: deepcopy(x[, memo])\n\n   Return a deep copy of *x*.\n\n"
                             "* A *shallow copy* constructs a new compound object and then (to the extent\n"
                             "  possible) inserts *references* into it to the objects found in the original.\n\n"
                             "* A *deep copy* constructs a new compound object and then, recursively, inserts\n"
                             "  *copies* into it of the objects found in the original."),
    "library/logging.rst.txt": ("When a logger is created, the level is set to NOTSET (which causes all messages "
                                "to be processed when the logger is the root logger, or delegation to the parent "
                                "when the logger is a non-root logger). Note that the root logger is created with "
                                "level WARNING by default."),
    "library/socket.rst.txt": (".. function:: getdefaulttimeout()\n\n   Return the default timeout in seconds (float) "
                               "for new socket objects. A value of ``None`` indicates that new socket objects have "
                               "no timeout.\n\n.. function:: setdefaulttimeout(timeout)\n\n   Set the default "
                               "timeout in seconds (float) for new socket objects."),
    "library/datetime.rst.txt": (".. classmethod:: date.fromisoformat(date_string)\n\n   Return a :class:`date` "
                                 "corresponding to a *date_string* given in any valid ISO 8601 format.\n\n"
                                 "If date is a :class:`.datetime` object, its time components and "
                                 ":attr:`.tzinfo` attributes are ignored."),
    "nq/1200.txt": "`` It Is Well With My Soul '' is a hymn penned by hymnist Clarence Thomas and composed by "
                   "Philip Bliss . First published in Gospel Songs No. 2 by Ira Sankey and Bliss ( 1876 ) , it is "
                   "possibly the most influential and enduring in the Bliss repertoire .",
}


@pytest.fixture(scope="module")
def idx(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Index]:
    yield from built(tmp_path_factory, embedder, DOCS, "fifth")


def test_a_cut_off_sentence_answers_nothing() -> None:
    # the folder set's free answer to "How do I call a method defined in a base class ...?", cut at the
    # token limit; its only backed sentence made the answer partial, presented as backed
    q = "How do I call a method defined in a base class from a derived class?"
    assert unfinished("For example, if you have a class with methods like `")
    assert not answers(q, "For example, if you have a class with methods like `")
    assert unfinished("This means it will not be able to access any other handlers defined by")
    # whole sentences, and a bare value without a stop, are finished
    for done in ("The default precision of the decimal module is 28.", "The answer is: Tony Jeffries",
                 "Use `super()` in the derived class", "Here's how:"):
        assert not unfinished(done), done
    assert answers(q, "Use `super()` in the derived class")


def test_a_when_answer_may_name_a_period() -> None:
    q = ("When is the oldest recorded incident of civil disobedience or rather when did the earliest examples of "
         "civil disobedience as a whole occur ?")
    assert answers(q, "The earliest recorded incidents of civil disobedience occurred during the Roman Empire.")
    assert not answers(q, "The earliest recorded incidents of civil disobedience occurred in the streets.")
    assert not answers(q, "The earliest recorded incidents of civil disobedience occurred during protests.")


def test_a_title_abbreviation_ends_no_sentence() -> None:
    text = DOCS["nq/1254.txt"]
    sents = [s.text for s in split_sentences(text)]
    assert "The role of Gen. Eisenhower went to Tony Jeffries , a set decorator" in " ".join(sents)
    assert not any(s.startswith("Eisenhower went") for s in sents)
    assert [s.text for s in split_sentences("He met Dr. Smith. Then he left.")] == ["He met Dr. Smith.", "Then he left."]


def test_a_dropped_g_meets_its_word() -> None:
    assert stem("thinking") in content_words("`` What Was I Thinkin ' '' is a song")
    assert stem("rocking") in content_words("Rockin' Robin")
    # a possessive and a closing quote are no dropped g
    assert content_words("Berlin ' s wall") == {"berlin", "wall"}
    assert content_words("my 'cousin'") == {"cousin"}


def test_a_bare_value_reads_the_sentences_before_its_backing(idx: Index) -> None:
    # tuning slice, nq_conflicts free: labelled a wrong flag before (the backing sentence names only
    # Eisenhower of "who plays dwight eisenhower in the longest day?"; "play" and "Dwight" are before it)
    q = "who plays dwight eisenhower in the longest day?"
    assert verdict(idx, q, "The answer is: Tony Jeffries.") == ("supported", [True])
    # a sentence that says more than a name does not borrow the sentences before its backing: copied
    # from the right page, it says who published the hymn, not who wrote it
    q = "who wrote it is well with my soul hymn?"
    assert verdict(idx, q, "It was first published in Gospel Songs No. 2 by Ira Sankey and Bliss .")[0] == "not_backed"


def test_a_dropped_g_keeps_a_backed_answer_on_topic(idx: Index) -> None:
    # tuning slice, nq_conflicts free: "Thinkin '" did not meet "thinking", so the passage held too
    # little of the question and the right answer was withheld
    q = "who sings the song what was i thinking?"
    a = "The song \"What Was I Thinkin ' '' is a song by American country music artist Hema Malini."
    assert verdict(idx, q, a) == ("supported", [True])


def test_a_sentence_after_an_unbacked_one_answers_nothing_by_referring_back(idx: Index) -> None:
    # the folder set's free answer: "This method ..." after an invented function is backed, and its
    # subject is the invented function
    q = "How do I make a deep copy of an object?"
    it = ("It constructs a new compound object and then, recursively, inserts copies into it of the objects "
          "found in the original.")
    assert verdict(idx, q, "Use the `deep_copy()` function. " + it) == ("not_backed", [False, True])
    assert verdict(idx, q, "Use the `copy.deepcopy()` function. " + it) == ("supported", [True, True])


def test_a_qualifier_of_the_question_must_be_in_the_backing(idx: Index) -> None:
    # the folder set's free answer: NOTSET is the level of a logger when created, not the root logger's
    # default
    q = "What is the default level of the root logger?"
    assert verdict(idx, q, "The default level of the root logger is NOTSET.") == ("not_backed", [True])
    assert verdict(idx, q, "The default level of the root logger is WARNING.") == ("supported", [True])


def test_code_answering_which_function_does_what_is_asked(idx: Index) -> None:
    # the folder set's free answer named setdefaulttimeout, whose passage says "Set", for "returns"
    q = "Which function returns the default timeout for new socket objects?"
    right = "The :func:`getdefaulttimeout` function returns the default timeout in seconds for new socket objects."
    assert verdict(idx, q, right) == ("supported", [True])
    wrong = "The :func:`setdefaulttimeout` function returns the default timeout in seconds for new socket objects."
    assert verdict(idx, q, wrong) == ("not_backed", [True])


def test_a_way_is_answered_by_its_verb_or_by_code() -> None:
    # the folder set's free answer: a backed definition that says nothing of parsing
    q = "How do I parse an ISO 8601 date string into a date object?"
    assert not answers(q, "The `date` class in Python is a built-in datetime object.")
    assert answers(q, "Use `date.fromisoformat()` on the string.")
    assert answers(q, "You parse it with the date class's ISO 8601 constructor.")
    # a light verb need not be repeated ("make"), but a means must be told: what a deep copy is tells none
    # (tests/test_verdict_superseded.py)
    assert answers("How do I make a deep copy of an object?", "Use the copy module's deepcopy function.")
    assert not answers("How do I make a deep copy of an object?", "A deep copy constructs a new compound object.")


def test_an_open_bracket_at_the_end_is_cut_off() -> None:
    # the HTML folder set's free answer ended in a code block cut inside a call, presented as backed
    assert unfinished("def is_zipfile(obj):\n    return isinstance(obj, zlib.Z")
    assert unfinished("It appeared on four series ( Law & Order , Law & Order : Criminal Intent")
    assert not unfinished("It appeared on four series ( Law & Order , Law & Order : Criminal Intent ) .")
    assert not unfinished("def f(x): return g(x)", last_sentence=True)
    assert not unfinished("The call (as in f(x", last_sentence=False)  # only where the answer ends


def test_a_bracket_in_a_code_span_or_a_face_opens_nothing() -> None:
    assert not unfinished('Use `s.partition("(")`.')
    assert not unfinished("The pattern `[(]` matches an opening parenthesis.")
    assert not unfinished("That's all you need :(")
