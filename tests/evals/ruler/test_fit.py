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


def generates(prompts: Prompts, task: str, length: int) -> bool:
    """Whether generate makes the run's samples of `task` at `length` (False: refused as too short)."""
    try:
        prompts.generate(task, length)
    except CtxevalError as error:
        assert "smallest prompt" in str(error)
        return False
    return True


@pytest.mark.parametrize(
    "task,step",
    [("niah_single_1", 1), ("cwe", 10), ("helmet:json_kv", 1), ("infbench:math_find", 1)],  # cwe: 1.6 s a length
)
def test_a_length_the_check_lets_through_is_never_refused_by_the_generator(
    prompts: Prompts, task: str, step: int
) -> None:
    """Tasks whose estimate is below what their prompts really need (niah_single_1 395 against 404 tokens, cwe 983
    against 1,052, helmet:json_kv 553 against 563, infbench:math_find 83 against 90 with the tiny tokenizer): at
    lengths from the estimate to just past the need (every one, or every `step`-th with the need's neighbours),
    `fits` says what generate then does and check_lengths refuses exactly the lengths generate refuses. (A sample's
    draws depend on its length, so a length between the estimate and the need may fit: helmet:json_kv at 558.) Bug
    caught: the length fit without its safety margin (SURE_MARGIN 1.25 -> 1.0): every length from the estimate up
    passes the check, and the generator refuses it after the run has started."""
    estimate = prompts.estimate(task, 1024)
    need = prompts.shortest(task)
    assert estimate < need  # the estimate is low for this task: the margin is what keeps the check right
    lengths = sorted({*range(estimate, need + 3, step), need - 1, need, need + 1})
    refused = 0
    for length in lengths:
        fits = generates(prompts, task, length)
        assert prompts.fits(task, length) == fits, length
        refused += not fits
        if fits:
            check_lengths((task,), [length], prompts)
        else:
            with pytest.raises(CtxevalError, match="is shorter than the smallest prompt of"):
                check_lengths((task,), [length], prompts)
    assert refused and not generates(prompts, task, need - 1) and generates(prompts, task, need)
