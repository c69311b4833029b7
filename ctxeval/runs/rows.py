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

from ..util.numbers import (
    MAX_TOKENS,
    finite_number,
    parse_token_count,  # noqa: F401 - re-exported: the options' token counts
    whole_number,
)

KINDS = ("ppl", "needle", "passkey", "entropy", "ruler", "lm-eval", "tune")
# the metric each kind's rows carry in `metric` / `value`
METRICS = {
    "ppl": "nll",
    "needle": "correct",
    "passkey": "correct",
    "entropy": "entropy",
    "ruler": "score",
    "lm-eval": None,
    "tune": "ppl",
}  # lm-eval rows name their own metric (acc, exact_match, ...)
# the fields of one point: a point measured twice is one cell, not two
POINT_FIELDS = {
    "ppl": ("model", "label", "length", "doc"),
    "needle": ("model", "label", "length", "depth", "sample"),
    "passkey": ("model", "label", "length", "sample"),
    "entropy": ("model", "label", "length", "doc"),
    "ruler": ("model", "label", "ruler_task", "length", "sample"),
    "lm-eval": ("model", "label", "lm_eval_task", "subtask", "metric", "filter"),
    # one row per trial of a search (its point, measured on the tuning documents at the target length)
    "tune": ("model", "phase", "trial"),
}
# resume keys within one run (one model): the point fields without the model
RESUME_FIELDS = {kind: fields[1:] for kind, fields in POINT_FIELDS.items()}
# a search across several methods mirrors each method's trials with its `family` (their numbers each start at 0); a
# single search's rows have none
RESUME_FIELDS["tune"] = ("phase", "family", "trial")
REQUIRED = {kind: (*fields, "status") for kind, fields in POINT_FIELDS.items()}
REQUIRED_OK = {
    "ppl": ("nll_sum", "n_tokens"),
    "needle": ("correct",),
    "passkey": ("correct",),
    "entropy": ("entropy",),
    "ruler": ("score",),
    "lm-eval": ("value",),
    "tune": ("value", "ppl_short", "short_rise", "feasible"),
}

# how a ppl table aggregates over documents: token-weighted, or the mean of per-window means (YaRN's GovReport)
AGGREGATES = ("token", "window")
# RULER's effective-length threshold: Llama-2-7B's mean score at 4k (a length counts when its mean exceeds it)
RULER_THRESHOLD = 85.6
OK = "ok"
MISSING = "—"  # a cell no run measured: never shown as zero
# the uniform-attention reference row of entropy tables (a function of the length only)
UNIFORM_MODEL = "any model"
UNIFORM_LABEL = "uniform (ln of visible keys)"


# the largest mean NLL per token a ppl-like row may hold: exp(700) is about the largest float, so any more would
# print as an infinite perplexity (a real model's mean NLL is below ln(vocabulary), ~12 for 128k tokens)
MAX_MEAN_NLL = 700.0


def _mean_nll_problem(row: dict[str, Any], total: str, count: str, optional: bool = False) -> str | None:
    """`total` / `count` as a ppl-like pair: a finite NLL sum >= 0 over a whole count, with a finite exponential."""
    if optional and row.get(total) is None and row.get(count) is None:
        return None
    n = whole_number(row.get(count), minimum=0)
    s = finite_number(row.get(total))
    if n is None:
        return f"{count} is not a whole number >= 0"
    if s is None or s < 0:
        return f"{total} is not a finite number >= 0"
    if (n == 0 and s > 0) or (n and s / n > MAX_MEAN_NLL):
        return f"{total} / {count} is not a mean NLL a model can have (perplexity would overflow)"
    return None


def _positions_problem(row: dict[str, Any]) -> str | None:
    edges, sums, counts = row.get("position_edges"), row.get("position_nll_sum"), row.get("position_tokens")
    if edges is None:
        return None
    if not isinstance(edges, list) or not isinstance(sums, list) or not isinstance(counts, list):
        return "position_edges / position_nll_sum / position_tokens are not lists"
    ints = [whole_number(e, minimum=0, maximum=MAX_TOKENS) for e in edges]
    if len(edges) < 2 or None in ints or any(b <= a for a, b in zip(ints, ints[1:])):
        return "position_edges are not increasing whole numbers"
    if len(sums) != len(edges) - 1 or len(counts) != len(edges) - 1:
        return "position sums do not have one value per bucket"
    for s, n in zip(sums, counts):
        problem = _mean_nll_problem({"s": s, "n": n}, "s", "n")
        if problem:
            return "a position bucket's NLL sum or token count is not usable"
    return None


def row_problem(row: Any, kind: str) -> str | None:
    """Why a row read from a run directory cannot be used by a report or a resume of a `kind` run, or None.

    Checked: the fields a row of the kind must have (REQUIRED, and REQUIRED_OK for an `ok` row), the fields that
    identify the point (length a whole number of tokens >= 1, model and label text, ...), and for an `ok` row every
    number the tables compute from (finite, in range: a score in [0, 1], an NLL sum that gives a finite
    perplexity)."""
    if not isinstance(row, dict):
        return "not a JSON object"
    need = REQUIRED.get(kind, ()) + (REQUIRED_OK.get(kind, ()) if row.get("status") == OK else ())
    lacking = [f for f in need if f not in row]
    if lacking:
        return f"lacks {', '.join(lacking)} (not a ctxeval {kind} row)"
    if whole_number(row.get("length"), minimum=1, maximum=MAX_TOKENS) is None:
        return f"length {row.get('length')!r} is not a whole number of tokens >= 1"
    for name in ("model", "label"):
        if name in row and not isinstance(row[name], str):
            return f"{name} is not text"
    if "status" in row and not isinstance(row["status"], str):
        return "status is not text"
    if kind in ("needle", "passkey", "ruler") and "sample" in row and whole_number(row["sample"], minimum=0) is None:
        return "sample is not a whole number >= 0"
    if kind == "needle" and "depth" in row and finite_number(row["depth"]) is None:
        return "depth is not a finite number"
    if kind == "ruler" and "ruler_task" in row and not isinstance(row["ruler_task"], str):
        return "ruler_task is not text"
    for name in POINT_FIELDS.get(kind, ()):  # a point's identity: text or a finite number, as ctxeval writes it
        value = row[name]
        if not isinstance(value, str) and (isinstance(value, bool) or finite_number(value) is None):
            return f"{name} {str(value)[:20]!r} is neither text nor a finite number"
    if row.get("status") != OK:
        return None
    if kind == "ppl":
        return (
            _mean_nll_problem(row, "nll_sum", "n_tokens")
            or (None if whole_number(row.get("n_tokens"), minimum=1) else "n_tokens is not a whole number >= 1")
            or _mean_nll_problem(row, "window_nll_sum", "n_windows", optional=True)
            or (_mean_nll_problem(row, "key_nll_sum", "key_tokens") if row.get("key_tokens") is not None else None)
            or _positions_problem(row)
        )
    if kind in ("needle", "passkey", "ruler"):
        name = "score" if kind == "ruler" else "correct"
        value = finite_number(row.get(name)) if not isinstance(row.get(name), bool) else float(row[name])
        if value is None or not 0 <= value <= 1:
            return f"{name} of an ok row is not a number in [0, 1]"
        return None
    if kind == "entropy":
        if finite_number(row.get("entropy")) is None or row["entropy"] < 0:
            return "entropy of an ok row is not a finite number >= 0"
        if row.get("uniform_entropy") is not None and finite_number(row["uniform_entropy"]) is None:
            return "uniform_entropy is not a finite number"
        layers, values = row.get("layers"), row.get("entropy_per_layer")
        if (layers is not None or values is not None) and not (
            isinstance(layers, list)
            and isinstance(values, list)
            and len(layers) == len(values)
            and all(whole_number(x, minimum=0) is not None for x in layers)
            and all(finite_number(v) is not None for v in values)
        ):
            return "layers / entropy_per_layer are not lists of one finite value per layer"
        return None
    if kind == "tune":
        if whole_number(row.get("trial"), minimum=0) is None:
            return "trial is not a whole number >= 0"
        for name in ("value", "ppl_short"):
            if finite_number(row.get(name)) is None or not row[name] >= 1:
                return f"{name} of an ok trial is not a perplexity (a finite number >= 1)"
        if finite_number(row.get("short_rise")) is None or not isinstance(row.get("feasible"), bool):
            return "short_rise / feasible of an ok trial are not a number and a boolean"
        return None
    if kind == "lm-eval":
        if finite_number(row.get("value")) is None:
            return "value of an ok row is not a finite number"
        for name in ("subtask", "metric", "lm_eval_task"):
            if name in row and not isinstance(row[name], str):
                return f"{name} is not text"
    return None


def point_key(row: dict[str, Any], fields: Iterable[str]) -> tuple[str, ...]:
    """The identity of a row's point: its `fields` as canonical JSON (1 and 1.0 stay distinct from '1')."""
    return tuple(json.dumps(row.get(f), sort_keys=True, default=str) for f in fields)


def status_label(status: str | None) -> str:
    """How a cell without a value is shown: OOM, skip, or the missing mark."""
    return {"oom": "OOM", "skipped": "skip", "no key tokens": "no keys", BEYOND_POSITIONS: "no pos."}.get(
        status or "", MISSING
    )


# a length past a learned position table: the model has no position for it (shown "no pos.", never measured)
BEYOND_POSITIONS = "beyond positions"


def fmt_length(n: int) -> str:
    """2048 -> '2k' (k = 1024); other lengths as they are."""
    return f"{n // 1024}k" if n % 1024 == 0 and n >= 1024 else str(n)


def uniform_entropy(length: int) -> float:
    """Mean over queries 0..L-1 of ln(i+1) = ln(L!)/L: the entropy of uniform causal attention (the upper bound)."""
    return math.lgamma(length + 1) / length
