"""Which lengths RULER's tasks can fill, decided before a run directory exists: a length shorter than a task's
smallest prompt is refused with the shortest length that fits every asked task, and default lengths are raised to
one that fits. `generate` itself decides (the same call, seed and sample count the run makes); `smallest_prompt`'s
estimate only spares that call where a length is far from the limit."""

from __future__ import annotations

import math
from typing import Any

from ...errors import CtxevalError
from ..retrieval.suite import DEFAULT_DEPTHS
from .generate import generate, smallest_prompt
from .sources import Sources

TOO_SHORT = "shorter than the task's smallest prompt"
SURE_MARGIN = 1.25  # a length this far above the estimate fits whatever the draw (draws differ by a few tokens)


class Prompts:
    """The prompt settings of a run: its tokenizer, sources, sample count, seed and model template."""

    def __init__(
        self,
        tokenizer: Any,
        sources: Sources,
        samples: int,
        seed: int,
        template: str,
        depths: tuple[float, ...] = DEFAULT_DEPTHS,
        kv_pairs: int | None = None,
    ) -> None:
        self.tokenizer, self.sources, self.samples, self.seed, self.template = (
            tokenizer,
            sources,
            samples,
            seed,
            template,
        )
        self.depths, self.kv_pairs = depths, kv_pairs  # the retrieval tasks'

    def generate(self, task: str, length: int) -> None:
        generate(
            task,
            length,
            self.samples,
            self.tokenizer,
            self.sources,
            self.seed,
            self.template,
            depths=self.depths,
            kv_pairs=self.kv_pairs,
        )

    def estimate(self, task: str, length: int) -> int:
        return smallest_prompt(task, length, self.tokenizer, self.sources, self.seed, self.template)

    def fits(self, task: str, length: int) -> bool:
        """True when `generate` makes the run's samples of `task` at `length`; False when it refuses the length as
        shorter than the smallest prompt (any other refusal is raised)."""
        if length >= SURE_MARGIN * self.estimate(task, length):
            return True
        try:
            self.generate(task, length)
        except CtxevalError as error:
            if TOO_SHORT in str(error):
                return False
            raise
        return True

    def shortest(self, task: str, below: int = 4096) -> int:
        """The shortest length at which `generate` makes the run's samples of `task` (under `below`, where RULER's
        increments are the short ones; a binary search between the estimate's bounds)."""
        estimate = self.estimate(task, min(below - 1, 1024))
        low, high = max(1, int(estimate * 0.8)), math.ceil(estimate * SURE_MARGIN)
        while low > 1 and self.fits(task, low):
            low, high = low // 2, low
        while high - low > 1:  # low does not fit, high does
            middle = (low + high) // 2
            low, high = (low, middle) if self.fits(task, middle) else (middle, high)
        return high


def check_lengths(tasks: list[str] | tuple[str, ...], lengths: list[int], prompts: Prompts) -> None:
    """Refuse, in one line, lengths shorter than an asked task's smallest prompt, naming the tasks and the shortest
    length that fits them all."""
    shortest_asked = min(lengths)
    short = [task for task in tasks if not prompts.fits(task, shortest_asked)]
    if not short:
        return
    need = {task: prompts.shortest(task) for task in tasks}
    fits_all = max(need.values())
    named = ", ".join(f"{task} ({need[task]:,})" for task in short)
    raise CtxevalError(
        f"--lengths {shortest_asked:,} is shorter than the smallest prompt of {named} tokens with this tokenizer; "
        f"the shortest length that fits all {len(tasks)} asked tasks is {fits_all:,}: use --lengths of at "
        f"least {fits_all:,} (RULER's usual grid: 4k,8k,16k,32k,64k,128k)"
    )


def fitting_length(tasks: list[str] | tuple[str, ...], prompts: Prompts) -> int:
    """The smallest power of two (at least 1k) at which every task's prompts fit."""
    length = 1024
    while not all(prompts.fits(task, length) for task in tasks):
        length *= 2
        if length > 2**20:
            raise CtxevalError("RULER's prompts fit no length up to 1M tokens with this tokenizer")
    return length
