"""Attention temperature for any model: multiply every attention logit by lambda (softmax(lambda * z)).

Works on RoPE and non-RoPE models alike by scaling the factor each attention module already applies to q.k:
  - `module.scaling` (Llama, Qwen, Mistral, Gemma, Phi, GPT-NeoX, GPT-2, OPT, ... in transformers 5: passed as
    `scaling=` to the attention function, eager or sdpa or flash);
  - BLOOM (ALiBi): logits = beta * alibi + inv_norm_factor * q.k, so both `beta` and `inv_norm_factor` are scaled and
    the whole logit, ALiBi bias included, is multiplied by lambda.
A model whose attention modules have neither, or whose output does not change when they are scaled (checked by a
probe forward), is refused: a temperature that silently does nothing would be a lie. With logit soft-capping
(Gemma 2) the scale acts before the cap: c tanh(lambda z / c), not lambda times the capped logit.
This is independent of YaRN's attention factor, which scales q and k through cos/sin (logits by its square).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from .errors import CtxevalError


def _targets(model: Any) -> list[tuple[Any, tuple[str, ...]]]:
    found: list[tuple[Any, tuple[str, ...]]] = []
    for module in model.modules():
        if isinstance(getattr(module, "inv_norm_factor", None), float) and isinstance(getattr(module, "beta", None), float):
            found.append((module, ("inv_norm_factor", "beta")))
        elif isinstance(getattr(module, "scaling", None), (float, int)) and "attention" in type(module).__name__.lower():
            found.append((module, ("scaling",)))
    return found


def supports_temperature(model: Any, device: str = "cpu") -> bool:
    """True when `model` has attention modules whose logit scale ctxeval knows how to change AND changing it
    changes the model's output (a probe forward of 8 tokens at lambda = 2). Some modules carry a scale that their
    forward never reads (Falcon's RoPE paths keep `inv_norm_factor` unused): those are refused, not run as a no-op."""
    import torch

    if not _targets(model):
        return False
    vocab = model.config.get_text_config().vocab_size
    ids = (torch.arange(3, 11) % vocab)[None].to(device)
    with torch.inference_mode():
        base = model(input_ids=ids).logits
        with attention_temperature(model, 2.0):
            hot = model(input_ids=ids).logits
    return not torch.equal(base, hot)


def check_temperature(value: float) -> float:
    if not value > 0:
        raise CtxevalError(f"--attention-temperature must be > 0 (1 = unchanged), got {value:g}")
    return float(value)


@contextlib.contextmanager
def attention_temperature(model: Any, value: float) -> Iterator[int]:
    """Scale every attention logit of `model` by `value` inside the block; yields the number of modules changed.

    value == 1 touches nothing. The original factors are restored exactly on exit (also on error).
    """
    value = check_temperature(value)
    if value == 1.0:
        yield 0
        return
    targets = _targets(model)
    if not targets:
        raise CtxevalError(
            f"--attention-temperature: no attention module of {type(model).__name__} exposes its logit scale "
            "('scaling', or BLOOM's 'inv_norm_factor'/'beta'); this architecture is not supported"
        )
    saved = [(m, name, getattr(m, name)) for m, names in targets for name in names]
    try:
        for m, name, old in saved:
            setattr(m, name, old * value)
        yield len(targets)
    finally:
        for m, name, old in saved:
            setattr(m, name, old)
