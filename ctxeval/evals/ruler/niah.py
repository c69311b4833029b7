"""RULER's scripts/data/synthetic/niah.py: needles (word, number or uuid keys and values) in a noise, essay or
needle haystack, and the answer's token position it records."""

from __future__ import annotations

import random
import uuid
from typing import Any, Callable

import numpy as np

from ...errors import CtxevalError
from .sources import Sources, Stream, sentences
from .tasks import NOISE, RulerTask, task_template

NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
DEPTHS = [int(d) for d in np.round(np.linspace(0, 100, num=40, endpoint=True)).astype(int)]  # niah/vt essay depths


def answer_token_position(prompt: str, answers: list[str], count: Callable[[str], int]) -> int:
    """niah.py's token_position_answer: the tokens (counted as for the length) of `prompt` (the input: model template
    included, answer prefix split off) before the first occurrence of the first answer."""
    at = prompt.find(answers[0])
    return count(prompt[:at])  # as niah.py slices: -1 (never, the needle is in the text) would drop the last char


class Niah:
    """scripts/data/synthetic/niah.py."""

    def __init__(self, task: RulerTask, sources: Sources, stream: Stream, model_template: str = "base") -> None:
        a = task.args
        self.a, self.stream = a, stream
        self.num_k = max(a["num_needle_k"], a["num_needle_q"])
        if a["type_haystack"] == "essay":
            if not sources.essay_words:
                raise CtxevalError(f"{task.name} needs an essay haystack (--essays PATH or a substitute corpus)")
            self.haystack: Any = sources.essay_words
        else:
            self.haystack = NOISE if a["type_haystack"] == "noise" else NEEDLE
        self.words = sources.key_words() if "words" in (a["type_needle_k"], a["type_needle_v"]) else []
        self.template = task_template(task, model_template)

    def _random(self, kind: str) -> str:
        r = self.stream.random
        if kind == "numbers":
            return str(r.randint(10**6, 10**7 - 1))
        if kind == "words":
            return r.choice(self.words)
        return str(uuid.UUID(int=r.getrandbits(128), version=4))

    def __call__(self, num_haystack: int) -> tuple[str, list[str]]:
        a, r = self.a, self.stream.random
        keys, values, needles = [], [], []
        for _ in range(self.num_k):
            keys.append(self._random(a["type_needle_k"]))
            value = []
            for _ in range(a["num_needle_v"]):
                value.append(self._random(a["type_needle_v"]))
                needles.append(NEEDLE.format(type_needle_v=a["type_needle_v"], key=keys[-1], value=value[-1]))
            values.append(value)
        random.Random(self.stream.seed).shuffle(needles)  # RULER shuffles with a fresh generator of the seed
        if a["type_haystack"] == "essay":
            words = self.haystack
            if num_haystack <= len(words):
                text = " ".join(words[:num_haystack])
            else:
                repeats = (num_haystack + len(words) - 1) // len(words)
                text = " ".join((words * repeats)[:num_haystack])
            sents = sentences(text.strip())
            cuts = (
                [0] + sorted(int(len(sents) * (depth / 100)) for depth in r.sample(DEPTHS, len(needles))) + [len(sents)]
            )
            parts = []
            for i in range(1, len(cuts)):
                parts.append(" ".join(sents[cuts[i - 1] : cuts[i]]))
                if i - 1 < len(needles):
                    parts.append(needles[i - 1])
            context = " ".join(parts)
        else:
            if a["type_haystack"] == "noise":
                lines = [NOISE] * num_haystack
            else:
                lines = [
                    NEEDLE.format(
                        type_needle_v=a["type_needle_v"],
                        key=self._random(a["type_needle_k"]),
                        value=self._random(a["type_needle_v"]),
                    )
                    for _ in range(num_haystack)
                ]
            for index, needle in zip(sorted(r.sample(range(num_haystack), len(needles)), reverse=True), needles):
                lines.insert(index, needle)
            context = "\n".join(lines)
        chosen = r.sample(range(self.num_k), a["num_needle_q"])
        queries = [keys[i] for i in chosen]
        answers = [v for i in chosen for v in values[i]]
        query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
        template, type_v = self.template, a["type_needle_v"]
        if a["num_needle_q"] * a["num_needle_v"] == 1:  # one value asked: singular wording
            template = (
                template.replace("Some", "A").replace("are all", "is").replace("are", "is").replace("answers", "answer")
            )
            type_v = type_v[:-1]
        return template.format(type_needle_v=type_v, context=context, query=query), answers

    def increment(self, length: int) -> int:
        if self.a["type_haystack"] == "essay":
            return 500
        return 5 if length < 4096 else 25
