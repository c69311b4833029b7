"""Method specs as users write them: NAME or NAME:key=value,key=value, a frequency method optionally followed by
attention methods joined with '+' (ntk:factor=2+logn, self-extend:group_size=4, yarn:factor=2+rerope:window=1024),
and the --factor / --attention-temperature sweeps over them. A spec's `label` is the key every row, table and plot
uses for the method; its `method` and `resolved` params are looked up and validated once, when the spec is made."""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .attention.methods import (
    ATTENTION_METHODS,
    AttentionSpec,
    attention_length_dependent,
    check_combination,
    resolve_attention,
)
from .errors import CtxevalError
from .rope.methods import METHODS, START_TOKENS, Geometry, Method, compute, get_method, resolve_params

# Method presets: a checkpoint family's documented RoPE setting under one name, expanded to its method and parameters
# when a spec is parsed (a parameter given after the name replaces the preset's). name -> (method, params, source)
METHOD_PRESETS: dict[str, tuple[str, dict[str, str], str]] = {
    "qwen3-yarn": (
        "yarn",
        {"factor": "4", "original_max_position_embeddings": "32768"},
        'Qwen3 model cards: rope_scaling {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": '
        "32768} for 131,072 tokens; the cards warn that static YaRN may hurt short texts. The original length is part "
        "of it: Qwen3's config.json says max_position_embeddings 40960",
    ),
}

# Attention-method presets: the DCA settings long-context checkpoints ship in `dual_chunk_attention_config`, the
# temperature as vLLM's DualChunkFlashAttention applies it (it scales by original_max_position_embeddings).
METHOD_PRESETS.update(
    {
        "qwen2.5-1m-dca": (
            "dca",
            {"chunk_size": "262144", "local_size": "8192", "scale": "vllm", "original": "262144"},
            'Qwen2.5-7B/14B-Instruct-1M config.json: dual_chunk_attention_config {"chunk_size": 262144, "local_size": '
            '8192, "original_max_position_embeddings": 262144}; a no-op below 253,952 tokens',
        ),
        "qwen3-2507-dca": (
            "dca",
            {"chunk_size": "262144", "local_size": "8192", "scale": "vllm", "original": "262144"},
            "Qwen3-2507 checkpoints' config_1m.json (1M tokens): the same dual_chunk_attention_config as Qwen2.5-1M "
            "(their sparse attention, MInference, is not part of it here); a no-op below 253,952 tokens",
        ),
    }
)


def shipped_dca(config: Any) -> AttentionSpec | None:
    """The DCA a checkpoint's config ships in `dual_chunk_attention_config` (vLLM's reading of it), else None."""
    shipped = getattr(config.get_text_config(), "dual_chunk_attention_config", None)
    if not isinstance(shipped, dict):
        return None
    original = shipped.get("original_max_position_embeddings") or None  # vLLM: 0 or absent, no temperature
    given = {"chunk_size": shipped.get("chunk_size"), "local_size": shipped.get("local_size")}
    return resolve_attention("dca", {**given, "scale": "vllm" if original else "none", "original": original})


def with_shipped_attention(spec: MethodSpec, config: Any) -> MethodSpec:
    """`native` with the DCA its checkpoint ships (transformers has no DCA and would run plain RoPE there); any other
    spec, or native already given a DCA, as it is."""
    dca = shipped_dca(config)
    if spec.name != "native" or dca is None or any(a.name == "dca" for a in spec.attention):
        return spec
    return MethodSpec(spec.name, spec.params, spec.temperature, (*spec.attention, dca))


@dataclass(frozen=True)
class MethodSpec:
    """One measured method: a frequency method with the parameters the user gave, an attention temperature and
    attention methods. Making one validates the parameters (CtxevalError otherwise)."""

    name: str  # the frequency method (none under an attention method written alone)
    params: dict[str, Any]  # as given (defaults not added: the label shows these)
    temperature: float = 1.0  # attention temperature lambda (logits x lambda), any model; 1 = unchanged
    attention: tuple[AttentionSpec, ...] = ()  # attention methods on top of the frequencies
    method: Method = field(init=False, repr=False, compare=False)  # the frequency method `name` names
    resolved: dict[str, Any] = field(init=False, repr=False, compare=False)  # params typed, defaults filled in

    def __post_init__(self) -> None:
        method = get_method(self.name)
        object.__setattr__(self, "method", method)  # frozen: set once here
        object.__setattr__(self, "resolved", resolve_params(method, self.params))
        if self.resolved.get(START_TOKENS) and self.attention:
            raise CtxevalError(
                f"{self.name}'s {START_TOKENS} (plain RoPE on the first positions) cannot be combined with an "
                f"attention method ({self.attention[0].name}), which sets positions of its own; use one of them"
            )

    @property
    def length_dependent(self) -> bool:
        """Whether the method changes with the sequence length (dynamic-ntk, dynamic-yarn, longrope; DCA's
        temperature); `native` says no here: whether the checkpoint's own RoPE does is the loaded model's to say
        (evals.sweep)."""
        return self.method.length_dependent or any(attention_length_dependent(a) for a in self.attention)

    @property
    def method_name(self) -> str:
        """'ntk+logn', 'self-extend', 'yarn': what rows record as the method."""
        parts = [] if (self.attention and self.name == "none") else [self.name]
        return "+".join(parts + [a.name for a in self.attention])

    @property
    def record_params(self) -> dict[str, Any]:
        """The method's parameters plus the attention temperature when it is not 1 (what rows record)."""
        return self.params if self.temperature == 1.0 else {**self.params, "attention_temperature": self.temperature}

    @property
    def label(self) -> str:
        """Stable display/row key, e.g. 'yarn(factor=4)' or 'none(attention_temperature=1.2)'."""
        params = self.record_params
        parts = [] if (self.attention and self.name == "none" and not params) else [_with_params(self.name, params)]
        return "+".join(parts + [_with_params(a.name, a.given) for a in self.attention])


def _with_params(name: str, params: dict[str, Any]) -> str:
    if not params:
        return name
    return f"{name}({','.join(f'{k}={format_param(v)}' for k, v in sorted(params.items()))})"


def format_param(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (tuple, list)):  # per-pair factor lists: their count and a digest, not 32+ numbers
        digest = hashlib.sha256(json.dumps([float(v) for v in value]).encode()).hexdigest()[:8]
        return f"{len(value)}x{digest}"
    return str(value)


def method_names() -> tuple[list[str], list[str]]:
    """Every name --method accepts: frequency methods (aliases included) and attention methods."""
    frequency = [alias for m in METHODS.values() for alias in (m.name, *m.aliases)]
    return frequency, list(ATTENTION_METHODS)


def unknown_method(name: str, spec: str) -> CtxevalError:
    """The error for a name that is no method: both kinds listed, the nearest name suggested."""
    frequency, attention = method_names()
    nearest = difflib.get_close_matches(name.lower(), frequency + attention, n=1, cutoff=0.6)
    hint = f"did you mean '{nearest[0]}'? " if nearest else ""
    return CtxevalError(
        f"unknown method '{name}' in '{spec}'; {hint}frequency methods: {', '.join(frequency)}; "
        f"attention methods (alone or after '+'): {', '.join(attention)} (see 'ctxeval methods')"
    )


def _parts(text: str, spec: str) -> tuple[str, dict[str, Any]]:
    name, _, rest = text.strip().partition(":")
    params: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise CtxevalError(
                f"bad method spec '{spec}': write NAME:key=value,key=value (e.g. yarn:factor=4,beta_fast=32)"
            )
        params[key.strip()] = value.strip()
    return name.strip(), params


def parse_spec(spec: str) -> MethodSpec:
    """'yarn:factor=4,beta_fast=32' -> MethodSpec('yarn', {'factor': '4', 'beta_fast': '32'}): the parameters kept as
    given and validated (expand_specs types them); 'ntk:factor=2+logn' adds attention methods; an attention method
    alone runs on plain RoPE."""
    pieces = [_parts(text, spec) for text in re.split(r"\+(?=[A-Za-z])", spec.strip())]  # not 1e+5
    pieces = [
        (METHOD_PRESETS[n][0], {**METHOD_PRESETS[n][1], **p}) if n in METHOD_PRESETS else (n, p) for n, p in pieces
    ]
    first, first_params = pieces[0]
    frequency, _ = method_names()
    for name, _params in pieces:
        if name not in frequency and name not in ATTENTION_METHODS:
            raise unknown_method(name, spec)
    if first in ATTENTION_METHODS:
        pieces.insert(0, ("none", {}))
        first, first_params = "none", {}
    attention = []
    for name, params in pieces[1:]:
        if name not in ATTENTION_METHODS:  # a frequency method: every name was checked above
            raise CtxevalError(
                f"bad method spec '{spec}': one frequency method, written first ({name} after '+'); "
                "attention methods follow it: ntk:factor=2+logn"
            )
        attention.append(resolve_attention(name, params))
    check_combination(tuple(attention))
    return MethodSpec(get_method(first).name, first_params, attention=tuple(attention))


def factor_open(method: Method, given: dict[str, Any]) -> bool:
    """Whether `method` with the parameters `given` leaves its factor to --factor (or to the default factor): it
    takes one and was given neither it nor what replaces it (ntk's alpha/base, dynamic-ntk's rule=paper)."""
    return (
        method.takes_factor
        and "factor" not in given
        and not any(given.get(k) is not None for k in ("alpha", "base"))
        and given.get("rule") != "paper"
    )


def expand_specs(
    specs: list[str], factors: list[float] | None = None, temperatures: list[float] | None = None
) -> list[MethodSpec]:
    """Parse --method values and sweep --factor over every method that takes a factor and did not set one; every
    method is crossed with every attention temperature (default [1.0]).

    Parameters are validated and normalised to their typed values (defaults are not added to the label)."""
    out: list[MethodSpec] = []
    for raw in specs:
        spec = parse_spec(raw)
        method = spec.method
        given = {method.param_aliases.get(k, k): spec.resolved[method.param_aliases.get(k, k)] for k in spec.params}
        sweep = factors if (factors and factor_open(method, given)) else [None]
        for factor in sweep:
            params = dict(given) if factor is None else {**given, "factor": float(factor)}
            for temperature in temperatures or [1.0]:
                out.append(MethodSpec(method.name, params, float(temperature), spec.attention))
    return unique_by_label(out)


def unique_by_label(specs: list[MethodSpec]) -> list[MethodSpec]:
    """The specs in order, each label once (the first)."""
    seen: set[str] = set()
    unique = []
    for spec in specs:
        if spec.label not in seen:
            seen.add(spec.label)
            unique.append(spec)
    return unique


def default_factor(longest: int, trained: int) -> float:
    """The factor that stretches `trained` over `longest` (how YaRN users pick s: target / trained length), rounded up
    to 2 decimals so that it covers `longest`; at least 1."""
    return max(1.0, math.ceil(round(longest / trained * 100, 9)) / 100)


def takes_default_factor(method: str | Method) -> bool:
    """Whether `method` (or the method named so) named without a factor gets default_factor (static, and its own
    default is 1)."""
    method = get_method(method) if isinstance(method, str) else method
    return method.takes_factor and not method.length_dependent and method.param("factor").default == 1.0


def with_default_factors(
    specs: list[MethodSpec], longest: int | None, geometry: Geometry | None
) -> tuple[list[MethodSpec], list[str]]:
    """Give every static method that takes a factor, and was named without one (`-m yarn`, no --factor), the factor
    that covers the longest asked length: longest / trained length (the method's original_max_position_embeddings
    when given). Methods whose default factor is not 1 (llama3's 8, Llama 3.1's own) and length-dependent ones
    (dynamic-ntk scales past L at factor 1) keep their defaults. Returns the specs (labels now show the factor,
    duplicates dropped) and one note per factor chosen."""
    if geometry is None or not longest:
        return specs, []
    chosen: dict[tuple[float, int], list[str]] = {}
    out: list[MethodSpec] = []
    for spec in specs:
        if factor_open(spec.method, spec.params) and takes_default_factor(spec.method):
            trained = spec.params.get("original_max_position_embeddings") or geometry.original_length
            factor = default_factor(longest, trained)
            chosen.setdefault((factor, trained), []).append(spec.label)
            spec = MethodSpec(spec.name, {**spec.params, "factor": factor}, spec.temperature, spec.attention)
        if spec.label not in {s.label for s in out}:
            out.append(spec)
    notes = [
        (
            f"{', '.join(labels)}: factor {format_param(f)} = the longest length {longest:,} / the trained length "
            f"{trained:,}{'' if f * trained == longest else ' (rounded up)'}"
            if f > 1
            else f"{', '.join(labels)}: factor 1, as the longest length {longest:,} is within the trained length {trained:,}"
        )
        + "; give --factor or NAME:factor=S to choose"
        for (f, trained), labels in chosen.items()
    ]
    return out, notes


def frequency_tables(spec: MethodSpec, lengths: list[int], geometry: Geometry) -> list[Any] | None:
    """The spec's RoPE (frequencies and attention factor) at each of `lengths` (one static table repeated for a
    method that does not depend on the length); None when only its frequencies cannot say what it measures (an
    attention temperature or method, `native`: the checkpoint's own RoPE is the loaded model's to say) or when it
    cannot be computed here (it fails with its own error when applied)."""
    if spec.name == "native" or spec.attention or spec.temperature != 1.0 or spec.resolved.get(START_TOKENS):
        return None  # LongRoPE's start tokens are positions, not frequencies
    try:
        if not spec.length_dependent:
            return [compute(spec.method, geometry, spec.params, None)] * len(lengths)
        return [compute(spec.method, geometry, spec.params, n) for n in lengths]
    except CtxevalError:
        return None


def plain_rope_notes(specs: list[MethodSpec], lengths: list[int], geometry: Geometry | None) -> list[str]:
    """One note per method that is plain RoPE at every length asked (its frequencies and attention factor equal
    method none's, no attention temperature, no attention method): measuring it only repeats `none`."""
    if geometry is None or not lengths:
        return []
    at = sorted(set(lengths))
    plain = frequency_tables(MethodSpec("none", {}), at, geometry)
    notes = []
    for spec in specs:
        tables = None if spec.name == "none" else frequency_tables(spec, at, geometry)
        same = tables is not None and all(_same_freqs(a, b) for a, b in zip(tables, plain))
        if same and spec.length_dependent:
            notes.append(
                f"{spec.label} is plain RoPE at every length asked (up to {max(lengths):,}; trained "
                f"{geometry.original_length:,}): it measures the same as none; it rescales only longer sequences"
            )
        elif same:
            notes.append(
                f"{spec.label} is plain RoPE at this factor: it measures the same as none; give a factor > 1 "
                "(--factor or NAME:factor=S)"
            )
    return notes


def identical_methods(specs: list[MethodSpec], lengths: list[int], geometry: Geometry | None) -> dict[str, str]:
    """{label: the label of an earlier spec it measures exactly as}: two frequency methods whose frequencies and
    attention factor are equal at every length asked (plain RoPE at factor 1 and none; yarn and ntk within the
    trained length), neither with an attention temperature or method, nor `native` (the checkpoint's own RoPE is the
    loaded model's to say). A run measures the first of them and copies its rows to the others."""
    if geometry is None or not lengths:
        return {}
    at = sorted(set(lengths))
    computed = [(spec, frequency_tables(spec, at, geometry)) for spec in specs]
    twins: dict[str, str] = {}
    for index, (spec, mine) in enumerate(computed):
        if mine is None:
            continue
        for earlier, theirs in computed[:index]:
            same = theirs is not None and earlier.label not in twins
            if same and all(_same_freqs(a, b) for a, b in zip(mine, theirs)):
                twins[spec.label] = earlier.label
                break
    return twins


def _same_freqs(a: Any, b: Any) -> bool:
    return bool(
        np.allclose(a.inv_freq, b.inv_freq, rtol=1e-12, atol=0)
        and math.isclose(a.attention_factor, b.attention_factor, rel_tol=1e-12)
    )
