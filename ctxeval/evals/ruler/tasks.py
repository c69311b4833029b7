"""RULER's task table: the task families (data/synthetic/constants.py), the tasks (scripts/synthetic.yaml), and how
prepare.py puts a prompt's template together and splits its answer prefix off. The model templates (template.py) and
the sample record RULER's JSONL holds are evals.prompts', shared with the retrieval suites. No randomness and no
files: every other RULER module builds on this one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...errors import CtxevalError
from ..prompts.templates import MODEL_TEMPLATES, check_template

RULER_SEED = 42  # prepare.py's --random_seed default
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


@dataclass(frozen=True)
class Family:
    """RULER's data/synthetic/constants.py entry of a task family."""

    tokens_to_generate: int
    template: str
    answer_prefix: str
    metric: str  # string_match_all | string_match_part


FAMILIES: dict[str, Family] = {
    "niah": Family(
        128,
        "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will "
        "quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} "
        "for {query} mentioned in the provided text?",
        " The special magic {type_needle_v} for {query} mentioned in the provided text are",
        "string_match_all",
    ),
    "variable_tracking": Family(
        30,
        "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
        "Question: Find all variables that are assigned the value {query} in the text above.",
        " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
        "assigned the value {query}, they are: ",
        "string_match_all",
    ),
    "common_words_extraction": Family(
        120,
        "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones "
        "that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?",
        " Answer: The top 10 words that appear most often in the list are:",
        "string_match_all",
    ),
    "freq_words_extraction": Family(
        50,
        "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
        "appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. "
        "What are the three most frequently appeared words in the above coded text?",
        " Answer: According to the coded text above, the three most frequently appeared words are:",
        "string_match_all",
    ),
    "qa": Family(
        32,
        "Answer the question based on the given documents. Only give me the answer and do not output any other "
        "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given "
        "documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}",
        " Answer:",
        "string_match_part",
    ),
}


@dataclass(frozen=True)
class RulerTask:
    """One entry of RULER's scripts/synthetic.yaml."""

    name: str
    family: str
    args: dict[str, Any] = field(default_factory=dict)


def _niah(name: str, haystack: str, k: str, v: str, nk: int = 1, nv: int = 1, nq: int = 1) -> RulerTask:
    return RulerTask(
        name,
        "niah",
        {
            "type_haystack": haystack,
            "type_needle_k": k,
            "type_needle_v": v,
            "num_needle_k": nk,
            "num_needle_v": nv,
            "num_needle_q": nq,
        },
    )


TASKS: dict[str, RulerTask] = {
    t.name: t
    for t in [
        _niah("niah_single_1", "noise", "words", "numbers"),
        _niah("niah_single_2", "essay", "words", "numbers"),
        _niah("niah_single_3", "essay", "words", "uuids"),
        _niah("niah_multikey_1", "essay", "words", "numbers", nk=4),
        _niah("niah_multikey_2", "needle", "words", "numbers"),
        _niah("niah_multikey_3", "needle", "uuids", "uuids"),
        _niah("niah_multivalue", "essay", "words", "numbers", nv=4),
        _niah("niah_multiquery", "essay", "words", "numbers", nq=4),
        RulerTask("vt", "variable_tracking", {"type_haystack": "noise", "num_chains": 1, "num_hops": 4}),
        RulerTask("cwe", "common_words_extraction", {"freq_cw": 30, "freq_ucw": 3, "num_cw": 10}),
        RulerTask("fwe", "freq_words_extraction", {"alpha": 2.0}),
        RulerTask("qa_1", "qa", {"dataset": "squad"}),
        RulerTask("qa_2", "qa", {"dataset": "hotpotqa"}),
    ]
}
OFFLINE_TASKS = tuple(name for name, t in TASKS.items() if t.family != "qa")  # qa needs the datasets' files


def task_template(task: RulerTask, model_template: str = "base") -> str:
    """prepare.py: the model template around the task template, then the answer prefix. `model_template` is one of
    RULER's names or a wrapper with a `{task_template}` slot (evals.prompts.wrapping.wrapper_text: `chat`)."""
    family = FAMILIES[task.family]
    if "{task_template}" in model_template:
        wrapper = model_template
    elif check_template(model_template) in MODEL_TEMPLATES:
        wrapper = MODEL_TEMPLATES[model_template]
    else:
        raise CtxevalError(f"--template {model_template} must be resolved with the tokenizer before prompts are made")
    return wrapper.format(task_template=family.template) + family.answer_prefix


def split_prefix(text: str, family: Family) -> tuple[str, str]:
    """RULER locates the answer prefix by its first 10 characters, from the right."""
    at = text.rfind(family.answer_prefix[:10])
    return text[:at], text[at:]
