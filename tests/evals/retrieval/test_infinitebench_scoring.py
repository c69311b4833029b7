"""evals/retrieval/infinitebench_scoring.py against transcriptions of OpenBMB/InfiniteBench (88b3daa)
src/compute_scores.py."""

from __future__ import annotations

import random
import re

import pytest

from ctxeval.errors import CtxevalError
from ctxeval.evals.retrieval.infinitebench_scoring import (
    first_int_match,
    infinitebench_accuracy,
    score_kv_retrieval,
    score_math_find,
    score_number_string,
    score_passkey,
    score_row,
)


def original_first_int_match(prediction):
    pred_list = re.split("[^0-9]", prediction)
    pred_value = ""
    for item in pred_list:
        if item != "":
            pred_value = item
            break
    return pred_value


def original_kv(pred, label, model_name=""):
    for c in ["\n", ":", '"', "'", ".", ",", "?", "!", "{", "}"]:
        pred = pred.replace(c, " ")
    words = pred.split()
    return label in words


def original_passkey(pred, label, model_name=""):
    if isinstance(label, list):
        label = label[0]
    return label == original_first_int_match(pred)


def original_math_find(pred, label, model_name=""):
    if isinstance(label, list):
        label = label[0]
    if isinstance(label, int):
        first_num = re.search(r"\d+\.\d+|\d+", pred)
        if first_num is None:
            return False
        return int(first_num.group(0).strip()) == label
    elif isinstance(label, float):
        first_float = re.search(r"\d+\.\d+|\d+", pred)
        if first_float is None:
            return False
        return float(first_float.group(0).strip()) == label
    raise TypeError


def original_get_score(scores):
    return sum(scores) / len(scores)


UUID = "5e6b7b90-8c3a-4a0d-9d7f-2b1c0e7a9f11"
KV_PREDICTIONS = [
    UUID,
    f'"{UUID}"',
    f"{UUID}.",
    f"The value is: {UUID}\nKey:",
    UUID.upper(),
    f"{UUID}-x",
    f"({UUID})",
    f"{{{UUID}}}",
    "",
    f"value:{UUID}",
    f"a{UUID}",
    f"{UUID}; next",
]


@pytest.mark.parametrize("prediction", KV_PREDICTIONS)
def test_kv_scorer_is_the_original_on_a_string_label(prediction):
    """Catches: case folding, a substring test instead of word equality, or a missing separator such as '}'."""
    assert score_kv_retrieval(prediction, UUID) == original_kv(prediction, UUID)


@pytest.mark.parametrize("prediction", KV_PREDICTIONS)
def test_kv_scorer_reads_a_list_label_as_its_first_element(prediction):
    """Catches: the original's pitfall kept, a list label that scores 0 whatever the model says."""
    assert score_kv_retrieval(prediction, [UUID]) == original_kv(prediction, UUID)
    assert original_kv(UUID, [UUID]) is False  # the pitfall itself, in the original


NUMBER_PREDICTIONS = [
    "71432",
    " 71432.",
    "The pass key is 71432",
    "1. The pass key is 71432",
    "071432",
    "7143",
    "71 432",
    "",
    "no digits",
    "٣٤",  # Arabic-Indic digits are not [0-9]
    "71432\n71432",
    "-71432",
]


@pytest.mark.parametrize("prediction", NUMBER_PREDICTIONS)
@pytest.mark.parametrize("label", ["71432", ["71432"], "07143", ["0714322233"]])
def test_passkey_and_number_string_scorers_are_the_original(prediction, label):
    """Catches: any digit run instead of the first one, or labels compared as integers (dropping leading zeros)."""
    assert first_int_match(prediction) == original_first_int_match(prediction)
    assert score_passkey(prediction, label) == original_passkey(prediction, label)
    assert score_number_string(prediction, label) == original_passkey(prediction, label)


MATH_PREDICTIONS = ["12", " 12.", "12.0", "012", "the answer is 12", "-12", "", "x", "1,2", "50.5", "50.50", "3 12"]


@pytest.mark.parametrize("prediction", MATH_PREDICTIONS)
@pytest.mark.parametrize("label", [12, [12], 50.5, [50.0], 3, 50.0])
def test_math_find_scorer_is_the_original_where_the_original_answers(prediction, label):
    """Catches: a signed or last number read instead of the first unsigned one, or int/float labels confused."""
    try:
        expected = original_math_find(prediction, label)
    except ValueError:
        expected = None  # int("12.0"): the original stops the run; see the next test
    if expected is not None:
        assert score_math_find(prediction, label) == expected


def test_math_find_compares_a_decimal_with_an_int_label_instead_of_raising():
    """Catches: the original's ValueError (int('12.5')) that ends a whole scoring run."""
    with pytest.raises(ValueError):
        original_math_find("12.5", 12)
    assert score_math_find("12.5", 12) is False
    assert score_math_find("12.0", 12) is True
    with pytest.raises(CtxevalError):
        score_math_find("12", "12")


def test_the_scorers_agree_with_the_originals_on_random_outputs():
    """Catches: any rule beyond the originals' on generated text (digits, dots, separators, hyphens)."""
    rng = random.Random(8)
    alphabet = "0123456789.-: \n\"'}a"
    for _ in range(600):
        prediction = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 10)))
        digits = "".join(rng.choice("0123") for _ in range(rng.randint(1, 2)))
        assert score_passkey(prediction, digits) == original_passkey(prediction, digits)
        assert score_kv_retrieval(prediction, digits) == original_kv(prediction, digits)
        try:
            expected = original_math_find(prediction, int(digits))
        except ValueError:
            continue
        assert score_math_find(prediction, int(digits)) == expected


def test_the_aggregate_is_the_fraction_get_score_prints():
    """Catches: a percentage, or scores from the wrong task's scorer."""
    scores = [score_row("passkey", p, "71432") for p in ("71432", "1. 71432", "x71432y", "")]
    assert scores == [1.0, 0.0, 1.0, 0.0]
    assert infinitebench_accuracy(scores) == original_get_score(scores) == 0.5
    with pytest.raises(CtxevalError):
        score_row("code_run", "", "")
    with pytest.raises(CtxevalError):
        infinitebench_accuracy([])
