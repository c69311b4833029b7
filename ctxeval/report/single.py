"""What every kind's run outputs share (each kind writes a run's own files from its module in report/kinds/, with
the same table functions and figures as `ctxeval report`): files written atomically, a report table as a wide CSV,
the tables a command prints (Printed) and what a run's rendering returns (RunOutputs), a table as curves. Nothing
here prints: the command shows what it gets back."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..runs.rows import UNIFORM_LABEL
from ..util.textfiles import atomic_path, write_text
from .plots import Curve, method_family
from .tables import (
    Table,
    csv_value,
)


def save_text(path: Any, text: str) -> None:
    """A run's own table file, written atomically (a full disk is one line, the old file stays whole)."""
    write_text(path, text, "run table")


def save_csv(frame: pd.DataFrame, path: Any, **options: Any) -> None:
    """A run's own CSV, written atomically."""
    with atomic_path(path, "run table") as tmp:
        frame.to_csv(tmp, **options)


def table_csv(table: Table) -> str:
    """One report table as a wide CSV (the markdown's shape, raw values; missing = empty): a run's lm-eval
    table.csv and `ctxeval report`'s per-table CSVs."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(table.columns)
    for row in table.rows:
        w.writerow(row[:2] + [csv_value(v) for v in row[2:]])
    return buf.getvalue()


@dataclass(frozen=True)
class Printed:
    """A table as the command shows it on stdout."""

    title: str
    caption: str | None
    headers: list[str]
    rows: list[list[str]]


@dataclass
class RunOutputs:
    """What a run's rendering wrote and what the command shows."""

    tables: list[Printed] = field(default_factory=list)
    wrote: str = ""  # the 'wrote ...' line
    notes: list[str] = field(default_factory=list)


def isna(value: Any) -> bool:
    return value is None or bool(pd.isna(value))


def frame_curves(wide: pd.DataFrame) -> list[Curve]:
    """One curve per row of a [label x length] table; the uniform-entropy row is a reference line."""
    curves = []
    for label, series in wide.iterrows():
        points = [(int(c), float(v)) for c, v in series.items() if not isna(v)]
        reference = str(label) == UNIFORM_LABEL
        curves.append(
            Curve(
                "uniform attention (ln of visible keys)" if reference else str(label),
                method_family(str(label)),
                [p[0] for p in points],
                [p[1] for p in points],
                reference,
            )
        )
    return curves
