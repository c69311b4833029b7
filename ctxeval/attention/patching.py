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

from ..errors import CtxevalError


def _targets(model: Any) -> list[tuple[Any, tuple[str, ...]]]:
    found: list[tuple[Any, tuple[str, ...]]] = []
    for module in model.modules():
        if isinstance(getattr(module, "inv_norm_factor", None), float) and isinstance(
            getattr(module, "beta", None), float
        ):
            found.append((module, ("inv_norm_factor", "beta")))
        elif (
            isinstance(getattr(module, "scaling", None), (float, int)) and "attention" in type(module).__name__.lower()
        ):
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
    def sdpa_observed(
        module: Any, query: Any, key: Any, value: Any, attention_mask: Any, *args: Any, **kwargs: Any
    ) -> Any:
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
        raise CtxevalError(
            f"{purpose} reads q and k through transformers' sdpa attention, and this model runs "
            f"'{impl}' (transformers has no sdpa path for its architecture); {purpose} cannot measure it"
        )
    mapping = AttentionInterface._global_mapping
    original = mapping["sdpa"]
    mapping["sdpa"] = _observed(original)
    _OBSERVERS.append(observer)
    try:
        yield
    finally:
        _OBSERVERS.remove(observer)
        mapping["sdpa"] = original


def wrappable_attention(model: Any, what: str, kernel: str = "chunked") -> str:
    """The model's attention implementation when ctxeval can replace it (sdpa or eager; also flash-attention 2 for
    log-n alone, which only scales q before the model's own function); else one-line error."""
    impl = getattr(model.config.get_text_config(), "_attn_implementation", None)
    allowed = ("sdpa", "eager", "flash_attention_2") if kernel == "query-scale" else ("sdpa", "eager")
    if impl not in allowed:
        raise CtxevalError(
            f"{what} replaces the attention computation, which ctxeval can do for --attn "
            f"{' or '.join(allowed)}, not '{impl}'; rerun with --attn sdpa"
        )
    return impl


def model_device_type(model: Any) -> str:
    return next(iter(model.parameters())).device.type


def kernel_of(model: Any, specs: tuple[Any, ...]) -> str:
    """The attention kernel `specs` run on in `model` (attention_kernels.choose_kernel; recorded in run.json)."""
    from .kernels import choose_kernel

    return choose_kernel(specs, model_device_type(model))


def query_positions(query: Any, key: Any, kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """Positions of the queries (B, Tq) and of the keys (B, Tk): position_ids when transformers passes them, else
    the last Tq of Tk consecutive positions; keys sit at consecutive positions ending where the last query is
    (left padding shifts them all alike)."""
    import torch

    tq, tk = query.shape[2], key.shape[2]
    positions = kwargs.get("position_ids")
    if positions is None or positions.shape[-1] != tq:
        positions = torch.arange(tk - tq, tk, device=query.device)[None].expand(query.shape[0], tq)
    positions = positions.to(query.device).expand(query.shape[0], tq)
    key_positions = torch.arange(tk, device=query.device)[None] + (positions[:, -1:] - (tk - 1))
    return positions, key_positions


def eager_function(module: Any) -> Any:
    """The eager attention function of `module`'s model file (transformers keeps eager out of its registry)."""
    import sys

    return getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)


@contextlib.contextmanager
def attention_methods(
    model: Any, specs: tuple[Any, ...], inv_freq: Callable[[], Any], original_length: int
) -> Iterator[str]:
    """Run `model`'s attention under `specs` (AttentionSpecs) inside the block, on the kernel kernel_of() chooses
    (attention_kernels: query-scale, fused, or attention_methods.attend as the chunked reference); yields the
    attention implementation replaced. `inv_freq()` returns the rotary frequencies in force at each call (a
    frequency method's, recomputed per length for dynamic ones). The registered function is restored on exit."""
    if not specs:
        yield ""
        return
    from transformers.modeling_utils import AttentionInterface

    from .kernels import FarKeyCache, MaskVerdicts, fused_attend, scale_queries
    from .methods import attend, specs_logn_length
    from .shifted import attend_shifted, fused_shifted, shifted_spec
    from .temperature import check_query_scale_model, scale_query

    name = "+".join(s.name for s in specs)
    kernel = kernel_of(model, specs)
    impl = wrappable_attention(model, name, kernel)
    check_query_scale_model(model, specs)
    mapping = AttentionInterface._global_mapping
    had, saved = impl in mapping, mapping.get(impl)
    far_keys, verdicts = FarKeyCache(), MaskVerdicts()
    logn = specs_logn_length(specs, original_length)
    shifted = shifted_spec(specs) is not None
    fused_fn, chunked_fn = (fused_shifted, attend_shifted) if shifted else (fused_attend, attend)

    def method_attention(
        module: Any,
        query: Any,
        key: Any,
        value: Any,
        attention_mask: Any,
        dropout: float = 0.0,
        scaling: float | None = None,
        **kwargs: Any,
    ) -> tuple[Any, Any]:
        if kwargs.get("sliding_window") or kwargs.get("softcap"):
            raise CtxevalError(
                f"{name}: this model's attention uses a sliding window or logit soft-capping, which "
                "these methods do not reproduce"
            )
        positions, key_positions = query_positions(query, key, kwargs)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        own = saved if had else eager_function(module)
        if kernel == "query-scale" and own is not None:
            scaled = scale_queries(query, positions, logn) if logn is not None else None
            return own(
                module,
                scale_query(module, query, positions, specs, original_length) if scaled is None else scaled,
                key,
                value,
                attention_mask,
                dropout=dropout,
                scaling=scaling,
                **kwargs,
            )
        freqs = inv_freq().to(query.device)
        if kernel == "fused":
            out = fused_fn(
                query,
                key,
                value,
                positions,
                key_positions,
                attention_mask,
                scale,
                freqs,
                specs,
                original_length,
                module=module,
                cache=far_keys,
                verdicts=verdicts,
            )
        else:
            out = chunked_fn(
                query, key, value, positions, key_positions, attention_mask, scale, freqs, specs, original_length
            )
        return out, None

    mapping[impl] = method_attention
    try:
        yield impl
    finally:
        far_keys.clear()
        if had:
            mapping[impl] = saved
        else:
            del mapping[impl]


VERIFY_ATOL = 1e-4
PROBE_CAP = 16_384  # keys of the probe at most (DCA with Qwen's 262,144-token chunks probes its first chunk alone)


def verify_attention_methods(
    model: Any, specs: tuple[Any, ...], inv_freq: Callable[[], Any], original_length: int, device: str = "cpu"
) -> dict[str, Any]:
    """Inside `attention_methods(...)`: check that every attention layer runs the method (an 8-token probe forward
    counts the calls) and that the installed function equals the papers' formulas (attention_methods.
    reference_attention) on layer-0-shaped q, k, v whose positions cross the method's window. Raises CtxevalError
    when a layer bypasses it or the largest difference exceeds VERIFY_ATOL; returns what run.json records."""
    import torch
    from transformers.modeling_utils import AttentionInterface

    from .methods import reference_attention, rotate, window_of
    from .shifted import probe_length, reference_shifted, rules_probed, shifted_spec
    from .temperature import first_scaled

    config = model.config.get_text_config()
    impl = config._attn_implementation
    installed = AttentionInterface._global_mapping[impl]
    calls = []

    def counting(module: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(module)
        return installed(module, *args, **kwargs)

    AttentionInterface._global_mapping[impl] = counting
    try:
        vocab = config.vocab_size
        with torch.inference_mode():
            model(input_ids=(torch.arange(3, 11) % vocab)[None].to(device))
    finally:
        AttentionInterface._global_mapping[impl] = installed
    layers = getattr(config, "num_hidden_layers", None)
    if not calls or (layers is not None and len(calls) != layers):
        raise CtxevalError(
            f"{'+'.join(s.name for s in specs)}: {len(calls)} of {layers} attention layers ran the method "
            "(this architecture calls its attention another way); ctxeval cannot apply it here"
        )

    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    window = max([window_of(s) or 0 for s in specs] + [0])
    total = max(window, 1) + 48  # keys cross the window; the last 16 queries see near and far pairs
    shifted = shifted_spec(specs)
    if shifted is not None:  # into DCA's third chunk or past STRING's shift, within PROBE_CAP keys
        total = probe_length(shifted, original_length, PROBE_CAP)
    gen = torch.Generator().manual_seed(0)
    q_raw = torch.randn(heads, 16, dim, generator=gen, dtype=torch.float64)
    k_raw = torch.randn(kv_heads, total, dim, generator=gen, dtype=torch.float64)
    value = torch.randn(kv_heads, total, dim, generator=gen, dtype=torch.float64)
    k_pos = torch.arange(total)
    q_pos = k_pos[-16:]
    freqs = inv_freq().detach().to("cpu", torch.float64)
    query = rotate(q_raw[None], q_pos[None], freqs).float()  # what RoPE hands the attention function
    key = rotate(k_raw[None], k_pos[None], freqs).float()
    module = first_scaled(calls, specs)  # layer 0's own attention module (or the first a layers=nope q scale takes)
    # the mask transformers passes for 16 queries after earlier keys: (1, 1, 16, total) under sdpa and eager; none
    # under flash-attention 2, whose causal masking is bottom-right aligned
    causal = None if impl == "flash_attention_2" else (k_pos[None, :] <= q_pos[:, None])[None, None].to(device)
    out, _ = installed(
        module,
        query.to(device),
        key.to(device),
        value[None].float().to(device),
        causal,
        scaling=dim**-0.5,
        position_ids=q_pos[None].to(device),
    )
    want = (reference_shifted if shifted is not None else reference_attention)(
        q_raw,
        k_raw.repeat_interleave(heads // kv_heads, 0),
        value.repeat_interleave(heads // kv_heads, 0),
        q_pos,
        k_pos,
        freqs,
        specs,
        dim**-0.5,
        original_length,
    )
    diff = float((out[0].double().cpu() - want).abs().max())
    if not diff <= VERIFY_ATOL:
        raise CtxevalError(
            f"{'+'.join(s.name for s in specs)}: the attention computed differs from the papers' formula "
            f"by {diff:.2e} (> {VERIFY_ATOL:g}); this model's attention is not what ctxeval assumes"
        )
    record = {
        "layers_running_it": len(calls),
        "probe_tokens": total,
        "max_abs_diff_vs_reference": diff,
        "attention_kernel": kernel_of(model, specs),
    }
    if shifted is not None:
        record["rules_probed"] = rules_probed(shifted, original_length, total)
    return record
