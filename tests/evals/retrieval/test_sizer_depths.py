"""The retrieval sizer (evals/retrieval/suite.py's Sizer) sizes one sample for every depth: the same draws at each
depth differ by a token or two (where the gold pair or needle lands changes how the text tokenizes), so the size must
fit the longest of them. A prompt past its asked length must be impossible."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import AutoTokenizer

from ctxeval.evals.retrieval import suite as S
from ctxeval.util.paths import TINY_MODEL_DIR


@pytest.fixture(scope="module")
def tok() -> Any:
    return AutoTokenizer.from_pretrained(str(TINY_MODEL_DIR))


def count(tok: Any, text: str) -> int:
    return len(tok.tokenize(text))


@pytest.mark.parametrize(
    "task,lengths",
    [
        ("helmet:json_kv", range(1120, 1150)),  # with the shortest depth's prompt: 1124 -> 1135, 1148 -> 1152 tokens
        ("infbench:kv_retrieval", range(1210, 1225)),  # 1217 -> 1218
    ],
)
def test_no_prompt_at_the_default_depths_is_longer_than_its_length(tok: Any, task: str, lengths: range) -> None:
    """Every length of a range, the 5 default depths, 2 samples: each prompt plus its generation budget fits its
    length, and the depths' prompts of one sample do differ (else this test could not fail). Bug caught: the sizer
    taking the shortest depth's prompt (`min` for `max` over depths): helmet:json_kv at 1148 tokens then gives
    1152-token prompts."""
    spec = S.SUITE_TASKS[task]
    spreads = []
    for length in lengths:
        samples = S.generate_suite(task, length, 2, tok, 42)
        assert len(samples) == 2 * len(S.DEFAULT_DEPTHS)
        for s in samples:
            assert s.length == count(tok, s.input) + spec.tokens_to_generate <= length, (length, s.depth)
        for number in range(2):
            tokens = [s.length for s in samples if s.index % 2 == number]
            spreads.append(max(tokens) - min(tokens))
    assert max(spreads) >= 2  # the depths differ: the longest one decides the size
