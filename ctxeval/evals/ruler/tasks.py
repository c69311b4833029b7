"""RULER's task table: the model templates (template.py), the task families (data/synthetic/constants.py), the
tasks (scripts/synthetic.yaml), the sample record RULER's JSONL holds, and how prepare.py puts a prompt's template
together and splits its answer prefix off. No randomness and no files: every other RULER module builds on this one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...errors import CtxevalError

RULER_SEED = 42  # prepare.py's --random_seed default
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


# RULER's scripts/data/template.py, verbatim: prepare.py formats `{task_template}` with the task's template, then
# appends the answer prefix.
MODEL_TEMPLATES: dict[str, str] = {
    "base": "{task_template}",
    "meta-chat": "[INST] {task_template} [/INST]",
    "vicuna-chat": "A chat between a curious user and an artificial intelligence assistant. The assistant gives "
    "helpful, detailed, and polite answers to the user's questions. USER: {task_template} ASSISTANT:",
    "lwm-chat": "You are a helpful assistant. USER: {task_template} ASSISTANT: ",
    "command-r-chat": "<BOS_TOKEN><|START_OF_TURN_TOKEN|><|USER_TOKEN|>{task_template}<|END_OF_TURN_TOKEN|>"
    "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
    "chatglm-chat": "[gMASK]sop<|user|> \n {task_template}<|assistant|> \n ",
    "RWKV": "User: hi\n\nAssistant: Hi. I am your assistant and I will provide expert full response in full details. "
    "Please feel free to ask any question and I will always answer it\n\nUser: {task_template}\n\nAssistant:",
    "Phi3": "<|user|>\n{task_template}<|end|>\n<|assistant|>\n",
    "meta-llama3": "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n{task_template}<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "jamba": "<|startoftext|><|bom|><|system|> <|eom|><|bom|><|user|> {task_template}<|eom|><|bom|><|assistant|>",
    "nemotron5-instruct": "<SPECIAL_10>System\n\n<SPECIAL_11>User\n{task_template}\n<SPECIAL_11>Assistant\n",
}
BASE_TEMPLATE = "base"
# ctxeval's own two (evals.retrieval.wrapping resolves them with the tokenizer): `chat` the tokenizer's chat template,
# `auto` (the command line's default) `chat` for a tokenizer with one, else `base`
CHAT_TEMPLATE = "chat"
AUTO_TEMPLATE = "auto"
TEMPLATE_NAMES = (AUTO_TEMPLATE, CHAT_TEMPLATE, *MODEL_TEMPLATES)


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


@dataclass(frozen=True)
class RulerSample:
    """One prompt in RULER's JSONL format (`input` ends before the answer prefix; the model reads both)."""

    index: int
    input: str
    outputs: list[str]
    length: int  # prompt tokens (answer prefix included, no special tokens) + tokens_to_generate
    answer_prefix: str
    token_position_answer: int | None = None  # niah only: see answer_token_position
    depth: float | None = None  # where the answer sits, 0 (first) to 100 (last), for tasks with a depth axis
    size: int | None = None  # the generator's size: key-value pairs, noise lines, list items or background tokens

    @property
    def prompt(self) -> str:
        """What the model reads: input + answer prefix (call_api.py)."""
        return self.input + self.answer_prefix

    def record(self) -> dict[str, Any]:
        out = {
            "index": self.index,
            "input": self.input,
            "outputs": list(self.outputs),
            "length": self.length,
            "length_w_model_temp": self.length,
            "answer_prefix": self.answer_prefix,
        }
        if self.token_position_answer is not None:
            out["token_position_answer"] = self.token_position_answer
        if self.depth is not None:
            out["depth"] = self.depth
        if self.size is not None:
            out["size"] = self.size
        return out


def check_template(name: str) -> str:
    if name not in TEMPLATE_NAMES:
        raise CtxevalError(
            f"unknown RULER model template '{name}'; templates (RULER's template.py): {', '.join(MODEL_TEMPLATES)}; "
            "ctxeval's: auto, chat (the tokenizer's chat template)"
        )
    return name


def task_template(task: RulerTask, model_template: str = "base") -> str:
    """prepare.py: the model template around the task template, then the answer prefix. `model_template` is one of
    RULER's names or a wrapper with a `{task_template}` slot (evals.retrieval.wrapping.wrapper_text: `chat`)."""
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
