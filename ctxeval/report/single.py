"""A run's own outputs, written into its run directory when it finishes: the one-run case of the report, built by the
same table functions (tables.py) and drawn by the same figures (plots.py) as `ctxeval report`. Nothing here prints:
each function returns the tables for the command to show."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from typing import Any, Sequence

import pandas as pd

from ..runs.rows import UNIFORM_LABEL, fmt_length
from ..runs.store import RunStore
from ..specs import MethodSpec
from ..util.paths import safe_name
from ..util.textfiles import atomic_path, write_text
from .kinds.ruler import ruler_depth_tables
from .plots import Curve, HeatmapPanel, depth_panels, method_family, plot_depth_curves, plot_heatmaps
from .tables import (
    Table,
    csv_value,
    fmt_score,
    markdown,
    ruler_effective_length,
    ruler_means,
    ruler_task_scores,
    suite_name,
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


def render_ruler(
    store: RunStore,
    specs: Sequence[MethodSpec],
    tasks: list[str],
    original: int | None,
    threshold: float,
    samples: int,
    title: str,
    notes: Sequence[str] = (),
) -> RunOutputs:
    """table.md (method x length: the mean over tasks and the effective length; per length, method x task),
    ruler.csv (every task score), summary.csv, and one task x length heatmap per method."""
    scores = ruler_task_scores(store.rows())
    means = ruler_means(scores, tasks)
    order = [s.label for s in specs]
    lengths = sorted(int(x) for x in scores["length"].unique()) if len(scores) else []
    headers = ["method", *[fmt_length(L) for L in lengths], f"effective length (> {threshold:g})"]
    rows, summary = [], []
    for label in order:
        mine = means[means["label"] == label]
        by_length = {int(L): float(v) for L, v in zip(mine["length"], mine["mean"])}
        eff = ruler_effective_length(by_length, threshold)
        rows.append(
            [
                label,
                *[fmt_score(by_length.get(L, float("nan"))) for L in lengths],
                fmt_length(eff) if eff is not None else "none",
            ]
        )
        summary.append({"method": label, **{str(L): by_length.get(L) for L in lengths}, "effective length": eff})
    caption = (
        f"{suite_name(tasks)} mean score over {len(tasks)} tasks ({', '.join(tasks)}), {samples} sample(s) per task and "
        f"length; effective length: the longest length up to which every length's mean exceeds {threshold:g} "
        f"(RULER's Llama-2-7B reference at 4k is 85.6). Original length {original}."
    )
    md = [f"# {title}\n\n{caption}\n\n", markdown(headers, rows)]
    md += [f"\n- {note}\n" for note in notes]
    by_task: dict[tuple[str, str, int], str] = {}  # the same cells for the terminal, by (method, task, length)
    for L in lengths:
        at = scores[scores["length"] == L]
        theaders = ["method", *tasks]
        trows = []
        for label in order:
            cells = {
                t: (v, st)
                for t, v, st in zip(
                    at[at["label"] == label]["ruler_task"],
                    at[at["label"] == label]["score"],
                    at[at["label"] == label]["status"],
                )
            }
            trows.append([label, *[fmt_score(*cells.get(t, (float("nan"), "missing"))) for t in tasks]])
        md += [f"\n## {fmt_length(L)}: score by task\n\n", markdown(theaders, trows)]
        by_task.update({(row[0], t, L): text for row in trows for t, text in zip(tasks, row[1:])})
    depth_printed, depth_md = render_ruler_depths(store, order, tasks, original, title)
    save_text(store.dir / "table.md", "".join(md) + depth_md)
    save_csv(scores, store.dir / "ruler.csv", index=False, float_format="%.6g")
    save_csv(pd.DataFrame(summary), store.dir / "summary.csv", index=False)
    for label in order:
        mine = scores[scores["label"] == label]
        if mine.empty:
            continue
        grid = mine.pivot_table(index="ruler_task", columns="length", values="score", aggfunc="first") / 100
        status = mine.pivot_table(index="ruler_task", columns="length", values="status", aggfunc="first")
        present = [t for t in tasks if t in grid.index]
        grid, status = grid.reindex(index=present, columns=lengths), status.reindex(index=present, columns=lengths)
        past = (
            f" (dashed: past the original length {fmt_length(original)})"
            if original and lengths and max(lengths) > original
            else ""
        )
        plot_heatmaps(
            [HeatmapPanel("", grid, status, original, row_labels=present)],
            store.dir / f"heatmap-{safe_name(label)}.png",
            f"{label}: {title}{past}",
            row_title="task",
            scale_label="score",
        )
    # in the terminal one row per (method, task) and a column per length: 80 columns hold it, 11 task columns not
    task_rows = [[label, t, *[by_task[(label, t, L)] for L in lengths]] for label in order for t in tasks]
    return RunOutputs(
        [
            Printed(title, caption, headers, rows),
            Printed(
                "RULER score by task and length", None, ["method", "task", *[fmt_length(L) for L in lengths]], task_rows
            ),
            *depth_printed,
        ],
        f"wrote {store.dir}/table.md, ruler.csv, summary.csv, heatmap-*.png"
        + (", depth-*.png" if depth_printed else ""),
    )


def render_ruler_depths(
    store: RunStore, order: Sequence[str], tasks: Sequence[str], original: int | None, title: str
) -> tuple[list[Printed], str]:
    """Per task whose rows carry a depth: its table (rows = method and length, columns = depths), the score against
    the depth (depth-<task>.png, Liu et al. 2023's figure 1) and a depth x length heatmap per method
    (depth-heatmap-<task>.png), as a markdown section; nothing when no row has a depth."""
    rows = store.rows()
    models = list(dict.fromkeys(str(r["model"]) for r in rows))
    printed, md = [], []
    for table in ruler_depth_tables("depth", rows, [(m, label) for m in models for label in order], tasks):
        if not table.rows:
            continue
        name = safe_name(table.task)
        head = f"{title} · {table.task}: score by"
        plot_depth_curves(table, lambda m, lb: lb, store.dir / f"depth-{name}.png", f"{head} the answer's depth")
        panels = depth_panels(table, lambda m, lb: lb, {m: original for m in models} if original else {})
        past = " (dashed: past the original length)" if original and max(panels[0].grid.columns) > original else ""
        heat = f"{head} depth and length{past}"
        plot_heatmaps(panels, store.dir / f"depth-heatmap-{name}.png", heat, "answer depth", "score")
        headers, cells = table.headers[1:], [row[1:] for row in table.cells]
        printed.append(Printed(table.title, table.caption, headers, cells))
        md += [f"\n## {table.title}\n\n{table.caption}\n\n", markdown(headers, cells)]
        md += [f"\n![{table.task}: score by depth](depth-{name}.png)\n"]
        md += [f"\n![{table.task}: score by depth and length](depth-heatmap-{name}.png)\n"]
    return printed, "".join(md)
