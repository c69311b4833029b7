"""Greedy generation as every generating evaluation runs it (needle, passkey, RULER): the ids that end a reply, a
plain greedy GenerationConfig that a checkpoint's own generation settings cannot change, the one transformers
`generate` call (a length-dependent RoPE frozen for the whole reply) and the one stream of replies of the vLLM backend
(models.vllm_engine), whose handle generates instead of transformers."""

from __future__ import annotations

import time
from typing import Any, Iterator


def stop_ids(tokenizer: Any, model: Any = None) -> list[int]:
    """Every token that ends a reply: the tokenizer's EOS and each EOS id of the checkpoint's generation config
    (Llama 3 lists <|end_of_text|>, <|eom_id|> and <|eot_id|>; stopping on the first alone lets an answer run on)."""
    ids: list[int] = []
    shipped = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (tokenizer.eos_token_id, shipped):
        for i in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(i, int) and i not in ids:
                ids.append(i)
    return ids


def greedy_config(tokenizer: Any, max_new_tokens: int, model: Any = None) -> Any:
    """Plain greedy decoding: a fresh GenerationConfig, so that a checkpoint's own generation_config
    (repetition_penalty, no_repeat_ngram_size, sampling) cannot change the answer; it stops on every stop id."""
    from transformers import GenerationConfig

    eos = stop_ids(tokenizer, model)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos[0] if eos else None)
    return GenerationConfig(
        do_sample=False, num_beams=1, max_new_tokens=max_new_tokens, pad_token_id=pad, eos_token_id=eos or None
    )


def until_stop(new_ids: list[int], stops: Any) -> list[int]:
    """The new tokens up to the first stop id (a finished row of a batch is padded after it)."""
    stops = set(stops)
    return new_ids[: next((i for i, t in enumerate(new_ids) if t in stops), len(new_ids))]


def streams(handle: Any) -> bool:
    """Whether an applied method's handle generates itself (vLLM: `replies` streams finished replies)."""
    return callable(getattr(handle, "replies", None))


def greedy_replies(
    model: Any,
    tokenizer: Any,
    input_ids: Any,
    attention_mask: Any,
    max_new_tokens: int,
    handle: Any = None,
    frozen_length: int | None = None,
) -> list[list[int]]:
    """Greedy replies to a batch of prompts: each row's new token ids (a row that stopped early is padded after its
    stop id). input_ids, attention_mask: (B, prompt tokens), left-padded where the prompts differ in length. Under a
    length-dependent method (`handle`) the RoPE is frozen at `frozen_length` for the whole call, so that cached keys
    and new queries share one RoPE."""
    frozen = handle is not None and frozen_length is not None and getattr(handle.method, "length_dependent", False)
    if frozen:
        handle.freeze_length(frozen_length)
    try:
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=greedy_config(tokenizer, max_new_tokens, model),
        )  # (B, prompt tokens + new tokens)
    finally:
        if frozen:
            handle.freeze_length(None)
    return [row[input_ids.shape[1] :].tolist() for row in out]


def timed_replies(handle: Any, prompts: list[list[int]], budgets: list[int]) -> Iterator[tuple[int, list[int], float]]:
    """A streaming handle's replies (vLLM: every prompt submitted at once): (prompt index, new token ids, seconds since
    the previous reply) in the order they finish, so that the rows of one submission add up to its wall time."""
    last = time.perf_counter()
    for index, new in handle.replies(prompts, budgets):
        now = time.perf_counter()
        yield index, new, now - last
        last = now
