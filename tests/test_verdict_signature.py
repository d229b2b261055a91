"""Code answering "which function <verb>s ...?" is documented by the sentence under its signature (issue
29, `slimrag.rag.signatures.does_what_asked`), and is what that signature names (`names_what_is_documented`): the folder set's free answer "The function `pbkdf2_hmac`
derives a key from the password." was backed by the signature line alone and withheld, though the
sentence under it says "key derivation". The passages here are written for this test, in a real index
built by the real embedder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_verdict_question import built, verdict

from slimrag.embed.local import LocalEmbedder
from slimrag.index.core import Index
from slimrag.rag.signatures import _says, signature_line

DOCS = {
    "library/vault.rst.txt": (
        ".. function:: stretch_secret(secret, salt, rounds)\n\n"
        "   The function provides salted secret-based key derivation for stored secrets.\n\n"
        ".. function:: seal_blob(blob, key)\n\n"
        "   Encrypt *blob* with *key* and return the sealed bytes."),
    "library/patterns.rst.txt": (
        ".. data:: X\n          VERBOSE\n\n"
        "   Ignore whitespace within the pattern; patterns like ``a b c`` then match ``abc``.\n"),
}


@pytest.fixture(scope="module")
def idx(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Index]:
    yield from built(tmp_path_factory, embedder, DOCS, "signature")


def test_the_sentence_under_a_signature_documents_it(idx: Index) -> None:
    q = "Which vault function derives a key from a secret?"
    assert verdict(idx, q, "The function `stretch_secret` derives a key from the secret.") == ("supported", [True])
    # the function documented after it does something else
    assert verdict(idx, q, "The function `seal_blob` derives a key from the secret.")[0] == "not_backed"


def test_a_word_made_from_the_verb_says_it() -> None:
    assert _says("deriv", "key derivation for stored secrets")
    assert _says("deriv", "It derives a key.")
    assert not _says("set", "Change the settings.")  # a short stem begins unrelated words
    assert _says("set", "Set the default timeout.")


def test_a_note_signs_nothing() -> None:
    assert signature_line(".. function:: pbkdf2_hmac(hash_name, password, salt, iterations)")
    assert signature_line(".. c:function:: int Py_EnterRecursiveCall(const char *where)")
    assert not signature_line(".. versionchanged:: 3.5.1")


def test_code_named_for_which_flag_is_what_the_backing_documents(idx: Index) -> None:
    # the folder set's free answer named the example of the flag's description, not the flag
    q = "Which pattern flag makes the pattern ignore whitespace?"
    assert verdict(idx, q, "The ``VERBOSE`` flag makes the pattern ignore whitespace.") == ("supported", [True])
    wrong = "The pattern ``a b c`` is the only flag that makes the pattern ignore whitespace."
    assert verdict(idx, q, wrong) == ("not_backed", [True])  # backed, and names an example
