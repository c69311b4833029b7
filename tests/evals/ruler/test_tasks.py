"""evals/ruler/tasks.py: a RULER sample's record and the task templates."""

from __future__ import annotations

import pytest


def test_a_ruler_sample_record_is_rulers_jsonl_line():
    from ctxeval.evals.ruler.tasks import RulerSample

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


def test_templates_are_checked_by_name_and_wrap_the_task_template_before_the_answer_prefix():
    from ctxeval.errors import CtxevalError
    from ctxeval.evals.ruler.tasks import FAMILIES, MODEL_TEMPLATES, TASKS, check_template, split_prefix, task_template

    assert check_template("meta-chat") == "meta-chat"
    with pytest.raises(CtxevalError) as exc:
        check_template("llama")
    assert str(exc.value) == (
        "unknown RULER model template 'llama'; templates (RULER's template.py): "
        + ", ".join(MODEL_TEMPLATES)
        + "; ctxeval's: auto, chat (the tokenizer's chat template)"
    )
    vt = FAMILIES["variable_tracking"]
    assert task_template(TASKS["vt"]) == vt.template + vt.answer_prefix
    assert task_template(TASKS["vt"], "meta-chat") == f"[INST] {vt.template} [/INST]{vt.answer_prefix}"
    # the answer prefix is found by its first 10 characters, the last occurrence
    text = "a Answer: b Answer: c" + " Answer: the end"
    qa = FAMILIES["qa"]
    assert qa.answer_prefix == " Answer:"
    assert split_prefix(text, qa) == ("a Answer: b Answer: c", " Answer: the end")
    long = FAMILIES["niah"]
    head = long.answer_prefix[:10]
    assert split_prefix(f"x{head}y{head} and more", long) == (f"x{head}y", f"{head} and more")
