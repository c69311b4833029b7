"""Key-value retrieval as nelson-liu/lost-in-the-middle (commit 29b8a6d) makes, prompts and scores it:
scripts/make_kv_retrieval_data.py (the records), get_kv_responses_from_*.py (the gold pair moved to --gold-index),
src/lost_in_the_middle/prompting.py (the hand-built JSON and the two templates) and evaluate_kv_responses.py (the
case-insensitive substring test and its mean).

One difference from the original: it draws keys and values with unseeded uuid.uuid4() and the gold pair with the
unseeded global `random`; here both come from the `random.Random` passed in, so a seed gives the same data again.
"""

from __future__ import annotations

import random
import statistics
import uuid
from dataclasses import dataclass

from ...errors import CtxevalError

# prompts/kv_retrieval.prompt and kv_retrieval_with_query_aware_contextualization.prompt, the file's final "\n"
# stripped as prompting.py strips it
KV_PROMPT = (
    "Extract the value corresponding to the specified key in the JSON object below.\n\n"
    "JSON data:\n{formatted_kv_records}\n\n"
    'Key: "{key}"\n'
    "Corresponding value:"
)
KV_PROMPT_QUERY_AWARE = (
    "Extract the value corresponding to the specified key in the JSON object below.\n\n"
    'Key: "{key}"\n\n'
    "JSON data:\n{formatted_kv_records}\n\n"
    'Key: "{key}"\n'
    "Corresponding value:"
)
SHIPPED_NUM_KEYS = (75, 140, 300)  # kv_retrieval_data/kv-retrieval-{75,140,300}_keys.jsonl.gz, 500 examples each
GOLD_INDICES_140_KEYS = (0, 34, 69, 104, 139)  # EXPERIMENTS.md; the indices for 75 and 300 keys are not in the repo
MAX_NEW_TOKENS = 100  # get_kv_responses_from_*.py --max-new-tokens default, greedy decoding

KvRecord = tuple[str, str]


@dataclass(frozen=True)
class KvExample:
    """One line of make_kv_retrieval_data.py's output: the pairs in generation order and the gold pair."""

    ordered_kv_records: list[KvRecord]
    key: str
    value: str


@dataclass(frozen=True)
class KvSample:
    """A prompt ready to send: its pieces, the gold value the scorer looks for and where the gold pair sits."""

    prompt: str
    formatted_kv_records: str
    key: str
    value: str
    gold_index: int
    num_keys: int


def seeded_uuid4(rng: random.Random) -> str:
    """A string shaped as str(uuid.uuid4()) (36 characters, lower case, version 4, RFC 4122 variant), from `rng`."""
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def generate_kv_example(num_keys: int, rng: random.Random) -> KvExample:
    """make_kv_retrieval_data.py L36-45: `num_keys` distinct uuid keys with uuid values, gold pair chosen uniformly."""
    if num_keys < 2:
        raise CtxevalError(f"key-value retrieval needs at least 2 keys, not {num_keys}")
    kv_records: dict[str, str] = {}
    while len(kv_records) != num_keys:
        kv_records[seeded_uuid4(rng)] = seeded_uuid4(rng)
    ordered_kv_records = list(kv_records.items())
    key, value = rng.choice(ordered_kv_records)
    return KvExample(ordered_kv_records, key, value)


def move_gold_record(example: KvExample, gold_index: int) -> list[KvRecord]:
    """get_kv_responses_from_mpt.py L52-59: pop the gold pair and insert it at `gold_index` (0-based); the other
    pairs keep their order."""
    if not 0 <= gold_index < len(example.ordered_kv_records):
        raise CtxevalError(f"gold index {gold_index} is outside 0..{len(example.ordered_kv_records) - 1}")
    records = list(example.ordered_kv_records)
    gold = records.pop(records.index((example.key, example.value)))
    records.insert(gold_index, gold)
    return records


def format_kv_records(records: list[KvRecord]) -> str:
    """prompting.py L97-102: '{' + pairs joined by ',\\n ' + '}', each pair '"key": "value"', nothing escaped."""
    return "{" + ",\n ".join(f'"{key}": "{value}"' for key, value in records) + "}"


def kv_prompt(records: list[KvRecord], key: str, query_aware: bool = False) -> str:
    """prompting.py get_kv_retrieval_prompt: its checks, then the template filled in."""
    keys = [record_key for record_key, _ in records]
    if key not in keys:
        raise CtxevalError("the query key is not among the records")
    if len(set(keys)) != len(keys):
        raise CtxevalError("the records' keys are not unique")
    if len(records) < 2:
        raise CtxevalError("key-value retrieval needs at least 2 records")
    template = KV_PROMPT_QUERY_AWARE if query_aware else KV_PROMPT
    return template.format(formatted_kv_records=format_kv_records(records), key=key)


def kv_sample(example: KvExample, gold_index: int, query_aware: bool = False) -> KvSample:
    """The prompt get_kv_responses_from_*.py sends for `example` with its gold pair at `gold_index`."""
    records = move_gold_record(example, gold_index)
    return KvSample(
        prompt=kv_prompt(records, example.key, query_aware),
        formatted_kv_records=format_kv_records(records),
        key=example.key,
        value=example.value,
        gold_index=gold_index,
        num_keys=len(records),
    )


def score_kv_answer(value: str, model_answer: str) -> float:
    """evaluate_kv_responses.py L30: 1.0 when the gold value is anywhere in the continuation, case ignored."""
    return 1.0 if value.lower() in model_answer.lower() else 0.0


def kv_accuracy(scores: list[float]) -> float:
    """evaluate_kv_responses.py L36-38: the mean, a fraction in [0, 1], logged as `accuracy:` (one gold index)."""
    return statistics.mean(scores)
