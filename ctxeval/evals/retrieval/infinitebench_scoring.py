"""InfiniteBench's scorers for its four synthetic retrieval tasks (src/compute_scores.py at 88b3daa) and the mean
compute_scores prints (a fraction; the README shows percentages).

Two differences from the original, both where it fails on input it can be given:
- kv_retrieval: the original tests `label in words` with the label as stored. The released HF rows store answers as
  lists, and a list is never among the words, so every kv row would score 0. Here a list label is read as its first
  element, as the original already does for passkey, number_string and math_find.
- math_find: with an int label and a first number that has a decimal point, the original's int("12.5") raises
  ValueError and stops the whole run. Here that number is compared as a float (12.0 == 12 scores 1, 12.5 scores 0).
"""

from __future__ import annotations

import re
from typing import Sequence

from ...errors import CtxevalError

KV_SEPARATORS = ("\n", ":", '"', "'", ".", ",", "?", "!", "{", "}")

Label = str | int | float | Sequence[str | int | float]


def first_label(label: Label) -> str | int | float:
    """A list label's first element (every task here has exactly one answer), any other label as it is."""
    if isinstance(label, (list, tuple)):
        if not label:
            raise CtxevalError("an InfiniteBench label list is empty")
        return label[0]
    return label  # type: ignore[return-value]


def first_int_match(prediction: str) -> str:
    """The first maximal run of ASCII digits, as a string ('' when there is none)."""
    for item in re.split("[^0-9]", prediction):
        if item != "":
            return item
    return ""


def score_kv_retrieval(prediction: str, label: Label) -> bool:
    """get_score_one_kv_retrieval: the separators become spaces, and the label must equal one whitespace-split
    word (case-sensitive; hyphens are not separators, so a uuid stays one word)."""
    for separator in KV_SEPARATORS:
        prediction = prediction.replace(separator, " ")
    return first_label(label) in prediction.split()


def score_passkey(prediction: str, label: Label) -> bool:
    """get_score_one_passkey: the first digit run equals the label, as strings (leading zeros count)."""
    return first_label(label) == first_int_match(prediction)


def score_number_string(prediction: str, label: Label) -> bool:
    """get_score_one_number_string: the same rule as passkey."""
    return first_label(label) == first_int_match(prediction)


def score_math_find(prediction: str, label: Label) -> bool:
    """get_score_one_math_find: the first unsigned integer or decimal in the output equals the label."""
    gold = first_label(label)
    if isinstance(gold, bool) or not isinstance(gold, (int, float)):
        raise CtxevalError(f"a math_find label must be an int or a float, not {type(gold).__name__}")
    found = re.search(r"\d+\.\d+|\d+", prediction)
    if found is None:
        return False
    number = found.group(0).strip()
    if isinstance(gold, int) and "." not in number:
        return int(number) == gold
    return float(number) == gold


SCORERS = {
    "kv_retrieval": score_kv_retrieval,
    "passkey": score_passkey,
    "number_string": score_number_string,
    "math_find": score_math_find,
}


def score_row(task: str, prediction: str, label: Label) -> float:
    """get_score_one: the task's scorer as a float."""
    if task not in SCORERS:
        raise CtxevalError(f"unknown InfiniteBench task {task!r}; known: {', '.join(SCORERS)}")
    return float(SCORERS[task](prediction, label))


def infinitebench_accuracy(scores: Sequence[float]) -> float:
    """get_score: the plain mean over the file, a fraction in [0, 1]."""
    if not scores:
        raise CtxevalError("no InfiniteBench scores to average")
    return sum(scores) / len(scores)
