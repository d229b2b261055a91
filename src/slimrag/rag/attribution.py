"""Attribution after generation: which passage sentences back each answer sentence, and what the
answer states that no passage does.

A wrong answer beside the right sources borrows their authority ("The default maximum number of
concurrent connections is 10." next to the page that says 100). Attribution checks the answer
against its passages sentence by sentence, so the reader sees which sentences are backed and by
what, and which are not.

Algorithm
    The answer (its citation brackets removed) and every passage are cut into sentences
    (`slimrag.rag.sentences`); all are embedded in one batch by the index's embedder. For an answer
    sentence ``a`` and a passage sentence ``s``:

    - ``match(a, s) = (cos(a, s) + overlap(a, s)) / 2``, where ``overlap`` is the share of ``a``'s
      content words that ``s`` holds, a word found only in its neighbours (the sentences just
      before and after it in the same section) counting half: a short answer sentence often joins
      the subject of one passage sentence to the fact of the next;
    - ``s`` can back ``a`` only if every number and name of ``a`` (`key_terms`) is in ``s`` itself
      or in the question: "is 256" is not backed by "is 128" however similar the two are, nor by a
      neighbour's number (a heading between two recipes would otherwise lend one's time to the
      other).

    - pairing: a number or name of ``a`` that the question also holds (the answer's subject: "crate 2"
      in "Crate 2 holds 3 gears") must be in ``s`` too, unless ``s`` opens with a pronoun and names
      nothing but ``a``'s other numbers and names ("It holds 17 gears."): "Crate 1 holds 3 gears"
      cannot back "Crate 2 holds 3 gears" although it holds the 3 and the question holds the 2;
    - topic: of the content words ``a`` repeats from the question (its subject in words: "voice",
      "monkey", "kubo"), at least half must be in ``s`` when there are two or more (in the sentence
      before too when ``s`` opens with a pronoun): "The voice of the monkey in Kubo is Matthew
      McConaughey." is not backed by "Matthew McConaughey as Beetle, Kubo's father";
    - code: the identifiers of ``a`` (dotted names and calls, ``json.loads``, ``median(``) must be
      in some passage, like numbers and names; a fenced code block of the answer is checked as
      one unit, its identifiers and calls against the passages' text (`code_support`): a block
      that calls what no passage shows is unsupported, whatever its prose.

    - what ``a`` adds: of ``a``'s content words that the question lacks (conversation words, code
      and the corpus's vocabulary aside), at least `NEW_SHARE` (half) must be in ``s``, a word only
      in its neighbours counting half. Restating the question lifts the match of a sentence that
      adds something else: "any prime number larger than 5 is called a composite number" matched
      0.59 a sentence about primes ending in 1, 3, 7 or 9;
    - context: a subject name that ``s`` lacks (not a number: "Crate 3 is empty." after "Crate 2
      holds 17 gears." is another crate), and the question's words for the topic rule, may be in
      the `CONTEXT_BACK` (2) sentences before ``s`` in its passage, when ``s`` names nothing but
      the answer's and the question's names ("Austin Reed is a character ... The role was played by
      actor Ali Campbell");
    - code in place: each identifier of ``a`` must be shown by ``s``, its neighbours (a line too
      short to be a candidate counts: the signature ".. function:: getrecursionlimit()" before the
      sentence documenting it) or its passage's source name, not only somewhere in the passages
      ("use `heapq.nlargest`" for the n smallest elements is not backed by a sentence about ``max``
      and ``min``); an identifier shown there counts as held by ``s`` for what ``a`` adds, and a
      Sphinx role (":func:", ":const:") is markup, not something ``a`` adds;
    - the corpus's vocabulary (``common``, `slimrag.rag.vocabulary`: a word in half the index's
      documents, "Python" in the Python docs) is no claim: it need not be in ``s``, nor anywhere;
    - a hyphenated name is found where tokenized text spaces its parts ("Lieutenant - Governor"); a
      sentence under a signature line (`slimrag.rag.signatures`) holds its names and words, for the
      rules on names and on what ``a`` adds, not for its match ("The numeric constant ..." under
      ``.. data:: ZIP_DEFLATED``).

    ``a`` is *supported* when some ``s`` that can back it has ``match >= SUPPORT`` (0.4); its
    supporting passages are those of such sentences, best first. Separately, a number or name of
    ``a`` found in no passage and not in the question is an *unknown term*: the model invented it
    or brought it from memory. A sentence with an unknown term is never supported.

    A sentence with no content words and no terms ("Sure!", "I hope this helps.") is neither
    checked nor flagged: it claims nothing. Nor is a list item's number alone ("1.", cut off its
    item by the sentence splitter), nor a lead-in: a sentence ending in ":" that names no number,
    name or code and has at most `LEAD_IN_WORDS` (3) content words ("Here's a simple example:",
    "Here's how it works:"); it introduces what follows, which is checked.

Knobs
    `SUPPORT` (0.4): the match needed. Chosen on the labelled set of `bench.attribution` (answers
    quoting a passage sentence or stating the gold value, and the same with the number or name
    swapped for another question's) as the strictest value whose "unsupported" flag has precision
    >= 0.9 on disfl_qa (0.917, recall 0.966), checked on nq_conflicts (0.992, recall 0.992);
    0.55 flagged too many true short answers (precision 0.754 / 0.800). Recall barely moves with
    the threshold there, because a swapped value found in no passage is caught by the term check;
    a value swapped for one that another sentence of the passages holds ("for forty minutes", the
    bread's time, for the soup) is caught only when the match stays below the threshold, which a
    lower threshold makes rarer. Figures in docs/benchmarks.md, "Attribution".

    `NEW_SHARE` (0.5): on the tuning slices of `bench.answers` (70 recorded answers a set and mode,
    re-judged with ``--recheck``), 0.34 let free-form confidently wrong answers on disfl_qa rise to
    0.129, 0.67 flagged more right answers (free-form check precision 0.689 on disfl_qa) for no
    fewer wrong ones. `CONTEXT_BACK` (2): a sentence naming its subject and the next one stating
    the value, with at most one sentence between.

Results
    `Support` per answer sentence; ``used`` = the labels backing at least one sentence, in source
    order: always a subset of the retrieved labels, by construction. `with_markers` appends
    ``[label]`` (the citation form answers use, which the CLI and the web page already resolve) to
    each supported sentence that cites nothing itself, and `UNSUPPORTED_MARK` after each sentence
    no passage backs, where it stands.

Grain
    The sentence is the unit: a sentence that states the right value beside a clause no passage
    says ("... 47 streetcars ... in 1885, not 30") is marked whole. Checking each clause alone was
    measured (docs/benchmarks.md, "The check, third pass") and not kept: once the invented clause no
    longer sinks the sentence, its other clause is judged alone, and as many wrong answers were
    presented as backed ("The novel was first published in 1890 by ..." for "who wrote ...") as
    right values were cleared.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from slimrag.rag.code import FENCE, code_support, code_text, identifiers, shown
from slimrag.rag.evidence import Candidates, Embeds
from slimrag.rag.sentences import (
    CHATTER_STEMS,
    NUMBER_WORDS,
    Sentence,
    content_words,
    key_terms,
    split_sentences,
    words,
)
from slimrag.rag.signatures import signature_names, signature_of
from slimrag.types import Evidence, Hit, Support

#: The match (mean of cosine and content-word recall) an answer sentence needs from a passage sentence.
SUPPORT = 0.4
#: Share of what an answer sentence adds to the question (its content words the question lacks) that
#: its backing sentence must hold (module header).
NEW_SHARE = 0.5
#: Sentences before a passage sentence that may name the answer's subject and topic for it (module header).
CONTEXT_BACK = 2

#: Most content words (conversation words aside) of a lead-in: a sentence ending in ":" that names no
#: number, name or code ("Here's a simple example:", "It works like this:") claims nothing (module header).
LEAD_IN_WORDS = 3

#: The corpus's vocabulary: of some words, those its documents share (`slimrag.rag.vocabulary`).
Common = Callable[[Iterable[str]], set[str]]

_CITATION = re.compile(r"\s*\[[^\[\]\n]*#\d+[^\[\]\n]*\]")
#: A list item's number or letter alone ("1.", "b)"), which the sentence splitter cuts off its item.
_LIST_MARK = re.compile(r"\s*(?:\d{1,3}|[A-Za-z])[.)]\s*")
#: What marks an unsupported sentence where it stands (`with_markers`).
UNSUPPORTED_MARK = "[not in the passages]"
#: After a grounded answer's sentence that the passages back but that does not answer the question
#: (`slimrag.rag.verdict`): it is the passages' own words, so `UNSUPPORTED_MARK` would be false.
OFF_QUESTION_MARK = "[does not answer the question]"


@dataclass(frozen=True, slots=True)
class Attribution:
    """The check of one answer: each sentence's `Support`, and the labels used."""

    support: tuple[Support, ...]
    used: tuple[str, ...]

    @property
    def unsupported(self) -> list[Support]:
        """The sentences that claim something no passage backs."""
        return [s for s in self.support if not s.supported]


def _terms_in(text: str) -> set[str]:
    """Every word of ``text`` lower-cased, and numbers also by their numeric core ("128mb" → "128")."""
    out: set[str] = set()
    for w in words(text):
        low = w.lower().replace(",", "")
        out.add(low)
        if low.endswith("'s"):  # "Kubo's" holds the name Kubo
            out.add(low[:-2])
        core = re.match(r"[0-9][0-9.]*", low)
        if core:
            out.add(core.group(0).rstrip("."))
    return out


def _core(term: str) -> str:
    m = re.match(r"[0-9][0-9.]*", term)
    return m.group(0).rstrip(".") if m else term


def _found(term: str, words: set[str]) -> bool:
    """Whether ``term`` is among ``words`` (`_terms_in`): itself, its numeric core, or every part of
    a hyphenated name ("Lieutenant-Governor" where tokenized text writes "Lieutenant - Governor")."""
    return term in words or _core(term) in words or ("-" in term and all(p in words for p in term.split("-") if p))


def _claims(sentence: str) -> bool:
    """Whether ``sentence`` states something a passage could back: not conversation ("Sure!"), not
    a list item's number alone ("1.": the item is the next sentence), not a lead-in (module header)."""
    if _LIST_MARK.fullmatch(sentence):
        return False
    said, terms = content_words(sentence) - CHATTER_STEMS, key_terms(sentence)
    if sentence.rstrip().endswith(":") and not terms and not identifiers(sentence) and len(said) <= LEAD_IN_WORDS:
        return False  # "Here's a simple example:" introduces what follows and claims nothing itself
    return bool(said or terms)


@dataclass(frozen=True, slots=True)
class _Passages:
    """The passage sentences an answer is checked against, with what each rule reads of them."""

    hits: Sequence[Hit]
    cands: Candidates
    own: list[set[str]]  # content words of each sentence
    around: list[set[str]]  # of its neighbours
    before: list[set[str]]  # of the `CONTEXT_BACK` sentences before it in its passage
    terms: list[set[str]]  # every word of each sentence (`_terms_in`) and of its signature's names
    terms_before: list[set[str]]  # of the sentences before it
    names: list[set[str]]  # its numbers and names (`key_terms`)
    known: set[str]  # every word of the passages and the question
    signature: list[str]  # the signature it stands under (`signature_of`), "" when none
    signed: list[set[str]]  # content words of that signature's names (`signature_names`)
    _code: dict[int, str] = field(default_factory=dict)  # `code`'s, built on first use

    def code(self, j: int) -> str:
        """What the identifiers an answer sentence names are looked up in for sentence ``j``: its
        passage's source name, its text and its neighbours'. Built only when a sentence names code."""
        if j not in self._code:
            texts = self.cands.texts
            rank, at = self.cands.at[j][0], self.cands.pos[j]
            # the lines just around it too when too short to be candidates: a signature line
            # (".. function:: getrecursionlimit()") before the sentence that documents it
            around = [x.text for x in split_sentences(self.hits[rank].text)[max(0, at - 1) : at + 2]]
            self._code[j] = "\n".join([self.hits[rank].source, texts[j], *around,
                                       *(texts[k] for k in self.cands.neighbours(j))])
        return self._code[j]

    @classmethod
    def of(cls, question: str, hits: Sequence[Hit], cands: Candidates) -> _Passages:
        texts = cands.texts
        own = [content_words(t) for t in texts]
        signature = [signature_of(hits[r].text, x.start, hits[r].source) for r, x in cands.at]
        names = [" ".join(signature_names(sig)) for sig in signature]
        terms = [_terms_in(f"{n} {t}") for n, t in zip(names, texts, strict=True)]
        back = [_before(cands, j) for j in range(len(texts))]
        return cls(hits, cands, own, [set().union(*(own[k] for k in cands.neighbours(j))) for j in range(len(own))],
                   [set().union(*(own[k] for k in b)) for b in back], terms,
                   [set().union(*(terms[k] for k in b)) for b in back], [key_terms(t) for t in texts],
                   set().union(*terms) | _terms_in(question), signature, [content_words(n) for n in names])


def _before(cands: Candidates, j: int) -> list[int]:
    """The candidates up to `CONTEXT_BACK` sentences before candidate ``j`` in its passage."""
    rank, at = cands.at[j][0], cands.pos[j]
    return [k for k in range(max(0, j - CONTEXT_BACK), j) if cands.at[k][0] == rank and at - cands.pos[k] <= CONTEXT_BACK]


def attribute(question: str, answer: str, hits: Sequence[Hit], embedder: Embeds,
              threshold: float = SUPPORT, common: Common | None = None) -> Attribution:
    """Check ``answer`` against the passages of ``hits`` (module header). ``common``: the corpus's
    vocabulary (`slimrag.rag.vocabulary.Vocabulary.common`), whose words claim nothing."""
    blocks = [m.group(1) for m in FENCE.finditer(answer) if m.group(1).strip()]
    plain = _CITATION.sub("", FENCE.sub("\n\n", answer))
    sents = [s for s in split_sentences(plain) if _claims(s.text)]
    code = tuple(code_support(b, hits) for b in blocks)
    cands = Candidates.of(hits)
    if not sents:
        return Attribution(code, tuple(dict.fromkeys(lab for c in code for lab in c.labels)))
    if not cands.at:
        return Attribution(tuple(Support(s.text, (), (), False, tuple(sorted(key_terms(s.text))))
                                 for s in sents) + code, ())
    vecs = np.asarray(embedder.embed([s.text for s in sents] + cands.texts), dtype=np.float64)
    a_vecs, s_vecs = vecs[: len(sents)], vecs[len(sents):]
    cos = np.clip(a_vecs @ s_vecs.T, 0.0, 1.0)
    ps = _Passages.of(question, hits, cands)
    terms_of = [key_terms(s.text) for s in sents]  # each sentence's terms and words, once
    words_of = [content_words(s.text) for s in sents]
    said = set().union(*terms_of, *words_of)
    general = common(said) if common is not None else set()
    passages = code_text(hits)
    support: list[Support] = []
    asked, q_words = _terms_in(question), content_words(question)  # once per answer, not per sentence
    for i, s in enumerate(sents):
        idents = identifiers(s.text)
        one = _support(s, cos[i], ps, asked, q_words, threshold, general, terms_of[i], words_of[i], idents)
        missing = tuple(sorted(x for x in idents if not shown(x, passages)))
        if missing:  # code it names that no passage shows (item 3 of issue 29)
            one = replace(one, supported=False, unknown_terms=tuple(sorted({*one.unknown_terms, *missing})))
        support.append(one)
    support += code
    used = [h.label for h in hits if any(h.label in s.labels for s in support)]
    return Attribution(tuple(support), tuple(dict.fromkeys(used)))


def _held(words: set[str], own: set[str], around: set[str]) -> float:
    """Share of ``words`` in a sentence's ``own`` words, one found only in ``around`` counting half."""
    inside = words & own
    return (len(inside) + 0.5 * len((words - inside) & around)) / len(words) if words else 1.0


def _support(s: Sentence, cos: np.ndarray, ps: _Passages, asked: set[str], q_words: set[str], threshold: float,
             general: set[str], s_terms: set[str], words_a: set[str], idents: set[str]) -> Support:
    """``asked``, ``q_words``: the question's terms (`_terms_in`) and content words; ``s_terms``,
    ``words_a``, ``idents``: the sentence's `key_terms`, `content_words` and `identifiers`."""
    terms = s_terms - general
    unknown = tuple(sorted(t for t in terms if not _found(t, ps.known)))
    backing: list[tuple[float, int]] = []
    subject = {t for t in terms if t in asked}
    topic = words_a & q_words
    new = {w for w in words_a - q_words - CHATTER_STEMS - general - _roles(s.text) if "." not in w}  # code: `identifiers`
    code_all = set().union(*(content_words(i) for i in idents))  # every identifier is shown where it backs
    allowed = terms | asked | general  # what a passage sentence may name to leave its subject to the one before
    allowed_cores = {_core(x) for x in allowed}
    for j in range(len(ps.cands.at)):
        here, text = ps.terms[j], ps.cands.at[j][1].text
        if not all(_found(t, here) or t in subject for t in terms):
            continue
        alone = _names_nothing_else(ps.names[j], allowed, allowed_cores)
        missing = {t for t in subject if not _found(t, here)}
        if missing and not (_refers_back(text, terms - subject) or (
                alone and all(t.isalpha() and t not in NUMBER_WORDS and _found(t, ps.terms_before[j]) for t in missing))):
            continue  # the value is not stated with the answer's subject here: maybe another's
        if len(topic) >= 2:
            near = ps.own[j] | (ps.around[j] if _PRONOUN.match(text) else set()) | (ps.before[j] if alone else set())
            if 2 * len(topic & near) < len(topic):
                continue  # the sentence is about something else the passage names (Kubo's father, not its monkey)
        if not all(shown(x, ps.code(j)) for x in idents):
            continue  # the code it names is not what this sentence (or the next) documents
        if new and _held(new, ps.own[j] | code_all | ps.signed[j], ps.around[j]) < NEW_SHARE:
            continue  # what the answer adds to the question is not what this sentence says (its code, shown, aside)
        score = (float(cos[j]) + _held(words_a, ps.own[j], ps.around[j])) / 2
        if score >= threshold:
            backing.append((score, j))
    backing.sort(key=lambda x: (-x[0], x[1]))
    evidence = []
    for score, j in backing[:3]:
        rank, sent = ps.cands.at[j]
        h = ps.hits[rank]
        evidence.append(Evidence(sent.text, h.label, h.chunk_id, sent.start, sent.end, round(score, 4),
                                 ps.signature[j]))
    labels = tuple(dict.fromkeys(e.label for e in evidence))
    return Support(s.text, labels, tuple(evidence), bool(backing) and not unknown, unknown)


#: A Sphinx role before a code span (":func:`getrecursionlimit`", ":const:`NOTSET`"): markup, not a word.
_ROLE = re.compile(r":(\w+):(?=`)")


def _roles(text: str) -> set[str]:
    """The Sphinx roles of ``text`` (`_ROLE`) as content words: markup, no claim."""
    return content_words(" ".join(_ROLE.findall(text))) if ":`" in text else set()


def _names_nothing_else(names: set[str], allowed: set[str], cores: set[str]) -> bool:
    """Whether a passage sentence's ``names`` (`key_terms`) are all ``allowed`` (the answer's, the
    question's, the corpus's; ``cores``: their `_core`), numbers and number words aside: then its
    subject may be named just before it."""
    return all(t in allowed or _core(t) in cores or t in NUMBER_WORDS or any(c.isdigit() for c in t) for t in names)


_PRONOUN = re.compile(r"(it|its|they|their|this|these|he|she|his|her)\b", re.I)


def _refers_back(sentence: str, values: set[str]) -> bool:
    """Whether a passage ``sentence`` that lacks the answer's subject may still back it: it opens
    with a pronoun (its subject is the sentence before) and names nothing but the answer's
    ``values`` ("It holds 17 gears.")."""
    cores = {_core(x) for x in values} | set().union(*(_terms_in(x) for x in values))
    return bool(_PRONOUN.match(sentence)) and all(_found(t, cores) for t in key_terms(sentence))


def with_markers(answer: str, attribution: Attribution) -> str:
    """``answer`` with ``[label]`` after each supported sentence that carries no citation of its own
    (the best supporting passage's label), and `UNSUPPORTED_MARK` after each unsupported one."""
    out = answer
    for s in attribution.support:
        at = out.find(s.sentence)
        if at < 0:
            continue
        end = at + len(s.sentence)
        if not s.supported:
            if UNSUPPORTED_MARK not in out[end - 1 : end + len(UNSUPPORTED_MARK) + 2]:
                if out[end - 1] in ".!?" and "\n" not in s.sentence:  # "... so [not in the passages]."
                    end -= 1
                out = f"{out[:end]} {UNSUPPORTED_MARK}{out[end:]}"
            continue
        if not s.labels:
            continue
        if _CITATION.match(out[end:]) or _CITATION.search(s.sentence):
            continue
        if out[end - 1] in ".!?":  # "... 128MB [label]." as answers cite
            end -= 1
        out = f"{out[:end]} [{s.labels[0]}]{out[end:]}"
    return out
