"""evals/ruler/words.py: the word lists of fwe and cwe."""

from __future__ import annotations

import pytest

from ctxeval.errors import CtxevalError
from ctxeval.evals.ruler.sources import Sources, Stream
from ctxeval.evals.ruler.tasks import TASKS
from ctxeval.evals.ruler.words import FreqWords


def test_cwe_takes_words_past_wonderwords_from_the_extra_list_while_it_is_long_enough():
    from ctxeval.evals.ruler.sources import Sources, Stream
    from ctxeval.evals.ruler.tasks import TASKS
    from ctxeval.evals.ruler.words import CommonWords

    sources = Sources()
    cwe = CommonWords(TASKS["cwe"], sources, Stream(42), 4096)
    assert len(cwe._example(len(cwe.words), 1, 1, 2)[1]) == 2  # every wonderword, no extra list needed
    n = len(cwe.words) + 1
    sources.extra_words, sources.extra_words_source = [f"w{i}" for i in range(n)], "words.txt (its words)"
    text, common = cwe._example(n, 1, 1, 2)
    assert len(common) == 2 and set(common) <= set(sources.extra_words) and text.startswith("1. ")
    assert text.split()[-2] == f"{n}."  # every word of the list, numbered from 1
    sources.extra_words = sources.extra_words[:-1]
    with pytest.raises(CtxevalError) as err:
        cwe._example(n, 1, 1, 2)
    assert str(err.value) == (
        f"cwe at this length needs {n:,} distinct words, more than words.txt (its words); give "
        "a longer list with --cwe-words (RULER's english_words.json, or Debian wamerican)"
    )
    sources.extra_words = []
    with pytest.raises(CtxevalError, match=f"more than wonderwords' {len(cwe.words):,}; give a longer list"):
        cwe._example(n, 1, 1, 2)


class Repeating:
    """A random.Random stand-in whose choices always repeat the population's first item."""

    def choices(self, population, k=1):
        return [population[0]] * k


def test_fwe_words_that_never_become_distinct_stop_the_draw():
    fwe = FreqWords(TASKS["fwe"], Sources(), Stream(42), 4096)
    fwe.stream.random = Repeating()
    with pytest.raises(RuntimeError, match="distinct words"):
        fwe.vocab()
