"""Attention temperature for any model: multiply every attention logit by lambda (softmax(lambda * z)).

Works on RoPE and non-RoPE models alike by scaling the factor each attention module already applies to q.k:
  - `module.scaling` (Llama, Qwen, Mistral, Gemma, Phi, GPT-NeoX, GPT-2, OPT, ... in transformers 5: passed as
    `scaling=` to the attention function, eager or sdpa or flash);
  - BLOOM (ALiBi): logits = beta * alibi + inv_norm_factor * q.k, so both `beta` and `inv_norm_factor` are scaled and
    the whole logit, ALiBi bias included, is multiplied by lambda.
A model whose attention modules have neither is refused (a temperature that silently does nothing would be a lie).
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


def supports_temperature(model: Any) -> bool:
    """True when `model` has attention modules whose logit scale ctxeval knows how to change."""
    return bool(_targets(model))


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
