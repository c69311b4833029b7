"""evals/prompts/sample.py: the sample record is RULER's JSONL line."""

from __future__ import annotations


def test_a_ruler_sample_record_is_rulers_jsonl_line():
    from ctxeval.evals.prompts.sample import RulerSample

    sample = RulerSample(3, "the input", ["a", "b"], 120, " Answer:", 17)
    assert sample.record() == {
        "index": 3,
        "input": "the input",
        "outputs": ["a", "b"],
        "length": 120,
        "length_w_model_temp": 120,
        "answer_prefix": " Answer:",
        "token_position_answer": 17,
    }
    plain = RulerSample(0, "in", ["x"], 5, "", None).record()
    assert plain == {
        "index": 0,
        "input": "in",
        "outputs": ["x"],
        "length": 5,
        "length_w_model_temp": 5,
        "answer_prefix": "",
    }
    assert RulerSample(0, "in", ["x"], 5, "", 0).record()["token_position_answer"] == 0  # position 0 is kept
    assert sample.prompt == "the input Answer:"
