"""Method specs as users write them: NAME or NAME:key=value,key=value, and the --factor / --attention-temperature
sweeps over them. A spec's `label` is the key every row, table and plot uses for the method."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import CtxevalError
from .methods import get_method, resolve_params

@dataclass(frozen=True)
class MethodSpec:
    name: str
    params: dict[str, Any]
    temperature: float = 1.0  # attention temperature lambda (logits x lambda), any model; 1 = unchanged

    @property
    def record_params(self) -> dict[str, Any]:
        """The method's parameters plus the attention temperature when it is not 1 (what rows record)."""
        return self.params if self.temperature == 1.0 else {**self.params, "attention_temperature": self.temperature}

    @property
    def label(self) -> str:
        """Stable display/row key, e.g. 'yarn(factor=4)' or 'none(attention_temperature=1.2)'."""
        params = self.record_params
        if not params:
            return self.name
        inner = ",".join(f"{k}={format_param(v)}" for k, v in sorted(params.items()))
        return f"{self.name}({inner})"


def format_param(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def parse_spec(spec: str) -> MethodSpec:
    """'yarn:factor=4,beta_fast=32' -> MethodSpec('yarn', {'factor': '4', 'beta_fast': '32'}) (validated later)."""
    name, _, rest = spec.strip().partition(":")
    method = get_method(name.strip())
    params: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise CtxevalError(f"bad method spec '{spec}': write NAME:key=value,key=value (e.g. yarn:factor=4,beta_fast=32)")
        params[key.strip()] = value.strip()
    return MethodSpec(method.name, params)


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
                out.append(MethodSpec(method.name, params, float(temperature)))
    seen, unique = set(), []
    for s in out:
        if s.label not in seen:
            seen.add(s.label)
            unique.append(s)
    return unique
