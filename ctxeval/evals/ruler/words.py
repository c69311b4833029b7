"""RULER's word-counting tasks: scripts/data/synthetic/common_words_extraction.py (cwe: a numbered word list, the
10 most common words asked) and freq_words_extraction.py (fwe: coded words with Zipf counts, the 3 most frequent
asked)."""

from __future__ import annotations

import math
import random
import string

import numpy as np

from ...errors import CtxevalError
from .sources import Sources, Stream
from .tasks import FAMILIES, RulerTask, task_template


class CommonWords:
    """scripts/data/synthetic/common_words_extraction.py."""

    def __init__(
        self, task: RulerTask, sources: Sources, stream: Stream, length: int, model_template: str = "base"
    ) -> None:
        a = task.args
        self.freq_cw, self.freq_ucw, self.num_cw, self.num_fewshot = a["freq_cw"], a["freq_ucw"], a["num_cw"], 1
        self.stream, self.length = stream, length
        words = sorted(
            set(sources.wonderwords("noun") + sources.wonderwords("adjective") + sources.wonderwords("verb"))
        )
        random.Random(stream.seed).shuffle(words)
        self.words, self.sources = words, sources
        self.template = task_template(task, model_template)

    def _example(self, num_words: int, common_repeats: int, uncommon_repeats: int, common_nums: int):
        r = self.stream.random
        if num_words <= len(self.words):
            full = r.sample(self.words, num_words)
        else:
            if not self.sources.extra_words or num_words > len(self.sources.extra_words):
                have = (
                    self.sources.extra_words_source
                    if self.sources.extra_words
                    else (f"wonderwords' {len(self.words):,}")
                )
                raise CtxevalError(
                    f"cwe at this length needs {num_words:,} distinct words, more than {have}; give a "
                    "longer list with --cwe-words (RULER's english_words.json, or Debian wamerican)"
                )
            full = r.sample(self.sources.extra_words, num_words)
        common, uncommon = full[:common_nums], full[common_nums:]
        listed = common * int(common_repeats) + uncommon * int(uncommon_repeats)
        random.Random(self.stream.seed).shuffle(listed)
        return " ".join(f"{i + 1}. {word}" for i, word in enumerate(listed)), common

    def __call__(self, num_words: int) -> tuple[str, list[str]]:
        shots = []
        if self.length < 4096:
            examples = [self._example(20, 3, 1, self.num_cw) for _ in range(self.num_fewshot)]
            context, answer = self._example(num_words, 6, 1, self.num_cw)
        else:
            examples = [self._example(40, 10, 3, self.num_cw) for _ in range(self.num_fewshot)]
            context, answer = self._example(num_words, self.freq_cw, self.freq_ucw, self.num_cw)
        for example_context, example_answer in examples:
            shots.append(
                self.template.format(num_cw=self.num_cw, context=example_context, query="")
                + " "
                + " ".join(f"{i + 1}. {word}" for i, word in enumerate(example_answer))
            )
        text = self.template.format(num_cw=self.num_cw, context=context, query="")
        return "\n".join(shots) + "\n" + text, answer

    def increment(self, length: int) -> int:
        return 10


class FreqWords:
    """scripts/data/synthetic/freq_words_extraction.py: coded words with Zipf counts (alpha), '...' as noise."""

    coded_wordlen = 6

    def __init__(
        self, task: RulerTask, sources: Sources, stream: Stream, length: int, model_template: str = "base"
    ) -> None:
        self.alpha, self.stream = task.args["alpha"], stream
        self.template = task_template(task, model_template)
        self.budget = length - FAMILIES[task.family].tokens_to_generate
        self.vocab_size = self.budget // 50

    def vocab(self) -> list[str]:
        """A fresh coded vocabulary (draws from the stream), shuffled by the seed; its first word becomes '...'."""
        r = self.stream.random
        vocab = ["".join(r.choices(string.ascii_lowercase, k=self.coded_wordlen)) for _ in range(self.vocab_size)]
        while len(set(vocab)) < self.vocab_size:
            if len(vocab) > 100 * self.vocab_size + 1000:  # a bound for a broken draw: never reached
                raise RuntimeError(f"fwe: {len(vocab)} draws gave fewer than {self.vocab_size} distinct words")
            vocab.append("".join(r.choices(string.ascii_lowercase, k=self.coded_wordlen)))
        vocab = sorted(set(vocab))
        random.Random(self.stream.seed).shuffle(vocab)
        vocab[0] = "..."  # the most frequent word is noise
        return vocab

    def counts(self, num_words: int, size: int | None = None) -> list[int]:
        """How often the k-th word of the vocabulary occurs: int(num_words x k^-alpha / zeta(alpha))."""
        ranks = np.arange(1, (self.vocab_size if size is None else size) + 1)
        return [int(n) for n in (num_words * (ranks**-self.alpha) / _zeta(self.alpha)).astype(int)]

    def text(self, vocab: list[str], num_words: int) -> tuple[str, list[str]]:
        """The prompt with num_words x k^-alpha / zeta(alpha) copies of the k-th word (no draws from the stream)."""
        coded = [w for w, n in zip(vocab, self.counts(num_words, len(vocab))) for _ in range(n)]
        random.Random(self.stream.seed).shuffle(coded)
        return self.template.format(context=" ".join(coded), query=""), vocab[1:4]


def _zeta(alpha: float) -> float:
    """Riemann zeta(alpha) for alpha > 1 (scipy.special.zeta in RULER), to double precision; zeta(2) = pi^2/6
    exactly as scipy returns it."""
    if alpha == 2.0:
        return math.pi**2 / 6
    n = np.arange(1, 100_000, dtype=np.float64)
    tail = 100_000.0 ** (1 - alpha) / (alpha - 1)  # Euler-Maclaurin: integral of the rest, half a term back
    return float(np.sum(n**-alpha) + tail - 0.5 * 100_000.0**-alpha)
