"""Which prompts are wrapped in a chat or instruct format, and how (ctxeval/evals/prompts/wrapping.py): the model's
kind read from its tokenizer the same way for every task, each task wrapped as its original wraps an instruct model's
prompt, the wrapped prompts equal to what the originals' own formatting code sends, and the choice recorded.

The references below are transcribed from the originals (the files and commits are named at each one)."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from evals.retrieval.test_litm_kv import original_format  # tests/ is on pytest's pythonpath
from transformers import AutoTokenizer

from ctxeval.errors import CtxevalError
from ctxeval.evals.prompts.wrapping import chat_wrapper, has_chat_template, resolve_template, wrap, wrapper_text
from ctxeval.evals.retrieval import babilong, litm_kv
from ctxeval.evals.retrieval import suite as S
from ctxeval.evals.ruler.run import prompt_formats
from ctxeval.util.paths import TINY_MODEL_DIR

# A ChatML-style template (the form SmolLM2's tokenizer uses), written here, with the BOS first so that a tokenizer that
# adds its own BOS (the tiny one does) would get two if the wrapper kept it.
CHATML = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# mpt-30b-instruct's format as a chat template (written here; the reference is format_instruct_prompt below)
MPT_INSTRUCT = (
    "{{ 'Below is an instruction that describes a task. Write a response that appropriately completes the request.' }}"
    "\n### Instruction:\n{{ messages[0]['content'] }}{{ '\\n### Response:\\n' }}"
)  # the last newline inside an expression: Jinja drops a template's own trailing newline


def tokenizer(template: str | None = None) -> Any:
    tok = AutoTokenizer.from_pretrained(str(TINY_MODEL_DIR))
    tok.chat_template = template
    return tok


@pytest.fixture(scope="module")
def chatml() -> Any:
    return tokenizer(CHATML)


@pytest.fixture(scope="module")
def prose() -> tuple[str, str]:
    from ctxeval.data.offline import held_out_documents

    return " ".join(" ".join(text.split()) for _, text in held_out_documents()), "pydoc"


# --- lost-in-the-middle 29b8a6d ---


def original_get_kv_retrieval_prompt(data: list[tuple[str, str]], key: str) -> str:
    """src/lost_in_the_middle/prompting.py get_kv_retrieval_prompt (29b8a6d), the checks left out;
    prompts/kv_retrieval.prompt with its final newline stripped as the function strips it; the records formatted by
    test_litm_kv's transcription of L97-102."""
    prompt_template = (
        "Extract the value corresponding to the specified key in the JSON object below.\n\n"
        "JSON data:\n{formatted_kv_records}\n\n"
        'Key: "{key}"\n'
        "Corresponding value:"
    )
    return prompt_template.format(formatted_kv_records=original_format(data), key=key)


def format_instruct_prompt(instruction: str) -> str:
    """scripts/get_kv_responses_from_mpt.py format_instruct_prompt (29b8a6d): applied when "instruct" is in the
    model's name (mosaicml/mpt-30b-instruct)."""
    INSTRUCTION_KEY = "### Instruction:"
    RESPONSE_KEY = "### Response:"
    INTRO_BLURB = (
        "Below is an instruction that describes a task. Write a response that appropriately completes the request."
    )
    PROMPT_FOR_GENERATION = "{intro}\n{instruction_key}\n{instruction}\n{response_key}\n".format(
        intro=INTRO_BLURB,
        instruction_key=INSTRUCTION_KEY,
        instruction=instruction,
        response_key=RESPONSE_KEY,
    )
    return PROMPT_FOR_GENERATION


def format_chat_prompt(input: str) -> str:
    """scripts/get_kv_responses_from_longchat.py format_chat_prompt (29b8a6d): fastchat's
    get_conversation_template("vicuna"), the user turn appended, then an empty assistant turn, get_prompt(). The
    conversation is lm-sys/FastChat's vicuna_v1.1 (fastchat/conversation.py, 0e6d3e4b): its system message, roles
    USER / ASSISTANT, SeparatorStyle.ADD_COLON_TWO with sep " " and sep2 "</s>", whose get_prompt is below."""
    system_prompt = (
        "A chat between a curious user and an artificial intelligence assistant. "
        "The assistant gives helpful, detailed, and polite answers to the user's questions."
    )
    messages = [("USER", input), ("ASSISTANT", None)]
    seps = [" ", "</s>"]
    ret = system_prompt + seps[0]
    for i, (role, message) in enumerate(messages):
        if message:
            ret += role + ": " + message + seps[i % 2]
        else:
            ret += role + ":"
    return ret


def litm_reference(sample: Any, length: int, number: int, format_prompt: Any) -> str:
    """What get_kv_responses_from_*.py sends for the sample's draws: the records, the gold pair moved to its index
    (L52-59 of get_kv_responses_from_mpt.py), the prompt, then the model's format."""
    example = litm_kv.generate_kv_example(sample.size, random.Random(S.sample_seed(42, "litm:kv", length, number)))
    ordered_kv_records = list(example.ordered_kv_records)
    original_kv = ordered_kv_records.pop(ordered_kv_records.index((example.key, example.value)))
    ordered_kv_records.insert(round(sample.depth / 100 * (sample.size - 1)), original_kv)
    return format_prompt(original_get_kv_retrieval_prompt(ordered_kv_records, example.key))


@pytest.mark.parametrize(
    "template,chat_template,format_prompt",
    [
        ("vicuna-chat", None, format_chat_prompt),  # longchat: RULER's vicuna-chat is fastchat's vicuna_v1.1
        ("chat", MPT_INSTRUCT, format_instruct_prompt),  # mpt-30b-instruct: the tokenizer's own format
        ("base", MPT_INSTRUCT, lambda prompt: prompt),  # a base model's prompt, explicitly bare
    ],
)
def test_litm_prompts_equal_lost_in_the_middles_instruct_and_chat_formats(template, chat_template, format_prompt):
    """Catches the wrapper left off litm:kv, put around part of its prompt (the records alone), a template's text
    changed on the way (a stripped newline, a space), or the size search blind to the wrapper (a prompt then runs
    past its length at some of these lengths)."""
    tok = tokenizer(chat_template)
    smaller = False
    for length in range(1024, 1184, 16):  # a pair is ~80 tiny tokens: the wrapper's ~40 decide at about half of them
        samples = S.generate_suite("litm:kv", length, 1, tok, 42, (0.0, 100.0), None, None, template)
        for sample in samples:
            assert sample.input == litm_reference(sample, length, 0, format_prompt)
            assert sample.length == len(tok.tokenize(sample.input)) + litm_kv.MAX_NEW_TOKENS <= length
        bare = S.generate_suite("litm:kv", length, 1, tok, 42, (0.0,), None, None, "base")[0]
        smaller |= samples[0].size < bare.size
    assert smaller == (template != "base")  # the wrapper's tokens cost key-value pairs


# --- BABILong 7a6efee ---


def babilong_model_inputs(tok: Any, input_text: str, use_chat_template: bool) -> list[int]:
    """scripts/run_model_on_babilong.py (7a6efee), the local-model branch: with --use_chat_template one user turn
    through apply_chat_template(add_generation_prompt=True, return_tensors='pt'), else tokenizer(input_text,
    add_special_tokens=True)."""
    if use_chat_template:
        input_text = [{"role": "user", "content": input_text}]
        model_inputs = tok.apply_chat_template(input_text, add_generation_prompt=True, return_tensors="pt")
        ids = model_inputs["input_ids"] if "input_ids" in model_inputs else model_inputs  # transformers 5: a dict
    else:
        ids = tok(input_text, return_tensors="pt", add_special_tokens=True)["input_ids"]
    return ids[0].tolist()


@pytest.mark.parametrize("task", babilong.GENERATED_TASKS)
def test_facts_prompts_tokenize_as_babilong_tokenizes_its_chat_input(chatml, prose, task):
    """The ids ctxeval's runner makes of a chat-wrapped facts prompt (the tokenizer's defaults) equal BABILong's
    apply_chat_template ids of the bare prompt. Catches the template's BOS kept in the wrapper (two BOS: the tiny
    tokenizer adds its own), the generation prompt left out, or the prompt wrapped twice."""
    chat = S.generate_suite(f"facts:{task}", 1024, 2, chatml, 42, background=prose, template="chat")
    wrapper = chat_wrapper(chatml)
    pre, _, post = wrapper.partition("{task_template}")
    for sample in chat:
        assert sample.input.startswith(pre) and sample.input.endswith(post)
        bare_prompt = sample.input[len(pre) : len(sample.input) - len(post)]
        assert bare_prompt.startswith(babilong.PROMPTS[task]["instruction"]) and "<|im_start|>" not in bare_prompt
        assert chatml(sample.input)["input_ids"] == babilong_model_inputs(chatml, bare_prompt, True)
        assert sample.length == len(chatml.tokenize(sample.input)) + babilong.MAX_NEW_TOKENS <= 1024
    bare = S.generate_suite(f"facts:{task}", 1024, 2, chatml, 42, background=prose, template="base")
    for sample in bare:
        assert chatml(sample.input)["input_ids"] == babilong_model_inputs(chatml, sample.input, False)


def test_facts_question_is_read_back_through_the_wrapper(chatml, prose):
    """The scorer leaves out labels the question names (compare_answers): with the wrapper's end after the question,
    the question must still be bAbI's. Catches reading everything after "Question: " (the template's tail)."""
    sample = S.generate_suite("facts:qa1", 1024, 1, chatml, 42, background=prose, template="chat")[0]
    assert sample.input.endswith("<|im_start|>assistant\n")
    question = S.facts_question(sample.input)
    assert question.startswith("Where is ") and question.endswith("?") and "<|im" not in question
    bare = S.generate_suite("facts:qa1", 1024, 1, chatml, 42, background=prose, template="base")[0]
    assert question == S.facts_question(bare.input) == bare.input.rpartition("Question: ")[2]
    right = f"The most recent location of X is {sample.outputs[0]}."
    assert S.score_reply("facts:qa1", right, sample) == 1.0


# --- the model's kind and the per-task choice ---


def test_the_kind_is_read_from_the_tokenizer_and_an_explicit_template_overrides_it(chatml):
    """Catches auto ignoring the tokenizer (always base or always chat), chat accepted without a chat template, or
    an explicit base overridden by the tokenizer's template."""
    plain = tokenizer()
    assert not has_chat_template(plain) and has_chat_template(chatml)
    assert resolve_template("auto", plain) == "base" and resolve_template("auto", chatml) == "chat"
    assert resolve_template("base", chatml) == "base" and resolve_template("meta-chat", plain) == "meta-chat"
    with pytest.raises(CtxevalError, match="--template chat, but this model's tokenizer has no chat template"):
        resolve_template("chat", plain)
    with pytest.raises(CtxevalError, match="unknown RULER model template 'chatml'"):
        resolve_template("chatml", chatml)
    assert wrapper_text("auto", plain) == "{task_template}"
    assert wrapper_text("auto", chatml) == "<|im_start|>user\n{task_template}<|im_end|>\n<|im_start|>assistant\n"
    assert wrap("Q?", wrapper_text("meta-chat", plain)) == "[INST] Q? [/INST]"


def test_a_chat_template_with_braces_around_the_turn_is_refused():
    """RULER's slot is a format string: a literal brace around the turn would break it. Catches it passed on."""
    with pytest.raises(CtxevalError, match="writes '\\{' or '\\}' around the user turn"):
        chat_wrapper(tokenizer("{{ '{' }}{{ messages[0]['content'] }}"))


def test_each_task_takes_its_originals_format_for_an_instruct_model():
    """RULER's tasks, litm:kv and facts:* take the run's template; helmet:json_kv and infbench:* stay bare (HELMET's
    recall configs and InfiniteBench's open-model scripts send instruct models the bare prompt). Catches a task
    wrapped against its original, or one left bare."""
    tasks = ("niah_single_1", "litm:kv", "facts:qa1", "facts:qa2", "helmet:json_kv", *S.SUITE_TASKS)
    chat = prompt_formats(tasks, "chat")
    assert {t for t, f in chat.items() if f == "chat"} == {"niah_single_1", "litm:kv", "facts:qa1", "facts:qa2"}
    assert all(f == "base" for t, f in chat.items() if t.startswith(("helmet:", "infbench:")))
    assert set(prompt_formats(tasks, "base").values()) == {"base"}
    assert prompt_formats(("vt", "litm:kv"), "chat", samples_from=True) == {"vt": "file", "litm:kv": "chat"}
    assert {t for t, task in S.SUITE_TASKS.items() if task.wraps_instruct} == {"litm:kv", "facts:qa1", "facts:qa2"}
    assert all(task.instruct for task in S.SUITE_TASKS.values())  # each says what its original does


def test_released_litm_file_is_wrapped_as_lost_in_the_middle_wraps_it(tmp_path):
    """--samples-from with LITM's own file: the prompt its script builds for mpt-30b-instruct. Catches the released
    prompts left bare while the generated ones are wrapped."""
    from ctxeval.evals.retrieval.originals import original_samples

    records = [[f"k{i}", f"v{i}"] for i in range(5)]
    line = json.dumps({"ordered_kv_records": records, "key": "k3", "value": "v3"})
    (tmp_path / "kv-retrieval-5_keys.jsonl").write_text(line + "\n")
    wrapper = S.task_wrapper(S.SUITE_TASKS["litm:kv"], "chat", tokenizer(MPT_INSTRUCT))
    sample = original_samples("litm:kv", tmp_path, 1024, 1, (0.0,), wrapper)[0]
    moved = [tuple(records[3])] + [tuple(r) for r in records if r[0] != "k3"]
    assert sample.input == format_instruct_prompt(original_get_kv_retrieval_prompt(moved, "k3"))


def test_a_run_records_the_template_in_run_json_and_every_row(tmp_path):
    """`ctxeval ruler` on a tiny model whose tokenizer has a chat template, --template left at auto: litm:kv and vt
    wrapped, helmet:json_kv bare, each row naming its task's format, run.json the resolved template and the per-task
    formats. Catches auto resolved before (or without) the tokenizer, a row or run.json without the choice, or
    helmet:json_kv wrapped."""
    from typer.testing import CliRunner

    from ctxeval.cli import app

    model = tmp_path / "tiny-chat"
    shutil.copytree(TINY_MODEL_DIR, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": CHATML}))
    out = tmp_path / "run"
    args = ["ruler", "--model", str(model), "--tasks", "litm:kv,helmet:json_kv,vt", "--lengths", "1k"]
    args += ["--samples", "1", "--depths", "50", "--device", "cpu", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert {r["ruler_task"]: r["template"] for r in rows} == {"litm:kv": "chat", "helmet:json_kv": "base", "vt": "chat"}
    record = json.loads((out / "run.json").read_text())
    assert record["spec"]["template"] == "chat" and record["protocol"]["template_option"] == "auto"
    assert record["protocol"]["prompt_format"] == {"litm:kv": "chat", "helmet:json_kv": "base", "vt": "chat"}
    assert str(tmp_path) not in json.dumps(record["protocol"]["prompt_format"])
    for task, wrapped in (("litm:kv", True), ("helmet:json_kv", False), ("vt", True)):
        sample = json.loads((out / "samples" / "1024" / task / "validation.jsonl").read_text().splitlines()[0])
        assert sample["input"].startswith("<|im_start|>user\n") == wrapped


def test_template_chat_without_a_chat_template_is_refused_before_the_run_directory(tmp_path):
    """Catches `--template chat` on a tokenizer without one running bare, or failing after the run directory exists."""
    from typer.testing import CliRunner

    from ctxeval.cli import app

    out = tmp_path / "run"
    args = ["ruler", "--model", "tiny", "--tasks", "litm:kv", "--lengths", "1k", "--samples", "1"]
    result = CliRunner().invoke(app, [*args, "--template", "chat", "--device", "cpu", "--out", str(out)])
    assert result.exit_code == 2
    assert "--template chat, but this model's tokenizer has no chat template" in result.output
    assert not Path(out).exists()
