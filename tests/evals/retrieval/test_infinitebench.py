"""evals/retrieval/infinitebench.py against transcriptions of OpenBMB/InfiniteBench (88b3daa)
data/construct_synthetic_dataset.py and src/eval_utils.py, the originals' `random.` calls made on a seeded
random.Random so that both sides draw the same numbers."""

from __future__ import annotations

import random
import re

import pytest

from ctxeval.errors import CtxevalError
from ctxeval.evals.retrieval.infinitebench import (
    MATH_FIND_INPUTS,
    MATH_FIND_TASKS,
    NUMBER_STRING_SIZES,
    PASSKEY_SIZES,
    NeedleSize,
    generate_kv_retrieval_row,
    generate_math_find,
    generate_math_find_row,
    generate_number_string,
    generate_passkey,
    infinitebench_prompt,
    math_find_prefix,
    needle_lines,
)
from ctxeval.evals.retrieval.litm_kv import generate_kv_example

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n"


def original_passkey(random, num_noise_i, step_i, repeat_time):
    """build_passkey's inner loops, transcribed."""
    ans = "The pass key is {key}. Remember it. {key} is the pass key.\n"
    ret = []
    for j in range(0, num_noise_i + 1, step_i):
        input_text = NOISE * j + ans + NOISE * (num_noise_i - j)
        for _t in range(repeat_time):
            keys = []
            for _k in range(5):
                keys.append(str(random.randint(0, 9)))
            key_t = "".join(keys)
            ret.append(
                {
                    "input": "What is the pass key?",
                    "context": input_text.replace("{key}", key_t),
                    "answer": key_t,
                    "len": 26 * (num_noise_i - j),
                }
            )
    return ret


def original_number_string(random, num_noise_i, step_i, repeat_time):
    """build_number_string's inner loops, transcribed."""
    ans = "The sequence of digits is {key}. Remember it. {key} is the sequence of digits.\n"
    ret = []
    for j in range(0, num_noise_i + 1, step_i):
        input_text = NOISE * j + ans + NOISE * (num_noise_i - j)
        for _t in range(repeat_time):
            keys = []
            for _k in range(5):
                keys.append(str(random.randint(0, 9)))
            for k in range(5):
                pos = random.randint(0, 5 + k - 1)
                keys.insert(pos, keys[pos])
            key_t = "".join(keys)
            ret.append(
                {
                    "context": input_text.replace("{key}", key_t),
                    "answer": key_t,
                    "input": "What is the sequence of digits?",
                    "len": 26 * (num_noise_i - j),
                }
            )
    return ret


def original_kv_row(random, cnt, line, nsample=500, nnoise=2500):
    """build_kv_retrieval's body for one line, transcribed."""
    ans_id = min(int(cnt * nnoise / nsample), nnoise)
    text = "JSON data:\n{"
    t = -1
    random.shuffle(line["ordered_kv_records"])
    for item in line["ordered_kv_records"]:
        t += 1
        if t == nnoise:
            break
        text += '"' + item[0] + '": "' + item[1] + '", '
    text = text[:-2] + "}"
    question = (
        '\nKey: "' + line["ordered_kv_records"][ans_id][0] + '"\nThe value associated with the specified key is: '
    )
    return {"id": cnt, "context": text, "input": question, "answer": line["ordered_kv_records"][ans_id][1]}


def original_random_list(random, length, _min, _max, task):
    """generate_random_list, transcribed for the seven math_find tasks."""
    if "largest" in task:
        _max = random.randint(int(_max * 0.8), _max)
        random_list = [random.randint(_min, _max) for _ in range(length)]
        ret_list = random_list.copy()
        for _ in range(("second" in task) + 2 * ("third" in task)):
            target = max(random_list)
            while target == max(random_list):
                random_list.remove(max(random_list))
        return max(random_list), str(ret_list)
    if "smallest" in task:
        _min = random.randint(_min, int(_max * 0.2))
        random_list = [random.randint(_min, _max) for _ in range(length)]
        ret_list = random_list.copy()
        for _ in range(("second" in task) + 2 * ("third" in task)):
            target = min(random_list)
            while target == min(random_list):
                random_list.remove(min(random_list))
        return min(random_list), str(ret_list)
    if random.random() > 0.5:
        _min = random.randint(_min, int(_max * 0.2))
        random_list = [random.randint(_min, _max) for _ in range(length)]
    else:
        _max = random.randint(int(_max * 0.8), _max)
        random_list = [random.randint(_min, _max) for _ in range(length)]
    ret_list = random_list.copy()
    random_list.sort()
    if len(random_list) % 2 == 1:
        ans = random_list[len(random_list) // 2]
    else:
        ans = (random_list[len(random_list) // 2] + random_list[len(random_list) // 2 - 1]) / 2
    return ans, str(ret_list)


def original_math_find_prompt(template, eg):
    """create_prompt's math_find branch, transcribed."""
    find_result = re.findall(r"The .+ of", eg["input"])
    target_number = find_result[0].lower()[:-3]
    prefix = f"What is {target_number} in the following list?"
    return template.format(prefix=prefix, context=eg["context"], input=eg["input"])


def as_dicts(rows, fields):
    return [{f: getattr(r, f) for f in fields} for r in rows]


@pytest.mark.parametrize("size", [NeedleSize(40, 6), NeedleSize(7, 7), NeedleSize(5, 1)])
def test_passkey_rows_are_the_original_rows_under_one_seed(size):
    """Catches: the needle placed by token count instead of whole noise lines, or a wrong 'len'."""
    ours = generate_passkey(size, random.Random(11), repeats=3)
    theirs = original_passkey(random.Random(11), size.num_noise, size.step, 3)
    assert as_dicts(ours, ["input", "context", "answer", "len"]) == theirs
    assert [r.needle_line for r in ours] == [j for j in needle_lines(size) for _ in range(3)]


@pytest.mark.parametrize("size", [NeedleSize(40, 6), NeedleSize(9, 3)])
def test_number_string_rows_are_the_original_rows_under_one_seed(size):
    """Catches: insert bounds off by one (randint's upper bound is inclusive) in the digit duplication."""
    ours = generate_number_string(size, random.Random(12), repeats=4)
    theirs = original_number_string(random.Random(12), size.num_noise, size.step, 4)
    assert as_dicts(ours, ["input", "context", "answer", "len"]) == theirs
    assert all(len(r.answer) == 10 and any(a == b for a, b in zip(r.answer, r.answer[1:])) for r in ours)


def test_the_size_tables_give_the_originals_row_counts():
    """Catches: an exclusive end in the needle-line range (the original includes line num_noise)."""
    counts = {n: len(needle_lines(s)) for n, s in PASSKEY_SIZES.items()}
    assert counts == {8192: 55, 16384: 55, 32768: 60, 65536: 59, 131072: 59, 262144: 59}
    assert len(needle_lines(NUMBER_STRING_SIZES[131072])) * 10 == 590


def test_needle_rows_differ_under_another_seed():
    """Catches: keys drawn from a fixed or global random state."""
    size = NeedleSize(10, 5)
    assert generate_passkey(size, random.Random(1)) == generate_passkey(size, random.Random(1))
    assert generate_passkey(size, random.Random(1)) != generate_passkey(size, random.Random(2))
    assert generate_number_string(size, random.Random(1)) != generate_number_string(size, random.Random(2))


@pytest.mark.parametrize("cnt", [0, 1, 77, 99])
def test_kv_rows_are_the_original_rows_under_one_seed(cnt):
    """Catches: the gold index drawn at random instead of the 5 x index sweep, or a multi-line JSON."""
    source = generate_kv_example(60, random.Random(cnt)).ordered_kv_records
    row = generate_kv_retrieval_row(cnt, source, random.Random(5), num_samples=100, num_pairs=50)
    theirs = original_kv_row(random.Random(5), cnt, {"ordered_kv_records": [list(r) for r in source]}, 100, 50)
    assert {"id": row.id, "context": row.context, "input": row.input, "answer": row.answer} == theirs
    assert row.gold_index == cnt // 2 and "\n" not in row.context.split("\n", 1)[1]
    assert source == generate_kv_example(60, random.Random(cnt)).ordered_kv_records  # not shuffled in place


def test_kv_gold_sweeps_the_released_setting():
    """Catches: a gold index that does not step by 5 over 2500 kept pairs."""
    source = generate_kv_example(3000, random.Random(0)).ordered_kv_records
    row = generate_kv_retrieval_row(499, source, random.Random(0))
    assert row.gold_index == 2495 and row.context.count('": "') == 2500
    with pytest.raises(CtxevalError):
        generate_kv_retrieval_row(500, source, random.Random(0))


@pytest.mark.parametrize("task", MATH_FIND_TASKS)
def test_math_find_rows_are_the_original_rows_under_one_seed(task):
    """Catches: second/third largest taken with repeats (the original removes every copy) or a float/int mix-up."""
    for seed in range(6):
        row = generate_math_find_row(task, random.Random(seed), list_length=300)
        answer, context = original_random_list(random.Random(seed), 300, 0, 99, task)
        assert (row.answer, row.context) == (answer, context) and type(row.answer) is type(answer)
        assert row.input == MATH_FIND_INPUTS[task]


def test_math_find_answers_agree_with_a_brute_force_order_statistic():
    """Catches: the median of the unsorted list or a rank counted among repeated values."""
    for seed in range(5):
        rows = generate_math_find(random.Random(seed), samples_per_task=1, list_length=101)
        for row in rows:
            values = eval(row.context)  # str(list) of ints
            distinct = sorted(set(values))
            expected = {
                "largest number": distinct[-1],
                "second largest number": distinct[-2],
                "third largest number": distinct[-3],
                "smallest number": distinct[0],
                "second smallest number": distinct[1],
                "third smallest number": distinct[2],
                "median": sorted(values)[50],
            }[row.task]
            assert row.answer == expected
    assert generate_math_find(random.Random(1), 1, 50) != generate_math_find(random.Random(2), 1, 50)


def test_prompts_are_create_prompt_strings():
    """Catches: the yarn-mistral answer prefix missing, or claude2's single newline turned into a blank line."""
    size = NeedleSize(2, 1)
    row = generate_passkey(size, random.Random(0), repeats=1)[0]
    assert infinitebench_prompt("passkey", row, "yi-34b-200k").endswith(
        "again.\n\n\nWhat is the pass key?\n\nThe pass key is"
    )
    assert infinitebench_prompt("passkey", row, "claude2").endswith("again.\n\nWhat is the pass key?\nThe pass key is")
    assert infinitebench_prompt("passkey", row, "gpt4").endswith("again.\n\n\nWhat is the pass key?")
    kv = generate_kv_retrieval_row(
        0, generate_kv_example(4, random.Random(0)).ordered_kv_records, random.Random(0), 2, 3
    )
    assert infinitebench_prompt("kv_retrieval", kv, "gpt4") == (
        "Extract the value corresponding to the specified key in the JSON object below.\n\n"
        + kv.context
        + "\n\n"
        + kv.input
    )
    assert kv.input.endswith("The value associated with the specified key is: ")
    for task in MATH_FIND_TASKS:
        math = generate_math_find_row(task, random.Random(0), list_length=5)
        template = "{prefix}\n\n{context}\n\n{input}"
        eg = {"input": math.input, "context": math.context}
        assert infinitebench_prompt("math_find", math, "kimi") == original_math_find_prompt(template, eg)
    assert math_find_prefix(MATH_FIND_INPUTS["median"]) == "What is the median number in the following list?"
    with pytest.raises(CtxevalError):
        infinitebench_prompt("passkey", row, "llama")
