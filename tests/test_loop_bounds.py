"""Issue 27: loops that a bug (or a mutant) could turn infinite end with an error instead of hanging. Each test
forces the loop's way out shut (a draw that repeats itself, a count that never grows) and expects the bound's
RuntimeError within a second; the correct loops never reach the bounds (the RULER and passkey tests pass)."""

from __future__ import annotations

import pytest

from ctxeval.evals import passkey as P
from ctxeval.evals.ruler.sources import Sources, Stream
from ctxeval.evals.ruler.tasks import TASKS
from ctxeval.evals.ruler.vt import VariableTracking
from ctxeval.evals.ruler.words import FreqWords


class Repeating:
    """A random.Random stand-in whose choices always repeat the population's first item."""

    def choices(self, population, k=1):
        return [population[0]] * k


def test_vt_names_that_never_become_distinct_stop_the_draw():
    vt = VariableTracking(TASKS["vt"], Sources(), Stream(42))
    vt.stream.random = Repeating()
    with pytest.raises(RuntimeError, match="distinct names"):
        vt.generate(10)


def test_fwe_words_that_never_become_distinct_stop_the_draw():
    fwe = FreqWords(TASKS["fwe"], Sources(), Stream(42), 4096)
    fwe.stream.random = Repeating()
    with pytest.raises(RuntimeError, match="distinct words"):
        fwe.vocab()


def test_a_passkey_filler_that_stops_growing_stops_the_length_search(monkeypatch):
    from transformers import AutoTokenizer

    from ctxeval.tiny import MODEL_DIR

    builder = P.YarnPasskeyBuilder(AutoTokenizer.from_pretrained(MODEL_DIR))
    monkeypatch.setattr(builder, "search_tokens", lambda chars: 10)  # never reaches the target
    with pytest.raises(RuntimeError, match="stay under 1,000 tokens"):
        builder.garbage_chars(1000)


def test_an_fwe_prompt_that_stops_growing_is_refused_after_a_bounded_number_of_tries():
    """The growth loop ends at its ceiling on the word count (and, were the count stuck, at its iteration bound):
    the one-line refusal, never a hang."""
    from ctxeval.errors import CtxevalError
    from ctxeval.evals.ruler.generate import _fwe_samples

    fwe = FreqWords(TASKS["fwe"], Sources(), Stream(42), 4096)
    calls = []

    def text(vocab, num_words):
        calls.append(num_words)
        return "a b c", ["a", "b", "c"]  # never longer, whatever the word count

    fwe.text = text
    with pytest.raises(CtxevalError, match="the prompt stops growing at 3 tokens, short of the 4096-token length"):
        _fwe_samples(TASKS["fwe"], 4096, 1, lambda s: len(s.split()), fwe)
    assert len(calls) <= 4 * fwe.budget // max(fwe.budget // 32, 1) + 3
