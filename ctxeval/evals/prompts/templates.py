"""The prompt's model templates: RULER's scripts/data/template.py, verbatim, and ctxeval's `auto` and `chat`
(`ctxeval ruler --template`), which wrapping.py resolves with the tokenizer."""

from __future__ import annotations

from ...errors import CtxevalError

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
# ctxeval's own two (wrapping.py resolves them with the tokenizer): `chat` the tokenizer's chat template,
# `auto` (the command line's default) `chat` for a tokenizer with one, else `base`
CHAT_TEMPLATE = "chat"
AUTO_TEMPLATE = "auto"
TEMPLATE_NAMES = (AUTO_TEMPLATE, CHAT_TEMPLATE, *MODEL_TEMPLATES)


def check_template(name: str) -> str:
    if name not in TEMPLATE_NAMES:
        raise CtxevalError(
            f"unknown RULER model template '{name}'; templates (RULER's template.py): {', '.join(MODEL_TEMPLATES)}; "
            "ctxeval's: auto, chat (the tokenizer's chat template)"
        )
    return name
