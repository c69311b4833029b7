"""The attention side of a model, in place and restored exactly: the one module besides patching.py that touches
transformers internals (patching.py holds the RoPE side).

Attention temperature, for any model: multiply every attention logit by lambda (softmax(lambda * z)).
Works on RoPE and non-RoPE models alike by scaling the factor each attention module already applies to q.k:
  - `module.scaling` (Llama, Qwen, Mistral, Gemma, Phi, GPT-NeoX, GPT-2, OPT, ... in transformers 5: passed as
    `scaling=` to the attention function, eager or sdpa or flash);
  - BLOOM (ALiBi): logits = beta * alibi + inv_norm_factor * q.k, so both `beta` and `inv_norm_factor` are scaled and
    the whole logit, ALiBi bias included, is multiplied by lambda.
A model whose attention modules have neither, or whose output does not change when they are scaled (checked by a
probe forward), is refused: a temperature that silently does nothing would be a lie. With logit soft-capping
(Gemma 2) the scale acts before the cap: c tanh(lambda z / c), not lambda times the capped logit.
This is independent of YaRN's attention factor, which scales q and k through cos/sin (logits by its square).

Watching attention: `watch_sdpa(model, observer)` wraps transformers' registered sdpa attention function while a
block runs, so that `observer(module, query, key, attention_mask, scaling, kwargs)` sees the q and k every
attention call really uses (after RoPE and its attention factor); the original function then runs unchanged.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

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


Observer = Callable[[Any, Any, Any, Any, "float | None", dict[str, Any]], None]
_OBSERVERS: list[Observer] = []  # innermost last: only it sees the calls


def _observed(original: Any) -> Any:
    def sdpa_observed(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, *args: Any,
                      **kwargs: Any) -> Any:
        if _OBSERVERS:
            scaling = kwargs.get("scaling", args[1] if len(args) > 1 else None)
            _OBSERVERS[-1](module, query, key, attention_mask, scaling, kwargs)
        return original(module, query, key, value, attention_mask, *args, **kwargs)

    return sdpa_observed


@contextlib.contextmanager
def watch_sdpa(model: Any, observer: Observer, purpose: str = "this measurement") -> Iterator[None]:
    """Call `observer` on every sdpa attention call of `model` inside the block; the model's output is unchanged
    and the registered function is restored on exit. A model that does not run transformers' sdpa is refused."""
    from transformers.modeling_utils import AttentionInterface

    impl = getattr(model.config.get_text_config(), "_attn_implementation", None)
    if impl != "sdpa":
        raise CtxevalError(f"{purpose} reads q and k through transformers' sdpa attention, and this model runs "
                           f"'{impl}' (transformers has no sdpa path for its architecture); {purpose} cannot measure it")
    mapping = AttentionInterface._global_mapping
    original = mapping["sdpa"]
    mapping["sdpa"] = _observed(original)
    _OBSERVERS.append(observer)
    try:
        yield
    finally:
        _OBSERVERS.remove(observer)
        mapping["sdpa"] = original
