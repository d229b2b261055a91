"""The copy rule's connectors and marks (`slimrag.llm.engine.copying.Joining`) are read once per
tokenizer and kept by the generator: a request's constraint is the one built by reading them afresh,
on the real tokenizer of the embedded model."""

from __future__ import annotations

import pytest

from slimrag.llm.engine.copying import CopyConstraint
from slimrag.llm.local import LocalGenerator
from slimrag.llm.weights import LoadedModel


@pytest.fixture(scope="module")
def gen(smollm: LoadedModel) -> LocalGenerator:
    return LocalGenerator(loaded=smollm)  # the session's loaded model: its tokenizer, no second load


TEXTS = ("The earliest recorded incidents of civil disobedience occurred during the Roman Empire.",
         "json.loads(s) deserializes s (a str, bytes or bytearray) to a Python object.",
         "What does json.loads return?")


def test_a_kept_joining_builds_the_constraint_a_fresh_read_does(gen: LocalGenerator) -> None:
    first = gen.copy_constraint(TEXTS[:1])
    kept = gen._joining
    cached = gen.copy_constraint(TEXTS, spans=1)
    assert gen._joining is kept and kept is not None  # read once, by the first request
    fresh = CopyConstraint.build(TEXTS, gen.encode_texts, lambda t: gen.decode([t]), gen.runner.eos,
                                 gen.load().model.config.vocab_size, 1)
    for name in ("sources", "starts", "openers", "ends", "stops", "joiners", "vocab", "spans"):
        assert getattr(cached, name) == getattr(fresh, name), name
    assert set(kept.joiners) <= set(cached.starts) | set(cached.openers)  # connectors open copies
    assert first.sources[-len(kept.marks):] == [list(m) for m in kept.marks]
