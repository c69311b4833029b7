"""evals/ruler/tasks.py: the task templates in a model template, and the answer prefix split off."""

from __future__ import annotations


def test_a_template_wraps_the_task_template_before_the_answer_prefix():
    from ctxeval.evals.ruler.tasks import FAMILIES, TASKS, split_prefix, task_template

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
