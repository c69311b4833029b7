"""InfiniteBench's synthetic retrieval tasks (OpenBMB/InfiniteBench 88b3daa): data/construct_synthetic_dataset.py's
passkey, number_string, kv_retrieval and math_find generators with their noise and needle texts, and
src/prompt.py's templates as src/eval_utils.py create_prompt fills them.

Differences from the original, all in the randomness: it never seeds `random` (and its kv source is LITM's uuid4
output); here every draw comes from the `random.Random` passed in, in the original's order, so a seed gives the same
rows again. The released files cannot be regenerated from either (the committed loop ranges differ from them).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from ...errors import CtxevalError
from .litm_kv import KvRecord

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n"
PASSKEY_NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key.\n"
NUMBER_NEEDLE = "The sequence of digits is {key}. Remember it. {key} is the sequence of digits.\n"
PASSKEY_QUESTION = "What is the pass key?"
NUMBER_QUESTION = "What is the sequence of digits?"
TOKENS_PER_LINE = 26  # the record's "len" field: 26 x the noise lines after the needle


@dataclass(frozen=True)
class NeedleSize:
    """One column of a build_* table: noise lines in the haystack and the needle-line step."""

    num_noise: int
    step: int


# build_passkey: 8k..256k (HEAD builds 8k..64k with 5 repeats; the released 590 rows fit 128k with 10)
PASSKEY_SIZES = {
    8192: NeedleSize(326, 6),
    16384: NeedleSize(652, 12),
    32768: NeedleSize(1305, 22),
    65536: NeedleSize(2610, 45),
    131072: NeedleSize(5220, 90),
    262144: NeedleSize(10440, 180),
}
PASSKEY_REPEATS = 5
# build_number_string: HEAD builds 128k only, 59 positions x 10 = 590 rows
NUMBER_STRING_SIZES = {65536: NeedleSize(2610, 45), 131072: NeedleSize(5220, 90)}
NUMBER_STRING_REPEATS = 10
# build_kv_retrieval's 128k setting over LITM's 3000-key file
KV_SOURCE_KEYS = 3000
KV_KEPT_PAIRS = 2500
KV_SAMPLES = 500
MATH_FIND_TASKS = (
    "largest number",
    "second largest number",
    "third largest number",
    "smallest number",
    "second smallest number",
    "third smallest number",
    "median",
)
MATH_FIND_PROMPTS = {  # stored in each row, never read by create_prompt
    "largest number": "Find the largest number from the list below:",
    "second largest number": "Find the second largest number from the list below:",
    "third largest number": "Find the third largest number from the list below:",
    "smallest number": "Find the smallest number from the list below:",
    "second smallest number": "Find the second smallest number from the list below:",
    "third smallest number": "Find the third smallest number from the list below:",
    "median": "Calculate the median number from the list below:",
}
MATH_FIND_INPUTS = {
    task: f"You should answer with only one number, no other words. The {task} of the list is: "
    for task in MATH_FIND_TASKS[:-1]
} | {"median": "You should answer with only one number, no other words. The median number of the list is: "}
MATH_FIND_SAMPLES = 50  # per task: 7 x 50 = 350 rows
MATH_FIND_LIST_LENGTH = 60000
MATH_FIND_MIN, MATH_FIND_MAX = 0, 99
MAX_NEW_TOKENS = {"passkey": 6, "number_string": 12, "kv_retrieval": 50, "math_find": 3}

_FOUND_IT = "There is an important info hidden inside a lot of irrelevant text. Find it. "
_QUIZ = "I will quiz you about the important information there.\n\n"
_MEMORIZE_THEM = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. " + _QUIZ
)
_KV_INSTRUCTION = "Extract the value corresponding to the specified key in the JSON object below.\n\n"
TEMPLATES = {
    "gpt4": {
        "passkey": _MEMORIZE_THEM + "{context}\n\n{input}",
        "number_string": _FOUND_IT + _QUIZ + "{context}\n\n{input}",
        "kv_retrieval": _KV_INSTRUCTION + "{context}\n\n{input}",
        "math_find": "{prefix}\n\n{context}\n\n{input}",
    },
    "yarn-mistral": {
        "passkey": "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
        "I will quiz you about the important information.\n\n{context}\n\n{input}\n\nThe pass key is",
        "number_string": _FOUND_IT + _QUIZ + "{context}\n\n{input}\n\nThe sequence of digits is",
        "kv_retrieval": _KV_INSTRUCTION + "{context}\n\n{input}",
        "math_find": "{prefix}\n\n{context}\n\n{input}",
    },
    "claude2": {
        "passkey": _MEMORIZE_THEM + "{context}\n{input}\nThe pass key is",
        "number_string": _FOUND_IT + _QUIZ + "{context}\n{input}\nThe sequence of digits is",
        "kv_retrieval": _FOUND_IT + _QUIZ + "{context}\n{input}",
        "math_find": "{prefix}\n\n{context}\n\n{input}",
    },
    "kimi": {
        "passkey": _MEMORIZE_THEM + "{context}\n{input}\nThe pass key is",
        "number_string": _FOUND_IT + _QUIZ + "{context}\n{input}\nThe sequence of digits is",
        "kv_retrieval": _KV_INSTRUCTION + "{context}\n{input}",
        "math_find": "{prefix}\n\n{context}\n\n{input}",
    },
}
# eval_utils.py MODEL_TO_PROMPT_TEMPLATE
MODEL_TEMPLATES = {
    "gpt4": "gpt4",
    "claude2": "claude2",
    "kimi": "kimi",
    "yarn-mistral": "yarn-mistral",
    "yi-6b-200k": "yarn-mistral",
    "yi-34b-200k": "yarn-mistral",
    "chatglm3": "yarn-mistral",
}


@dataclass(frozen=True)
class NeedleRow:
    """A passkey or number_string row: context, question and answer as released, plus the needle's line index."""

    context: str
    input: str
    answer: str
    len: int
    needle_line: int
    num_noise: int


@dataclass(frozen=True)
class KvRetrievalRow:
    """A kv_retrieval row as released, plus the gold pair's index among the kept pairs."""

    id: int
    context: str
    input: str
    answer: str
    gold_index: int
    num_pairs: int


@dataclass(frozen=True)
class MathFindRow:
    """A math_find row as released (`context` is str(list), the answer an int, or a float for the median)."""

    task: str
    prompt: str
    context: str
    input: str
    answer: int | float


def needle_lines(size: NeedleSize) -> range:
    """The needle's line indices: 0..num_noise inclusive, every `step` lines."""
    return range(0, size.num_noise + 1, size.step)


def needle_context(needle: str, key: str, num_noise: int, needle_line: int) -> str:
    """`needle_line` noise lines, the needle, the remaining noise lines; every {key} replaced."""
    return (NOISE * needle_line + needle + NOISE * (num_noise - needle_line)).replace("{key}", key)


def passkey_key(rng: random.Random) -> str:
    """Five random digits, a leading zero allowed."""
    return "".join(str(rng.randint(0, 9)) for _ in range(5))


def number_string_key(rng: random.Random) -> str:
    """Five random digits, then five times a digit duplicated in place: ten digits with repeated runs."""
    digits = [str(rng.randint(0, 9)) for _ in range(5)]
    for k in range(5):
        pos = rng.randint(0, 5 + k - 1)
        digits.insert(pos, digits[pos])
    return "".join(digits)


def _needle_rows(size: NeedleSize, repeats: int, rng: random.Random, number_string: bool) -> list[NeedleRow]:
    needle, question = (NUMBER_NEEDLE, NUMBER_QUESTION) if number_string else (PASSKEY_NEEDLE, PASSKEY_QUESTION)
    rows = []
    for line in needle_lines(size):
        for _ in range(repeats):
            key = number_string_key(rng) if number_string else passkey_key(rng)
            context = needle_context(needle, key, size.num_noise, line)
            rows.append(
                NeedleRow(context, question, key, TOKENS_PER_LINE * (size.num_noise - line), line, size.num_noise)
            )
    return rows


def generate_passkey(size: NeedleSize, rng: random.Random, repeats: int = PASSKEY_REPEATS) -> list[NeedleRow]:
    """build_passkey for one size: `repeats` keys at each needle line."""
    return _needle_rows(size, repeats, rng, number_string=False)


def generate_number_string(
    size: NeedleSize, rng: random.Random, repeats: int = NUMBER_STRING_REPEATS
) -> list[NeedleRow]:
    """build_number_string for one size: `repeats` keys at each needle line."""
    return _needle_rows(size, repeats, rng, number_string=True)


def kv_gold_index(sample_index: int, num_samples: int = KV_SAMPLES, num_pairs: int = KV_KEPT_PAIRS) -> int:
    """build_kv_retrieval's ans_id: a linear sweep over the kept pairs by sample index (5 x index for 500 of 2500)."""
    return min(int(sample_index * num_pairs / num_samples), num_pairs)


def generate_kv_retrieval_row(
    sample_index: int,
    source_records: list[KvRecord],
    rng: random.Random,
    num_samples: int = KV_SAMPLES,
    num_pairs: int = KV_KEPT_PAIRS,
    gold_index: int | None = None,
) -> KvRetrievalRow:
    """build_kv_retrieval for one LITM line: shuffle all its pairs, keep the first `num_pairs` as one-line JSON, ask
    for the key at kv_gold_index (or at `gold_index`, a depth chosen by the caller). `source_records` is not
    changed."""
    if not 0 <= sample_index < num_samples:
        raise CtxevalError(f"kv_retrieval sample index {sample_index} is outside 0..{num_samples - 1}")
    if len(source_records) < num_pairs:
        raise CtxevalError(f"kv_retrieval keeps {num_pairs} pairs of a line that has {len(source_records)}")
    records = list(source_records)
    rng.shuffle(records)
    if gold_index is None:
        gold_index = kv_gold_index(sample_index, num_samples, num_pairs)
    elif not 0 <= gold_index < num_pairs:
        raise CtxevalError(f"kv_retrieval gold index {gold_index} is outside 0..{num_pairs - 1}")
    key, value = records[gold_index]
    context = "JSON data:\n{" + ", ".join(f'"{k}": "{v}"' for k, v in records[:num_pairs]) + "}"
    question = '\nKey: "' + key + '"\nThe value associated with the specified key is: '
    return KvRetrievalRow(sample_index, context, question, value, gold_index, num_pairs)


def _nth_distinct(values: list[int], rank: int, largest: bool) -> int:
    """The `rank`-th (0-based) distinct value from the top or bottom, as the original's remove-every-copy loops."""
    distinct = sorted(set(values), reverse=largest)
    if rank >= len(distinct):
        raise CtxevalError(f"the list has only {len(distinct)} distinct values")  # the original: max([]) raises
    return distinct[rank]


def generate_math_find_row(
    task: str,
    rng: random.Random,
    list_length: int = MATH_FIND_LIST_LENGTH,
    min_val: int = MATH_FIND_MIN,
    max_val: int = MATH_FIND_MAX,
) -> MathFindRow:
    """generate_random_list and generate_math_qa for one row: the draws in the original's order."""
    if task not in MATH_FIND_TASKS:
        raise CtxevalError(f"unknown math_find task {task!r}; known: {', '.join(MATH_FIND_TASKS)}")
    smallest_type = "smallest" in task or (task == "median" and rng.random() > 0.5)
    if smallest_type:
        low, high = rng.randint(min_val, int(max_val * 0.2)), max_val
    else:
        low, high = min_val, rng.randint(int(max_val * 0.8), max_val)
    values = [rng.randint(low, high) for _ in range(list_length)]
    answer: int | float
    if task == "median":
        ordered = sorted(values)
        half = len(ordered) // 2
        answer = ordered[half] if len(ordered) % 2 == 1 else (ordered[half] + ordered[half - 1]) / 2
    else:
        rank = ("second" in task) + 2 * ("third" in task)
        answer = _nth_distinct(values, rank, largest="largest" in task)
    return MathFindRow(task, MATH_FIND_PROMPTS[task], str(values), MATH_FIND_INPUTS[task], answer)


def generate_math_find(
    rng: random.Random, samples_per_task: int = MATH_FIND_SAMPLES, list_length: int = MATH_FIND_LIST_LENGTH
) -> list[MathFindRow]:
    """build_math_find: `samples_per_task` rows for each task, task by task."""
    return [generate_math_find_row(task, rng, list_length) for task in MATH_FIND_TASKS for _ in range(samples_per_task)]


def math_find_prefix(question: str) -> str:
    """create_prompt's math_find prefix, rebuilt from the row's input: 'What is the largest number in the following
    list?'."""
    found = re.findall(r"The .+ of", question)
    if not found:
        raise CtxevalError(f"cannot find the target number in {question!r}")
    return f"What is {found[0].lower()[:-3]} in the following list?"


def infinitebench_prompt(task: str, row: Any, model: str = "gpt4") -> str:
    """create_prompt for `task` with `model`'s template set (yi, chatglm3 and yarn-mistral share one)."""
    if model not in MODEL_TEMPLATES:
        raise CtxevalError(f"unknown InfiniteBench template model {model!r}; known: {', '.join(MODEL_TEMPLATES)}")
    template = TEMPLATES[MODEL_TEMPLATES[model]][task]
    if task == "math_find":
        return template.format(prefix=math_find_prefix(row.input), context=row.context, input=row.input)
    return template.format(context=row.context, input=row.input)
