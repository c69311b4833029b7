"""evals/ruler/vt.py: variable tracking's draws end instead of hanging."""

from __future__ import annotations

import pytest

from ctxeval.evals.ruler.sources import Sources, Stream
from ctxeval.evals.ruler.tasks import TASKS
from ctxeval.evals.ruler.vt import VariableTracking


class Repeating:
    """A random.Random stand-in whose choices always repeat the population's first item."""

    def choices(self, population, k=1):
        return [population[0]] * k


def test_vt_names_that_never_become_distinct_stop_the_draw():
    vt = VariableTracking(TASKS["vt"], Sources(), Stream(42))
    vt.stream.random = Repeating()
    with pytest.raises(RuntimeError, match="distinct names"):
        vt.generate(10)
