"""HELMET json_kv's demos (evals/retrieval/helmet_json_kv.py): the two `Key: ... Corresponding value: ...` examples
before the question are other pairs of the same object, never the asked one, whatever the draw."""

from __future__ import annotations

import json
import random
import re

import pytest

from ctxeval.evals.retrieval import suite as S
from ctxeval.evals.retrieval.helmet_json_kv import generate_json_kv_sample

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


@pytest.mark.parametrize("num_kvs", [3, 5, 50])
def test_no_demo_is_the_asked_pair_over_many_seeds(num_kvs: int) -> None:
    """200 seeds x 5 depths: each sample's demos are `shots` distinct pairs of its object, none of them the gold pair
    (with 3 pairs, a draw over every pair would pick the gold one 2 times in 3). Bug caught: the `i != gold_index`
    guard dropped from the demo draw (4 of 200 seeded samples of 50 pairs then give the answer away)."""
    for seed in range(200):
        for depth in DEPTHS:
            sample = generate_json_kv_sample(num_kvs, depth, random.Random(seed))
            pairs = json.loads(sample.context.split("\n", 1)[1])
            keys = [key for key, _ in sample.demos]
            assert sample.question not in keys, (seed, depth)
            assert len(set(keys)) == len(keys) == 2
            assert all(pairs[key] == value for key, value in sample.demos)


def test_the_prompt_ctxeval_ruler_runs_never_shows_the_asked_key_as_a_demo() -> None:
    """The same through the suite's build (the prompt text that is measured): the asked key appears once in the JSON
    object and once after the last `Key:`, never in a demo."""
    build = S.SUITE_TASKS["helmet:json_kv"].build
    for seed in range(100):
        for depth in (0.0, 50.0, 100.0):
            text = build(random.Random(seed), 4, depth, None).text
            *demos, question = re.findall(r"^Key: (\S+)$", text, flags=re.MULTILINE)
            assert len(demos) == 2 and question not in demos
            assert text.count(question) == 2
