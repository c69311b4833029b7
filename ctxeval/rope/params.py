"""A method's parameter, as RoPE methods (rope.methods) and attention methods (attention.methods) declare it: its
type, default, help and bounds, and a user's value (text from --method, a number, a list or @FILE) coerced to it with
a one-line error."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CtxevalError
from ..util.numbers import MAX_WHOLE
from ..util.textfiles import read_json, read_toml


@dataclass(frozen=True)
class Param:
    name: str
    kind: type  # float, int, bool, str, or tuple (a list of positive floats)
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    minimum: float | None = None  # inclusive lower bound for numbers
    positive: bool = False  # strictly > 0


def _factor_list(where: str, name: str, value: Any) -> tuple[float, ...]:
    """A list of positive floats: a list/tuple, '1.0;1.1;...', or '@FILE' (JSON or TOML: a list, or an object holding
    `name` directly or under rope_parameters / rope_scaling, as checkpoints' config.json do)."""
    if isinstance(value, str) and value.startswith("@"):
        path = Path(value[1:]).expanduser()
        try:  # UTF-8, size, nesting and finite numbers checked in one place
            data = read_toml(path) if path.suffix == ".toml" else read_json(path)
        except CtxevalError as exc:
            raise CtxevalError(f"{where}: {exc}") from None
        if isinstance(data, dict):
            found = [
                d[name]
                for d in (data, data.get("rope_parameters") or {}, data.get("rope_scaling") or {})
                if isinstance(d, dict) and name in d
            ]
            if not found:
                raise CtxevalError(f"{where}: {path} holds no '{name}' (top level, rope_parameters or rope_scaling)")
            data = found[0]
        value = data
    elif isinstance(value, str):
        value = [v for v in value.split(";") if v.strip()]
    try:
        numbers = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        raise CtxevalError(f"{where} must be a list of numbers (1.0;1.1;... or @FILE), got '{value}'") from None
    if not numbers or not all(math.isfinite(v) and v > 0 for v in numbers):
        raise CtxevalError(f"{where} must be a non-empty list of positive finite numbers")
    return numbers


def coerce_param(owner: str, p: Param, value: Any) -> Any:
    """`value` as parameter `p` of method `owner` takes it (typed, range-checked); one-line errors."""
    where = f"{owner}: {p.name}"
    if p.kind is tuple:
        return _factor_list(where, p.name, value)
    if p.kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise CtxevalError(f"{where} must be true or false, got '{value}'")
    if p.kind is str:
        value = str(value)
        if p.choices and value not in p.choices:
            raise CtxevalError(f"{where} must be one of {', '.join(p.choices)}, got '{value}'")
        return value
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise CtxevalError(f"{where} must be a{'n integer' if p.kind is int else ' number'}, got '{value}'") from None
    if not math.isfinite(number):
        raise CtxevalError(f"{where} must be finite, got '{value}'")
    if p.kind is int:
        if not number.is_integer():
            raise CtxevalError(f"{where} must be an integer, got '{value}'")
        if abs(number) > MAX_WHOLE:
            raise CtxevalError(f"{where} must be at most {MAX_WHOLE:,}, got '{value}'")
        number = int(number)
    if p.minimum is not None and number < p.minimum:
        hint = " (factor < 1 would shrink the context; use 1 for no scaling)" if p.name in ("factor", "alpha") else ""
        raise CtxevalError(f"{where} must be >= {p.minimum:g}, got {number:g}{hint}")
    if p.positive and number <= 0:
        raise CtxevalError(f"{where} must be > 0, got {number:g}")
    return number
