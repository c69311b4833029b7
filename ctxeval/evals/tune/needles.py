"""tune's retrieval objective: the loss on the answers of pass keys hidden in the tuning documents.

LongRoPE2 argues that perplexity over a whole document mostly scores tokens that need only nearby context, so a
rescaling can win on it while it loses what a long context is for; it evaluates the perplexity of answer tokens
that need far context instead ("needle-driven" perplexity). This is ctxeval's form of that idea, not LongRoPE2's
data: each tuning document, cut to the target length, carries `count` pass-key lines at evenly spaced depths
((i + 1/2) / count of the document part), and ends with one question line per key whose answer is the key:

    ... The pass key number 3 is 48203. Remember it. 48203 is the pass key number 3. ...
    What is the pass key number 3? The pass key number 3 is 48203.

The answer perplexity is exp(mean NLL of the answer's key tokens in the question lines); the document perplexity of
the same forward is the NLL of the document's own tokens (the inserted lines left out), so `both` costs one forward
per document. The keys are 5-digit numbers drawn from --seed and the document's order: the same for every trial.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...data.corpora import TokenDoc
from ...errors import CtxevalError

OBJECTIVES = ("ppl", "needle", "both")
NEEDLES_PER_DOC = 5
NEEDLE_LINE = " The pass key number {n} is {key}. Remember it. {key} is the pass key number {n}. "
QUESTION = "\nWhat is the pass key number {n}? The pass key number {n} is"
ANSWER = " {key}."


@dataclass(frozen=True)
class NeedleDoc:
    """One tuning document with its pass keys: the ids the forward reads, and which next-token targets count."""

    doc_id: str
    ids: list[int]  # (length,) BOS (when the model has one) + document with needle lines + questions and answers
    doc_targets: np.ndarray  # (n,) indices t into the NLL (target ids[t+1]) of the document's own tokens
    answer_targets: np.ndarray  # (m,) indices t of the answers' key tokens
    keys: tuple[int, ...]


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def build_needle_doc(
    doc: TokenDoc, tokenizer: Any, length: int, bos: int | None, rng: np.random.Generator, count: int = NEEDLES_PER_DOC
) -> NeedleDoc:
    """`doc` cut so that, with BOS, its `count` needle lines and the question/answer lines, it is `length` tokens."""
    keys = tuple(int(k) for k in rng.integers(10_000, 100_000, size=count))
    needles = [encode(tokenizer, NEEDLE_LINE.format(n=i + 1, key=k)) for i, k in enumerate(keys)]
    tail: list[int] = []
    answer_spans = []
    for i, k in enumerate(keys):
        tail += encode(tokenizer, QUESTION.format(n=i + 1))
        answer = encode(tokenizer, ANSWER.format(key=k))
        digits = encode(tokenizer, f" {k}")  # the key's own tokens: the leading tokens of the answer
        if answer[: len(digits)] != digits:
            digits = answer[:-1]  # a tokenizer that merges the key with the full stop: all but the last token
        answer_spans.append((len(tail), len(digits)))
        tail += answer
    fixed = (bos is not None) + sum(len(n) for n in needles) + len(tail)
    n_doc = length - fixed
    if n_doc < count or len(doc.ids) < n_doc:
        raise CtxevalError(
            f"--objective needle: {doc.doc_id} cannot fill {length:,} tokens with {count} pass keys "
            f"({fixed:,} tokens of needles and questions, {len(doc.ids):,} of text); give a longer --target-length "
            "or longer documents"
        )
    text = [int(t) for t in doc.ids[:n_doc]]
    cuts = [int(n_doc * (i + 0.5) / count) for i in range(count)]
    ids: list[int] = [bos] if bos is not None else []
    own: list[int] = []  # positions in `ids` of the document's tokens
    start = 0
    for cut, needle in zip(cuts + [n_doc], needles + [[]]):
        own += range(len(ids), len(ids) + cut - start)
        ids += text[start:cut] + needle
        start = cut
    offset = len(ids)
    ids += tail
    answers = [offset + a + j for a, n in answer_spans for j in range(n)]
    assert len(ids) == length, (len(ids), length)
    # the NLL at index t scores ids[t + 1]: a position p is scored at t = p - 1 (the first position never)
    doc_targets = np.asarray([p - 1 for p in own if p > 0], dtype=np.int64)
    return NeedleDoc(doc.doc_id, ids, doc_targets, np.asarray([p - 1 for p in answers], dtype=np.int64), keys)


def needle_docs(docs: list[TokenDoc], tokenizer: Any, length: int, bos: int | None, seed: int) -> list[NeedleDoc]:
    """One NeedleDoc per tuning document, keys drawn from `seed` and the document's place."""
    return [build_needle_doc(d, tokenizer, length, bos, np.random.default_rng([seed, i])) for i, d in enumerate(docs)]


@dataclass(frozen=True)
class NeedleNll:
    """Summed NLL and token counts of one or more needle documents at one length."""

    doc_nll: float
    doc_tokens: int
    answer_nll: float
    answer_tokens: int

    def __add__(self, other: NeedleNll) -> NeedleNll:
        return NeedleNll(
            self.doc_nll + other.doc_nll,
            self.doc_tokens + other.doc_tokens,
            self.answer_nll + other.answer_nll,
            self.answer_tokens + other.answer_tokens,
        )

    @property
    def ppl(self) -> float:
        return math.exp(self.doc_nll / self.doc_tokens)

    @property
    def answer_ppl(self) -> float:
        return math.exp(self.answer_nll / self.answer_tokens) if self.answer_tokens else math.nan


def split_nll(doc: NeedleDoc, nll: np.ndarray, length: int | None = None) -> NeedleNll:
    """The document's and the answers' summed NLL from a forward's per-token NLL (nll: (n-1,)), up to `length` tokens
    (the first `length` positions: the trained length's perplexity read from the same causal forward)."""
    limit = (len(doc.ids) if length is None else length) - 1
    own = doc.doc_targets[doc.doc_targets < limit]
    answers = doc.answer_targets[doc.answer_targets < limit]
    return NeedleNll(float(nll[own].sum()), len(own), float(nll[answers].sum()), len(answers))


def objective_value(objective: str, ppl: float, answer_ppl: float) -> float:
    """What the search minimises, in perplexity units: the document ppl, the answer ppl, or their geometric mean."""
    if objective == "ppl":
        return ppl
    if objective == "needle":
        return answer_ppl
    return math.sqrt(ppl * answer_ppl)


def objective_name(objective: str | None) -> str:
    """How tables name the objective's value."""
    return {"needle": "answer ppl", "both": "√(ppl·answer ppl)"}.get(objective or "ppl", "ppl")
