"""Greedy generation as every generating evaluation runs it (needle, passkey, RULER): the ids that end a reply and
a plain greedy GenerationConfig that a checkpoint's own generation settings cannot change; and the two helpers the
runners share with the vLLM backend (evals.vllm_engine), whose handle generates instead of transformers."""

from __future__ import annotations

from typing import Any


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
