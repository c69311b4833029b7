"""`ctxeval report`'s tables: the runs grouped by protocol (each kind's protocol key), the runs of a group merged
point by point, and each group's tables built by its kind (report/kinds/, listed in report/registry.py)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..errors import CtxevalError
from ..runs.rows import AGGREGATES
from .kind import Settings
from .registry import KINDS
from .runs import Group, Run, display_models, field_label, group_runs, load_runs, merge_rows
from .tables import Table


def encoding_of_record(record: dict[str, Any]) -> str | None:
    """The position encoding of a run recorded before run.json named it, from its RoPE record."""
    rope = record.get("rope") or {}
    if rope.get("base"):
        return "RoPE"
    reason = str(rope.get("no_rope_reason") or "")
    named = [("ALiBi", "ALiBi"), ("sinusoidal", "sinusoidal"), ("learned", "learned"), ("every layer", "NoPE")]
    return next((name for key, name in named if key in reason), None)


@dataclass
class Report:
    runs: list[Run]
    groups: list[Group]
    notes: list[str]
    threshold: float
    tolerance: float
    aggregate: str | None

    @property
    def tables(self) -> list[Table]:
        return [t for g in self.groups for t in g.tables]


def build_report(
    paths: Sequence[Path | str],
    *,
    threshold: float = 0.8,
    tolerance: float = 0.10,
    aggregate: str | None = None,
    single: bool = False,
) -> Report:
    """Load the runs, group them by protocol and build every group's tables."""
    if not 0 < threshold <= 1:
        raise CtxevalError(f"--threshold must be in (0, 1], got {threshold}")
    if tolerance < 0:
        raise CtxevalError(f"--valid-tolerance must be >= 0, got {tolerance}")
    if aggregate is not None and aggregate not in AGGREGATES:
        raise CtxevalError(f"--aggregate must be token or window, got '{aggregate}'")
    runs, notes = load_runs(paths)
    groups = group_runs(runs, KINDS, aggregate, single)
    settings = Settings(threshold, tolerance)
    for group in groups:
        names = display_models(group)
        for run in group.runs:
            for model in run.models:
                if run.original_length and names[(run.order, model)] not in group.original_lengths:
                    group.original_lengths[names[(run.order, model)]] = run.original_length
                record = run.record.get("model") or {}
                group.positions[names[(run.order, model)]] = {
                    "encoding": record.get("position_encoding") or encoding_of_record(record),
                    "beyond": run.record.get("beyond_positions") or [],
                }
        kind = KINDS[group.kind]
        rows: list[dict[str, Any]] = []
        if kind.merges_rows:
            rows, group.notes = merge_rows(group)
        group.tables = kind.tables(group, rows, settings)
    kinds = Counter(g.kind for g in groups)
    for kind, n in kinds.items():
        if n > 1:
            differ = groups[[g.kind for g in groups].index(kind)].distinguishing
            notes.append(
                f"the {kind} runs differ in {', '.join(map(field_label, differ))}: shown as {n} separate tables, never mixed"
            )
    return Report(runs, groups, notes, threshold, tolerance, aggregate)
