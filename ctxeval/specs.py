"""Method specs as users write them: NAME or NAME:key=value,key=value, a frequency method optionally followed by
attention methods joined with '+' (ntk:factor=2+logn, self-extend:group_size=4, yarn:factor=2+rerope:window=1024),
and the --factor / --attention-temperature sweeps over them. A spec's `label` is the key every row, table and plot
uses for the method."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from .attention_methods import ATTENTION_METHODS, AttentionSpec, check_combination, resolve_attention
from .errors import CtxevalError
from .methods import get_method, resolve_params

@dataclass(frozen=True)
class MethodSpec:
    name: str  # the frequency method (none under an attention method written alone)
    params: dict[str, Any]
    temperature: float = 1.0  # attention temperature lambda (logits x lambda), any model; 1 = unchanged
    attention: tuple[AttentionSpec, ...] = ()  # attention methods on top of the frequencies

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


def _is_frequency_method(name: str) -> bool:
    try:
        get_method(name)
        return True
    except CtxevalError:
        return False


def _parts(text: str, spec: str) -> tuple[str, dict[str, Any]]:
    name, _, rest = text.strip().partition(":")
    params: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise CtxevalError(f"bad method spec '{spec}': write NAME:key=value,key=value (e.g. yarn:factor=4,beta_fast=32)")
        params[key.strip()] = value.strip()
    return name.strip(), params


def parse_spec(spec: str) -> MethodSpec:
    """'yarn:factor=4,beta_fast=32' -> MethodSpec('yarn', {'factor': '4', 'beta_fast': '32'}) (validated later);
    'ntk:factor=2+logn' adds attention methods (validated here); an attention method alone runs on plain RoPE."""
    pieces = [_parts(text, spec) for text in re.split(r"\+(?=[A-Za-z])", spec.strip())]  # not 1e+5
    first, first_params = pieces[0]
    if first in ATTENTION_METHODS:
        pieces.insert(0, ("none", {}))
        first, first_params = "none", {}
    method = get_method(first)
    attention = []
    for name, params in pieces[1:]:
        if name not in ATTENTION_METHODS and _is_frequency_method(name):
            raise CtxevalError(f"bad method spec '{spec}': one frequency method, written first ({name} after '+'); "
                               "attention methods follow it: ntk:factor=2+logn")
        attention.append(resolve_attention(name, params))
    check_combination(tuple(attention))
    return MethodSpec(method.name, first_params, attention=tuple(attention))


def expand_specs(specs: list[str], factors: list[float] | None = None,
                 temperatures: list[float] | None = None) -> list[MethodSpec]:
    """Parse --method values and sweep --factor over every method that takes a factor and did not set one; every
    method is crossed with every attention temperature (default [1.0]).

    Parameters are validated and normalised to their typed values (defaults are not added to the label)."""
    out: list[MethodSpec] = []
    for raw in specs:
        spec = parse_spec(raw)
        method = get_method(spec.name)
        typed = resolve_params(method, spec.params)
        given = {method.param_aliases.get(k, k): typed[method.param_aliases.get(k, k)] for k in spec.params}
        sweep = factors if (factors and method.takes_factor and "factor" not in given
                            and not any(given.get(k) is not None for k in ("alpha", "base"))
                            and given.get("rule") != "paper") else [None]
        for factor in sweep:
            params = dict(given) if factor is None else {**given, "factor": float(factor)}
            resolve_params(method, params)  # validate the combination
            for temperature in temperatures or [1.0]:
                out.append(MethodSpec(method.name, params, float(temperature), spec.attention))
    seen, unique = set(), []
    for s in out:
        if s.label not in seen:
            seen.add(s.label)
            unique.append(s)
    return unique
