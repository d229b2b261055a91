"""The CLI's evidence lines (`slimrag.cli.feedback.print_evidence`), byte for byte: the signature
before the quoted sentence, as `Evidence.quoted` puts it, and the sentence on one line."""

from __future__ import annotations

import pytest

from slimrag.cli.feedback import print_evidence
from slimrag.types import Answer, Evidence, Usage


def test_evidence_lines_put_the_signature_before_the_quoted_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    evidence = (Evidence("Generate a random\n   UUID.", "library/uuid.rst.txt#2", 7, 120, 146, 0.91, "uuid4()"),
                Evidence("The module defines  these functions.", "library/uuid.rst.txt#0", 5, 0, 35, 0.4))
    print_evidence(Answer("x", [], Usage(), "stop", evidence=evidence))
    assert capsys.readouterr().out == ('\nEvidence:\n'
                                       '  `uuid4()`: "Generate a random UUID." [library/uuid.rst.txt#2]\n'
                                       '  "The module defines these functions." [library/uuid.rst.txt#0]\n')


def test_no_evidence_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    print_evidence(Answer("x", [], Usage(), "stop"))
    assert capsys.readouterr().out == ""
