"""Numbers as users and files give them, parsed and checked in one place: finite always, whole where a count is
meant, within the range a measurement can use. Options (--lengths, --factor, --position-buckets, method parameters)
parse text here; readers of run directories and sample files check the JSON values they find here. Every refusal is
one CtxevalError line that says what to write instead."""

from __future__ import annotations

import math
from typing import Any

from ..errors import CtxevalError

# the longest sequence ctxeval measures or accepts as a count of tokens (2^31 - 1: any index fits a 32-bit int)
MAX_TOKENS = 2**31 - 1
# the largest whole number accepted in a parameter or a file (2^53: every integer up to it is an exact float)
MAX_WHOLE = 2**53


def finite_number(value: Any) -> float | None:
    """A JSON/TOML value as a finite float: an int or float (not a bool), finite; None for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int beyond a float's range
        return None
    return number if math.isfinite(number) else None


def whole_number(value: Any, minimum: int | None = None, maximum: int = MAX_WHOLE) -> int | None:
    """A JSON/TOML value as a whole number in [minimum, maximum]: an int, or a float with no fraction (128.0); not a
    bool, NaN, infinity or text. None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        number = value
    else:
        as_float = finite_number(value)
        if as_float is None or not as_float.is_integer():
            return None
        number = int(as_float)
    if abs(number) > MAX_WHOLE or number > maximum or (minimum is not None and number < minimum):
        return None
    return number


def parse_number(text: Any, where: str, example: str = "1.5") -> float:
    """Text -> a finite float; 'inf', 'nan', '1e999' and words are one line naming `where`."""
    token = str(text).strip()
    try:
        value = float(token)
    except ValueError:
        raise CtxevalError(f"{where} must be a number (e.g. {example}), got '{text}'") from None
    if not math.isfinite(value):
        raise CtxevalError(f"{where} must be a finite number (e.g. {example}), got '{text}'")
    return value


def parse_whole(text: Any, where: str, minimum: int | None = None, maximum: int = MAX_WHOLE, example: str = "8") -> int:
    """Text (or a number) -> a whole number in [minimum, maximum]: '8', '8.0' and '1e3' are whole; '8.5', 'inf' are
    not."""
    value = (
        text if isinstance(text, (int, float)) and not isinstance(text, bool) else parse_number(text, where, example)
    )
    if isinstance(value, float) and not math.isfinite(value):
        raise CtxevalError(f"{where} must be a finite number (e.g. {example}), got '{text}'")
    if isinstance(value, float) and not value.is_integer():
        raise CtxevalError(f"{where} must be a whole number (e.g. {example}), got '{text}'")
    number = int(value)
    if minimum is not None and number < minimum:
        raise CtxevalError(f"{where} must be >= {minimum}, got {number}")
    if number > maximum:
        raise CtxevalError(f"{where} must be <= {maximum:,}, got '{text}'")
    return number


def parse_token_count(text: str, option: str) -> int:
    """'4k' -> 4096 (k = 1024), '300' -> 300: a whole, non-negative, finite token count as an option gives it, at most
    MAX_TOKENS."""
    tok = str(text).strip().lower()
    try:
        value = float(tok[:-1]) * 1024 if tok.endswith("k") else float(tok)
    except ValueError:
        raise CtxevalError(f"{option}: '{text}' is not a token count; write e.g. 512 or 4k") from None
    if not math.isfinite(value):
        raise CtxevalError(f"{option}: '{text}' is not a finite token count; write e.g. 512 or 4k")
    if value != int(value) or value < 0:
        raise CtxevalError(f"{option}: '{text}' must be a whole number of tokens >= 0")
    if value > MAX_TOKENS:
        raise CtxevalError(f"{option}: '{text}' is more than {MAX_TOKENS:,} tokens; write a length a model can read")
    return int(value)
