"""evals/retrieval/helmet_json_kv.py against transcriptions of princeton-nlp/HELMET (data.py, utils.py,
data_module/json_kv.py)."""

from __future__ import annotations

import json
import random
import re
import string

import numpy as np
import pytest

from ctxeval.errors import CtxevalError
from ctxeval.evals.retrieval.helmet_json_kv import (
    NUM_KVS_LLAMA2,
    NUM_KVS_LLAMA3,
    PROMPT_TEMPLATE,
    generate_json_kv_sample,
    json_kv_aggregate,
    json_kv_chat_message,
    json_kv_prompt,
    json_kv_score,
    json_kv_test_file,
    normalize_answer,
    parse_output,
)

# data_module/json_kv.py _JSON_KV_VARIANTS and base.py LENGTH_MAP, transcribed
LENGTH_MAP = {
    "4k": 4096,
    "8k": 8192,
    "16k": 16384,
    "32k": 32768,
    "64k": 65536,
    "128k": 131072,
    "256k": 262144,
    "512k": 524288,
    "1m": 1048576,
    "2m": 2097152,
}
VARIANTS = {
    "json_kv_4k_llama2": ("data/json_kv/test_k50_dep6.jsonl", "4k"),
    "json_kv_8k_llama2": ("data/json_kv/test_k105_dep6.jsonl", "8k"),
    "json_kv_16k_llama2": ("data/json_kv/test_k220_dep6.jsonl", "16k"),
    "json_kv_32k_llama2": ("data/json_kv/test_k440_dep6.jsonl", "32k"),
    "json_kv_64k_llama2": ("data/json_kv/test_k900_dep6.jsonl", "64k"),
    "json_kv_128k_llama2": ("data/json_kv/test_k1800_dep6.jsonl", "128k"),
    "json_kv_256k_llama2": ("data/json_kv/test_k3600_dep6.jsonl", "256k"),
    "json_kv_512k_llama2": ("data/json_kv/test_k7200_dep6.jsonl", "512k"),
    "json_kv_1m_llama2": ("data/json_kv/test_k14400_dep6.jsonl", "1m"),
    "json_kv_32k": ("data/json_kv/test_k630_dep6.jsonl", "32k"),
    "json_kv_64k": ("data/json_kv/test_k1260_dep6.jsonl", "64k"),
    "json_kv_128k": ("data/json_kv/test_k2550_dep6.jsonl", "128k"),
    "json_kv_256k": ("data/json_kv/test_k5125_dep6.jsonl", "256k"),
    "json_kv_512k": ("data/json_kv/test_k10250_dep6.jsonl", "512k"),
    "json_kv_1m": ("data/json_kv/test_k20500_dep6.jsonl", "1m"),
    "json_kv_2m": ("data/json_kv/test_k41000_dep6.jsonl", "2m"),
}


def original_normalize_answer(s):
    """utils.py normalize_answer, transcribed."""

    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def original_sub_em(prediction, ground_truth):
    return original_normalize_answer(ground_truth) in original_normalize_answer(prediction)


def original_max_over_ground_truths(metric_fn, prediction, ground_truths):
    if isinstance(ground_truths, str):
        ground_truths = [ground_truths]
    elif isinstance(ground_truths[0], list):
        ground_truths = [g for gl in ground_truths for g in gl]
    return max(metric_fn(prediction, g) for g in ground_truths)


def original_parse_output(output, prefix="Answer:"):
    def lstrip_string(s, sub):
        return re.sub(f"^{re.escape(sub)}", "", s, flags=re.IGNORECASE)

    patterns = [re.compile(f"(?:{prefix})(.*)(?:\n|$)", flags=re.IGNORECASE), re.compile(r"(?:^)(.*)(?:\n|$)")]
    for pat in patterns:
        matches = pat.search(output)
        if matches is not None:
            return lstrip_string(matches[1].strip(), prefix).strip()
    return None


def original_score(output, answer):
    """eval.py L101-103 (completion mode) and data.py post_process, sub-EM only."""
    output = "Corresponding value:" + output
    sub_em = original_max_over_ground_truths(original_sub_em, output, answer)
    parsed = original_parse_output(output, "corresponding value:")
    return max(sub_em, original_max_over_ground_truths(original_sub_em, parsed, answer))


def test_the_size_tables_are_helmet_variants():
    """Catches: a k value or input length typed wrong in either tokenizer's table."""
    llama2 = {LENGTH_MAP[length]: path for name, (path, length) in VARIANTS.items() if name.endswith("_llama2")}
    llama3 = {LENGTH_MAP[length]: path for name, (path, length) in VARIANTS.items() if not name.endswith("_llama2")}
    assert {n: json_kv_test_file(k) for n, k in NUM_KVS_LLAMA2.items()} == llama2
    assert {n: json_kv_test_file(k) for n, k in NUM_KVS_LLAMA3.items()} == llama3


def original_prompt(context, demos, question, shots=2):
    """data.py load_json_kv's templates and demos map, transcribed."""
    user_template = "{context}\n\nExtract the value corresponding to the specified key in the JSON object below.\n\n{demos}Key: {question}"
    prompt_template = user_template + "\n" + "Corresponding value:"
    demo_template = "Key: {key}\nCorresponding value:{value}"
    formatted = "\n\n".join([demo_template.format(key=k, value=" " + v) for k, v in demos[:shots]]) + (
        "\n\n" if shots > 0 else ""
    )
    return prompt_template.format(context=context, demos=formatted, question=question), user_template.format(
        context=context, demos=formatted, question=question
    )


@pytest.mark.parametrize("shots", [0, 1, 2])
def test_the_prompt_is_helmet_prompt(shots):
    """Catches: a quoted query key, a demo value without its leading space or the instruction put first."""
    sample = generate_json_kv_sample(10, 0.5, random.Random(shots))
    prompt, chat = original_prompt(sample.context, sample.demos, sample.question, shots)
    assert json_kv_prompt(sample.context, sample.demos, sample.question, shots) == prompt
    assert json_kv_chat_message(sample.context, sample.demos, sample.question, shots) == chat
    assert prompt.startswith("JSON data:\n{\n    ") and prompt.endswith(f"Key: {sample.question}\nCorresponding value:")
    assert PROMPT_TEMPLATE.endswith("\nCorresponding value:")


def test_the_stand_in_sample_places_gold_at_its_depth_and_demos_elsewhere():
    """Catches: a gold pair off its depth, a demo that gives the answer away, or a context that is not the object."""
    for depth in (0.0, 0.2, 0.5, 1.0):
        sample = generate_json_kv_sample(50, depth, random.Random(1))
        pairs = json.loads(sample.context.split("\n", 1)[1])
        assert len(pairs) == sample.num_kvs == 50
        assert list(pairs)[sample.gold_index] == sample.question and pairs[sample.question] == sample.answer[0]
        assert sample.gold_index == round(depth * 49)
        assert len(sample.demos) == 2 and all(pairs[k] == v and k != sample.question for k, v in sample.demos)
    assert generate_json_kv_sample(9, 0.3, random.Random(2)) == generate_json_kv_sample(9, 0.3, random.Random(2))
    assert generate_json_kv_sample(9, 0.3, random.Random(2)) != generate_json_kv_sample(9, 0.3, random.Random(3))
    with pytest.raises(CtxevalError):
        generate_json_kv_sample(2, 0.5, random.Random(0))
    with pytest.raises(CtxevalError):
        generate_json_kv_sample(10, 1.5, random.Random(0))


UUID = "d5d022b9-2f76-40c1-8519-b0a78cea47b9"
OUTPUTS = [
    " " + UUID,
    f" {UUID}\n\nKey: 54d3",
    " " + UUID.upper(),
    " " + UUID.replace("-", ""),
    " " + UUID.replace("-", " "),
    " " + UUID[:-1],
    "",
    "\n\n" + UUID,
    f' "{UUID}".',
    " the " + UUID,
    " Corresponding value: " + UUID,
    " a\nb",
]


@pytest.mark.parametrize("output", OUTPUTS)
@pytest.mark.parametrize("answer", [UUID, [UUID], [[UUID, "x"]], ["the", "a"], "An"])
def test_the_scorer_is_helmet_substring_exact_match(output, answer):
    """Catches: hyphens kept by the normalisation, an exact match instead of a substring, or no list flattening."""
    assert json_kv_score(output, answer) == original_score(output, answer)


def test_the_scorer_agrees_on_random_outputs_and_normalises_as_helmet():
    """Catches: any difference in punctuation, article or whitespace handling on generated text."""
    rng = random.Random(4)
    pieces = ["a", "an", "the", "The", "-", ".", ":", "\n", " ", "x1", "corresponding value:", "É"]
    for _ in range(400):
        output = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
        answer = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 3)))
        assert normalize_answer(output) == original_normalize_answer(output)
        assert parse_output(output, "corresponding value:") == original_parse_output(output, "corresponding value:")
        assert json_kv_score(output, [answer]) == original_score(output, [answer])


def test_chat_mode_does_not_prepend_the_prefix():
    """Catches: the answer prefix prepended in chat mode, where HELMET leaves the output as it is."""
    assert json_kv_score("value: x", "corresponding value x") is False
    assert json_kv_score("value: x", "corresponding value x", use_chat_template=True) is False
    assert json_kv_score(" x", "corresponding value x") is True
    assert json_kv_score(" x", "corresponding value x", use_chat_template=True) is False


def test_the_aggregate_is_a_percentage_without_missing_outputs():
    """Catches: a fraction instead of x100, or a missing output counted as a miss."""
    assert json_kv_aggregate([True, False, None, True, True]) == pytest.approx(np.mean([1, 0, 1, 1]) * 100)
