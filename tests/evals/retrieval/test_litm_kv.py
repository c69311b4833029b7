"""evals/retrieval/litm_kv.py against transcriptions of nelson-liu/lost-in-the-middle (29b8a6d)."""

from __future__ import annotations

import random
import re
import statistics
from copy import deepcopy

import pytest

from ctxeval.errors import CtxevalError
from ctxeval.evals.retrieval.litm_kv import (
    GOLD_INDICES_140_KEYS,
    KV_PROMPT,
    KvExample,
    generate_kv_example,
    kv_accuracy,
    kv_prompt,
    kv_sample,
    move_gold_record,
    score_kv_answer,
)

UUID4 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def original_format(data: list) -> str:
    """prompting.py L97-102, transcribed."""
    formatted_kv_records = ""
    for index, record in enumerate(data):
        start_character = "{" if index == 0 else " "
        data_string = f'"{record[0]}": "{record[1]}"'
        end_character = ",\n" if index != len(data) - 1 else "}"
        formatted_kv_records += start_character + data_string + end_character
    return formatted_kv_records


def original_move(ordered, key, value, gold_index):
    """get_kv_responses_from_mpt.py L52-59, transcribed (records as JSON lists)."""
    ordered_kv_records = deepcopy(ordered)
    original_kv_index = ordered_kv_records.index([key, value])
    original_kv = ordered_kv_records.pop(original_kv_index)
    ordered_kv_records.insert(gold_index, original_kv)
    return ordered_kv_records


def original_accuracy(value: str, model_answer: str) -> float:
    """evaluate_kv_responses.py L30, transcribed."""
    return 1.0 if value.lower() in model_answer.lower() else 0.0


def test_the_prompt_matches_litm_own_test_byte_for_byte():
    """Catches: a trailing space after 'Corresponding value:', an unquoted key or json.dumps' layout."""
    records = [("test key1", "test value1"), ("test key2", "test value2"), ("test key3", "test value3")]
    expected = (
        "Extract the value corresponding to the specified key in the JSON object below.\n\n"
        'JSON data:\n{"test key1": "test value1",\n "test key2": "test value2",\n "test key3": "test value3"}\n\n'
        'Key: "test key2"\nCorresponding value:'
    )
    assert kv_prompt(records, "test key2") == expected


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("query_aware", [False, True])
def test_generated_prompts_match_the_transcribed_layout(seed, query_aware):
    """Catches: a missing leading space on continuation lines or the brace on its own line."""
    example = generate_kv_example(30, random.Random(seed))
    sample = kv_sample(example, 7, query_aware)
    records = [list(r) for r in move_gold_record(example, 7)]
    assert sample.formatted_kv_records == original_format(records)
    head = 'Key: "' + example.key + '"\n\n' if query_aware else ""
    assert sample.prompt == (
        "Extract the value corresponding to the specified key in the JSON object below.\n\n"
        + head
        + "JSON data:\n"
        + original_format(records)
        + '\n\nKey: "'
        + example.key
        + '"\nCorresponding value:'
    )


def test_examples_hold_unique_uuid4_pairs_and_a_gold_pair_among_them():
    """Catches: keys that are not version-4 uuid strings, a wrong count, or a gold pair not in the records."""
    for num_keys in (2, 75, 140):
        example = generate_kv_example(num_keys, random.Random(num_keys))
        keys = [k for k, _ in example.ordered_kv_records]
        assert len(keys) == num_keys == len(set(keys))
        assert all(UUID4.match(k) and UUID4.match(v) for k, v in example.ordered_kv_records)
        assert (example.key, example.value) in example.ordered_kv_records


def test_a_seed_gives_the_same_example_and_another_seed_a_different_one():
    """Catches: a generator that ignores the rng passed in (unseeded uuid4, as the original)."""
    assert generate_kv_example(20, random.Random(5)) == generate_kv_example(20, random.Random(5))
    assert generate_kv_example(20, random.Random(5)) != generate_kv_example(20, random.Random(6))


def test_the_gold_pick_is_uniform_over_positions():
    """Catches: a gold pair always drawn from the first or last position."""
    rng = random.Random(3)
    positions = []
    for _ in range(300):
        example = generate_kv_example(4, rng)
        positions.append(example.ordered_kv_records.index((example.key, example.value)))
    assert all(40 < positions.count(i) < 110 for i in range(4))


@pytest.mark.parametrize("gold_index", GOLD_INDICES_140_KEYS)
def test_the_gold_pair_moves_as_the_original_moves_it(gold_index):
    """Catches: a swap with the pair at gold_index or a reshuffle, instead of pop + insert."""
    example = generate_kv_example(140, random.Random(gold_index))
    moved = move_gold_record(example, gold_index)
    as_lists = [list(r) for r in example.ordered_kv_records]
    assert [list(r) for r in moved] == original_move(as_lists, example.key, example.value, gold_index)
    assert moved[gold_index] == (example.key, example.value)
    others = [r for r in example.ordered_kv_records if r != (example.key, example.value)]
    assert [r for r in moved if r != (example.key, example.value)] == others


def test_bad_input_is_refused_as_the_original_refuses_it():
    """Catches: a prompt built for a key that is not in the records, or one with duplicate keys."""
    with pytest.raises(CtxevalError):
        kv_prompt([("a", "1"), ("b", "2")], "c")
    with pytest.raises(CtxevalError):
        kv_prompt([("a", "1"), ("a", "2")], "a")
    with pytest.raises(CtxevalError):
        generate_kv_example(1, random.Random(0))
    with pytest.raises(CtxevalError):
        move_gold_record(KvExample([("a", "1"), ("b", "2")], "a", "1"), 2)
    assert KV_PROMPT.endswith("Corresponding value:")


ANSWERS = [
    ("ABC-def", "abc-DEF"),
    ("abc-def", " abc-def\n\nKey: x"),
    ("abc-def", "abcdef"),
    ("abc-def", "abc-de"),
    ("abc-def", ""),
    ("abc-def", '"abc-def".'),
    ("abc-def", "the value is ABC-DEF, I think"),
    ("abc-def", "abc - def"),
    ("İx", "i̇x"),
]


@pytest.mark.parametrize(("value", "answer"), ANSWERS)
def test_the_scorer_is_the_original_scorer(value, answer):
    """Catches: punctuation stripping, a first-line cut or case sensitivity the original does not have."""
    assert score_kv_answer(value, answer) == original_accuracy(value, answer)


def test_the_scorer_agrees_with_the_original_on_random_strings():
    """Catches: any rule beyond lower-cased substring on generated answers."""
    rng = random.Random(9)
    alphabet = "aAbB-. \n\"'"
    for _ in range(500):
        value = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 3)))
        answer = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))
        assert score_kv_answer(value, answer) == original_accuracy(value, answer)


def test_the_aggregate_is_a_fraction_mean():
    """Catches: an aggregate printed as a percentage."""
    scores = [1.0, 0.0, 1.0, 1.0]
    assert kv_accuracy(scores) == statistics.mean(scores) == 0.75
