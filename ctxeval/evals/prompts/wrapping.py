"""How a prompt reaches the model: bare, or wrapped in a chat or instruct format (`ctxeval ruler --template`).

One choice per run, decided once: `auto` (the default) reads the model's kind from its tokenizer, the rule
`ctxeval needle --chat-template auto` uses: a tokenizer with a chat template is an instruct/chat model, one without
a base model. `base`, `chat` (the tokenizer's own chat template) and RULER's named templates (template.py) override
it. Each task then does what its original does for that kind of model (`wraps_instruct` of the suite's tasks):

- RULER's tasks: prepare.py wraps every prompt in the model template its run names (`base` for base models, a chat
  template for chat models); `chat` is the model's own chat template in place of RULER's per-family strings.
- litm:kv: lost-in-the-middle 29b8a6d wraps an instruct or chat model's prompt in that model's own format
  (get_kv_responses_from_mpt.py `format_instruct_prompt` for mpt-30b-instruct; get_kv_responses_from_longchat.py
  `format_chat_prompt`, fastchat's vicuna conversation, for longchat; get_qa_responses_from_llama_2.py Llama 2
  chat's `[INST] <<SYS>>` format), a base model's bare.
- facts:qa1/qa2: BABILong 7a6efee's run_model_on_babilong.py --use_chat_template (its scripts set it for instruct
  models): `apply_chat_template([{'role': 'user', 'content': input_text}], add_generation_prompt=True)`.
- helmet:json_kv and infbench:*: bare for every model. HELMET runs json_kv with use_chat_template: false
  (configs/recall*.yaml) for instruct models too; InfiniteBench sends its open models' prompts (yarn-mistral's
  templates, the chat model chatglm3 included: eval_chatglm.py) unwrapped.

A chat wrapper is the template rendered around one user turn with the generation prompt added, as a string with one
`{task_template}` slot (RULER's form), so that a prompt's size search counts the wrapper's tokens. The prompt is
tokenized with the tokenizer's defaults, as every ctxeval prompt: where the tokenizer adds a BOS itself, the BOS the
rendered template starts with is dropped from the wrapper, so the ids equal `apply_chat_template(..., tokenize=True)`.
"""

from __future__ import annotations

from typing import Any

from ...errors import CtxevalError
from .templates import AUTO_TEMPLATE, BASE_TEMPLATE, CHAT_TEMPLATE, MODEL_TEMPLATES, check_template

SLOT = "{task_template}"
MARKER = "\u2063CTXEVAL\u2063"  # rendered as the user turn, then replaced by the slot


def has_chat_template(tokenizer: Any) -> bool:
    """The model's kind: instruct/chat when its tokenizer has a chat template (needle's --chat-template auto)."""
    return bool(getattr(tokenizer, "chat_template", None))


def resolve_template(name: str, tokenizer: Any) -> str:
    """The run's template: `auto` decided by the model's kind (`chat` or `base`); `chat` refused, in one line, for a
    tokenizer without a chat template; any other name as given."""
    check_template(name)
    if name == AUTO_TEMPLATE:
        return CHAT_TEMPLATE if has_chat_template(tokenizer) else BASE_TEMPLATE
    if name == CHAT_TEMPLATE and not has_chat_template(tokenizer):
        raise CtxevalError(
            "--template chat, but this model's tokenizer has no chat template; use --template auto or base, or one "
            "of RULER's model templates"
        )
    return name


def adds_bos(tokenizer: Any) -> bool:
    """Whether tokenizing with the tokenizer's defaults puts its BOS first."""
    bos = getattr(tokenizer, "bos_token_id", None)
    return bos is not None and list(tokenizer("a")["input_ids"][:1]) == [bos]


def chat_wrapper(tokenizer: Any) -> str:
    """The tokenizer's chat template around one user turn, generation prompt added, with a `{task_template}` slot in
    place of the turn's text (the BOS it starts with dropped where the tokenizer adds one)."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": MARKER}], tokenize=False, add_generation_prompt=True
    )
    if not isinstance(text, str) or text.count(MARKER) != 1:
        raise CtxevalError("the tokenizer's chat template does not render one user turn verbatim; use --template base")
    pre, _, post = text.partition(MARKER)
    bos = getattr(tokenizer, "bos_token", None)
    if bos and pre.startswith(bos) and adds_bos(tokenizer):
        pre = pre[len(bos) :]
    if any(brace in pre + post for brace in "{}"):
        raise CtxevalError(
            "the tokenizer's chat template writes '{' or '}' around the user turn, which RULER's template slot cannot "
            "hold; use --template base or one of RULER's model templates"
        )
    return pre + SLOT + post


def wrapper_text(name: str, tokenizer: Any) -> str:
    """The wrapper of template `name` (resolved first) as RULER's template.py writes one: a string with one
    `{task_template}` slot."""
    resolved = resolve_template(name, tokenizer)
    return chat_wrapper(tokenizer) if resolved == CHAT_TEMPLATE else MODEL_TEMPLATES[resolved]


def wrap(prompt: str, wrapper: str) -> str:
    """`prompt` in `wrapper`'s slot (prepare.py's `model_template.format(task_template=...)`)."""
    return wrapper.format(task_template=prompt)


def task_format(wraps_instruct: bool, resolved: str) -> str:
    """The format a task's prompts get under the run's resolved template: the template where the task's original
    wraps an instruct model's prompt, else `base`."""
    return resolved if wraps_instruct else BASE_TEMPLATE
