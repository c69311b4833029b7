"""The row contract shared by the evaluations (which write rows) and the reports (which read them).

A run directory's rows.jsonl holds one JSON object per measured point. Every row carries `model`, `method`,
`label` (the method spec as displayed, e.g. `yarn(factor=4)`), `params`, `task`, `length`, `status`, `metric`
and `value`; the fields that identify a point depend on the task (POINT_FIELDS). A failed point is a row too
(status `oom`, `skipped` or `error`, value None): a resume measures it again and a report shows the failure.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable

from .errors import CtxevalError

KINDS = ("ppl", "needle", "passkey", "entropy", "ruler", "lm-eval")
# the metric each kind's rows carry in `metric` / `value`
METRICS = {"ppl": "nll", "needle": "correct", "passkey": "correct", "entropy": "entropy", "ruler": "score",
           "lm-eval": None}  # lm-eval rows name their own metric (acc, exact_match, ...)
# the fields of one point: a point measured twice is one cell, not two
POINT_FIELDS = {"ppl": ("model", "label", "length", "doc"),
                "needle": ("model", "label", "length", "depth", "sample"),
                "passkey": ("model", "label", "length", "sample"),
                "entropy": ("model", "label", "length", "doc"),
                "ruler": ("model", "label", "ruler_task", "length", "sample"),
                "lm-eval": ("model", "label", "lm_eval_task", "subtask", "metric", "filter")}
# resume keys within one run (one model): the point fields without the model
RESUME_FIELDS = {kind: fields[1:] for kind, fields in POINT_FIELDS.items()}
REQUIRED = {kind: (*fields, "status") for kind, fields in POINT_FIELDS.items()}
REQUIRED_OK = {"ppl": ("nll_sum", "n_tokens"), "needle": ("correct",), "passkey": ("correct",), "entropy": ("entropy",),
               "ruler": ("score",), "lm-eval": ("value",)}

# how a ppl table aggregates over documents: token-weighted, or the mean of per-window means (YaRN's GovReport)
AGGREGATES = ("token", "window")
# RULER's effective-length threshold: Llama-2-7B's mean score at 4k (a length counts when its mean exceeds it)
RULER_THRESHOLD = 85.6
OK = "ok"
MISSING = "—"  # a cell no run measured: never shown as zero
# the uniform-attention reference row of entropy tables (a function of the length only)
UNIFORM_MODEL = "any model"
UNIFORM_LABEL = "uniform (ln of visible keys)"


def point_key(row: dict[str, Any], fields: Iterable[str]) -> tuple[str, ...]:
    """The identity of a row's point: its `fields` as canonical JSON (1 and 1.0 stay distinct from '1')."""
    return tuple(json.dumps(row.get(f), sort_keys=True, default=str) for f in fields)


def status_label(status: str | None) -> str:
    """How a cell without a value is shown: OOM, skip, or the missing mark."""
    return {"oom": "OOM", "skipped": "skip", "no key tokens": "no keys"}.get(status or "", MISSING)


def parse_token_count(text: str, option: str) -> int:
    """'4k' -> 4096 (k = 1024), '300' -> 300: a whole, non-negative token count as an option gives it."""
    tok = str(text).strip().lower()
    try:
        value = float(tok[:-1]) * 1024 if tok.endswith("k") else float(tok)
    except ValueError:
        raise CtxevalError(f"{option}: '{text}' is not a token count; write e.g. 512 or 4k") from None
    if value != int(value) or value < 0:
        raise CtxevalError(f"{option}: '{text}' must be a whole number of tokens >= 0")
    return int(value)


def fmt_length(n: int) -> str:
    """2048 -> '2k' (k = 1024); other lengths as they are."""
    return f"{n // 1024}k" if n % 1024 == 0 and n >= 1024 else str(n)


def uniform_entropy(length: int) -> float:
    """Mean over queries 0..L-1 of ln(i+1) = ln(L!)/L: the entropy of uniform causal attention (the upper bound)."""
    return math.lgamma(length + 1) / length
