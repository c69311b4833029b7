"""HELMET's json_kv (princeton-nlp/HELMET 4526dfb, data.py load_json_kv and utils.py; the size table of the newer
data_module/json_kv.py, 5dde2de): the number of pairs per input length, the prompt (JSON first, instruction,
demos, unquoted `Key:` query, answer prefix), the substring exact match after HELMET's normalisation and its x100 mean.

HELMET's generator for its data files is not public. `generate_json_kv_sample` is ctxeval's stand-in, built from
what the released data shows (a `JSON data:` line over an indent-4 JSON object of uuid pairs, demos that are other
pairs of the same object); to compare with published numbers, use HELMET's own files.
"""

from __future__ import annotations

import json
import random
import re
import string
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ...errors import CtxevalError
from .litm_kv import KvRecord, seeded_uuid4

# the Llama-2 tokenizer sizing, the files of the HELMET paper (scripts/generate_configs.py; 256k..1m added later)
NUM_KVS_LLAMA2 = {
    4096: 50,
    8192: 105,
    16384: 220,
    32768: 440,
    65536: 900,
    131072: 1800,
    262144: 3600,
    524288: 7200,
    1048576: 14400,
}
# data_module/json_kv.py's Llama-3 tokenizer sizing (the same k gives fewer Llama-3 tokens)
NUM_KVS_LLAMA3 = {
    32768: 630,
    65536: 1260,
    131072: 2550,
    262144: 5125,
    524288: 10250,
    1048576: 20500,
    2097152: 41000,
}
USER_TEMPLATE = "{context}\n\nExtract the value corresponding to the specified key in the JSON object below.\n\n{demos}Key: {question}"
SYSTEM_TEMPLATE = "Corresponding value:"
PROMPT_TEMPLATE = USER_TEMPLATE + "\n" + SYSTEM_TEMPLATE
DEMO_TEMPLATE = "Key: {key}\nCorresponding value:{value}"
SHOTS = 2
GENERATION_MAX_LENGTH = 100  # greedy, no stop on a newline
MAX_TEST_SAMPLES = 100  # data.shuffle(seed=42).select(range(min(100, len(data))))


@dataclass(frozen=True)
class JsonKvSample:
    """The fields of a HELMET json_kv row that the prompt and scorer read, plus where the gold pair sits."""

    context: str
    demos: list[KvRecord]
    question: str
    answer: list[str]
    depth: float
    gold_index: int
    num_kvs: int


def json_kv_test_file(num_kvs: int) -> str:
    """The data file HELMET reads for `num_kvs` pairs."""
    return f"data/json_kv/test_k{num_kvs}_dep6.jsonl"


def format_demos(demos: Sequence[KvRecord], shots: int = SHOTS) -> str:
    """load_json_kv's demos: the first `shots` pairs, each value after a space, blank-line separated and closed."""
    joined = "\n\n".join(DEMO_TEMPLATE.format(key=key, value=" " + value) for key, value in demos[:shots])
    return joined + ("\n\n" if shots > 0 else "")


def json_kv_prompt(context: str, demos: Sequence[KvRecord], question: str, shots: int = SHOTS) -> str:
    """The completion prompt (use_chat_template=False, as every recall config sets it)."""
    return PROMPT_TEMPLATE.format(context=context, demos=format_demos(demos, shots), question=question)


def json_kv_chat_message(context: str, demos: Sequence[KvRecord], question: str, shots: int = SHOTS) -> str:
    """The user message with use_chat_template=True: no `Corresponding value:` prefix."""
    return USER_TEMPLATE.format(context=context, demos=format_demos(demos, shots), question=question)


def generate_json_kv_sample(num_kvs: int, depth: float, rng: random.Random, shots: int = SHOTS) -> JsonKvSample:
    """ctxeval's stand-in for HELMET's unpublished generator: `num_kvs` uuid pairs as `JSON data:` over
    json.dumps(indent=4), the gold pair at round(depth * (num_kvs - 1)), `shots` demos drawn from the other pairs."""
    if num_kvs < shots + 1:
        raise CtxevalError(f"json_kv needs more than {shots} pairs for {shots} demos, not {num_kvs}")
    if not 0.0 <= depth <= 1.0:
        raise CtxevalError(f"json_kv depth {depth} is outside 0..1")
    pairs: dict[str, str] = {}
    while len(pairs) != num_kvs:
        pairs[seeded_uuid4(rng)] = seeded_uuid4(rng)
    records = list(pairs.items())
    gold_index = round(depth * (num_kvs - 1))
    key, value = records[gold_index]
    demo_indices = rng.sample([i for i in range(num_kvs) if i != gold_index], shots)
    return JsonKvSample(
        context="JSON data:\n" + json.dumps(pairs, indent=4),
        demos=[records[i] for i in demo_indices],
        question=key,
        answer=[value],
        depth=depth,
        gold_index=gold_index,
        num_kvs=num_kvs,
    )


def normalize_answer(text: str) -> str:
    """utils.py normalize_answer: lower case, ASCII punctuation (uuid hyphens too) removed, articles removed,
    whitespace collapsed."""
    text = text.lower()
    punctuation = set(string.punctuation)
    text = "".join(ch for ch in text if ch not in punctuation)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def substring_exact_match(prediction: str, ground_truth: str) -> bool:
    """utils.py substring_exact_match_score."""
    return normalize_answer(ground_truth) in normalize_answer(prediction)


def flatten_ground_truths(ground_truths: str | Sequence[str] | Sequence[Sequence[str]]) -> list[str]:
    """drqa_metric_max_over_ground_truths' reading of the answer: a string, a list, or a list of lists."""
    if isinstance(ground_truths, str):
        return [ground_truths]
    if isinstance(ground_truths[0], list):
        return [answer for answers in ground_truths for answer in answers]
    return list(ground_truths)  # type: ignore[arg-type]


def parse_output(output: str, prefix: str = "Answer:") -> str | None:
    """utils.py parse_output: the rest of the line after `prefix` (else the first line), `prefix` stripped again."""
    patterns = [re.compile(f"(?:{prefix})(.*)(?:\n|$)", flags=re.IGNORECASE), re.compile(r"(?:^)(.*)(?:\n|$)")]
    for pattern in patterns:
        found = pattern.search(output)
        if found is not None:
            return re.sub(f"^{re.escape(prefix)}", "", found[1].strip(), flags=re.IGNORECASE).strip()
    return None


def json_kv_score(output: str, answer: str | Sequence[str], use_chat_template: bool = False) -> bool:
    """eval.py L101-103 then data.py post_process's substring_exact_match: the prefix prepended in completion mode,
    the best of the raw and the parsed output over every gold answer."""
    if not use_chat_template:
        output = SYSTEM_TEMPLATE + output
    answers = flatten_ground_truths(answer)
    raw = max(substring_exact_match(output, gold) for gold in answers)
    parsed = parse_output(output, "corresponding value:")
    if parsed is None:
        return raw
    return max(raw, max(substring_exact_match(parsed, gold) for gold in answers))


def json_kv_aggregate(scores: Sequence[bool | float | None]) -> float:
    """eval.py L155: mean x 100 over the file; an example whose output was None is left out of the mean."""
    kept = [float(score) for score in scores if score is not None]
    return float(np.mean(kept) * 100)
