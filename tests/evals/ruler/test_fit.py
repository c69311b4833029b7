"""ruler.fit: the shortest length a task's prompts fit equals a brute-force scan of generate over every length, and
check_lengths names it."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from ctxeval.errors import CtxevalError
from ctxeval.evals.ruler.fit import Prompts, check_lengths
from ctxeval.evals.ruler.generate import generate
from ctxeval.evals.ruler.sources import Sources
from ctxeval.util.paths import TINY_MODEL_DIR


@pytest.fixture(scope="module")
def prompts():
    return Prompts(AutoTokenizer.from_pretrained(TINY_MODEL_DIR), Sources(), 2, 42, "base")


def brute_shortest(prompts, task, start):
    """The first length from `start` up at which generate makes the samples (start must not fit)."""
    for length in range(start, start + 400):
        try:
            generate(task, length, prompts.samples, prompts.tokenizer, prompts.sources, prompts.seed)
            return length
        except CtxevalError as error:
            assert "smallest prompt" in str(error)
    raise AssertionError("no length fits")


@pytest.mark.parametrize("task", ["fwe", "vt"])
def test_the_shortest_fitting_length_equals_a_brute_force_scan(prompts, task):
    estimate = prompts.estimate(task, 1024)
    found = prompts.shortest(task)
    assert found == brute_shortest(prompts, task, int(estimate * 0.8))
    assert not prompts.fits(task, found - 1) and prompts.fits(task, found)


def test_check_lengths_names_every_short_task_and_the_length_that_fits_them_all(prompts):
    need = {task: prompts.shortest(task) for task in ("fwe", "vt")}
    with pytest.raises(CtxevalError) as refused:
        check_lengths(("fwe", "vt"), [need["fwe"] - 1, 4096], prompts)
    message = str(refused.value)
    assert f"fwe ({need['fwe']:,}), vt ({need['vt']:,})" in message
    assert f"fits all 2 asked tasks is {max(need.values()):,}" in message
    check_lengths(("fwe", "vt"), [max(need.values()), 4096], prompts)  # fits: no error
