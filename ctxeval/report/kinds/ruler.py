"""The ruler kind (RULER's tasks and the retrieval suites run by `ctxeval ruler`): its protocol key (the tasks,
samples, seed, essays, template, threshold); the table of the mean task score by length with the effective length,
and a table by depth for each task whose rows carry one; the mean-score curves, and per depth task the score against
the answer's depth and a depth x length heatmap per method."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from ...runs.rows import MISSING, fmt_length
from ...util.paths import safe_name
from ..figures import curve_label, figure_title, free_name, group_curves, heading, originals_legend
from ..kind import FigureSpace, Kind, Settings
from ..plots import depth_panels, plot_curves, plot_depth_curves, plot_heatmaps
from ..runs import Group, Run, row_order
from ..tables import (
    Table,
    fmt_score,
    number,
    ruler_depth_scores,
    ruler_effective_length,
    ruler_means,
    ruler_task_scores,
    suite_name,
)

# a RULER depth table's figures: key suffix -> what each shows
DEPTH_FIGURES = {
    "by-depth": "score by the answer's depth (lost in the middle)",
    "depth-heatmap": "score by depth and length",
}


def protocol_key(run: Run, aggregate: str | None = None) -> dict[str, Any]:
    spec = run.spec
    return {
        "tasks": spec.get("tasks"),
        "samples": spec.get("samples"),
        "seed": spec.get("seed"),
        "essays": spec.get("essays"),
        "essay_sha256": spec.get("essay_sha256"),
        "samples_from": spec.get("samples_from"),
        "template": spec.get("template"),
        "threshold": (run.record.get("protocol") or {}).get("threshold"),
    }


def tables(group: Group, rows: list[dict[str, Any]], settings: Settings) -> list[Table]:
    depths = ruler_depth_tables(group.id, rows, row_order(group, rows), group.key.get("tasks") or [])
    return [ruler_table(group, rows), *depths]


def ruler_table(group: Group, rows: list[dict[str, Any]]) -> Table:
    """Rows = model x method, columns = length: RULER's mean over the group's tasks, then the effective length."""
    tasks = list(group.key.get("tasks") or [])
    threshold = group.ruler_threshold
    means = ruler_means(ruler_task_scores(rows), tasks)
    lengths = sorted(int(x) for x in means["length"].unique())
    raw, status, shown = [], [], []
    for model, label in row_order(group, rows):
        mine = means[(means["model"].astype(str) == model) & (means["label"].astype(str) == label)]
        by_length = {int(L): float(v) for L, v in zip(mine["length"], mine["mean"])}
        vals = [number(by_length.get(L)) for L in lengths]
        eff = ruler_effective_length(by_length, threshold)
        raw.append([model, label, *vals, eff])
        status.append(
            [None, None, *[None if v is not None else "missing" for v in vals], None if eff is not None else "none"]
        )
        shown.append(
            [
                model,
                label,
                *[fmt_score(v if v is not None else float("nan")) for v in vals],
                fmt_length(eff) if eff is not None else "none",
            ]
        )
    caption = (
        f"{suite_name(tasks)} mean score over {len(tasks)} task(s) ({', '.join(tasks)}), {group.key.get('samples')} sample(s) "
        f"each; effective length: every length up to it has a mean above {threshold:g}."
    )
    return Table(
        group.id,
        "ruler",
        group.title,
        ["model", "method", *map(str, lengths), "effective length"],
        ["model", "method", *map(fmt_length, lengths), f"effective length (> {threshold:g})"],
        raw,
        status,
        shown,
        caption=caption,
    )


DEPTH_CAPTION = (
    "{task}: the score (%, as RULER's) by where the answer sits in the context (depth: 0% = at the start, "
    "100% = at the end; {binned}), the mean over the samples at that depth, per method and length; a depth with a "
    "failed sample shows the failure (as the RULER table: never a 0; the figures leave it out of its line), a depth "
    "never measured {missing}."
)


def depth_table(table_id: str, task: str, scores: pd.DataFrame, pairs: Sequence[tuple[str, str]]) -> Table:
    """One task's depth table: rows = (model, method, length), columns = the task's depths, the score (%) at each,
    from ruler_depth_scores' rows for the task."""
    axis = scores.drop_duplicates("depth").sort_values("depth")
    depths, labels = [float(x) for x in axis["depth"]], [str(x) for x in axis["depth_label"]]
    lengths = sorted({int(L) for L in scores["length"]})
    cell = {
        (str(m), str(lb), int(L), float(x)): (number(v), str(st))
        for m, lb, L, x, v, st in zip(*(scores[c] for c in ("model", "label", "length", "depth", "score", "status")))
    }
    raw, status, shown = [], [], []
    for model, label in pairs:
        for length in lengths:
            found = [cell.get((model, label, length, x), (None, "missing")) for x in depths]
            if all(st == "missing" for _, st in found):
                continue
            sts = [None if v is not None else st for v, st in found]
            raw.append([model, label, length, *(v for v, _ in found)])
            status.append([None, None, None, *sts])
            shown.append([model, label, fmt_length(length), *(fmt_score(v, st) for v, st in found)])
    binned = any("-" in text for text in labels)
    caption = DEPTH_CAPTION.format(
        task=task,
        binned="depths binned into equal ranges" if binned else "one column per depth",
        missing=MISSING,
    )
    return Table(
        table_id,
        "ruler-depth",
        f"{task}: score by depth",
        ["model", "method", "length", *(text.rstrip("%") for text in labels)],
        ["model", "method", "length", *labels],
        raw,
        status,
        shown,
        caption=caption,
        task=task,
        depths=depths,
    )


def ruler_depth_tables(
    group_id: str, rows: list[dict[str, Any]], pairs: Sequence[tuple[str, str]], tasks: Sequence[str]
) -> list[Table]:
    """One depth table per task whose rows carry a depth (in the order of `tasks`); [] when none does."""
    scores = ruler_depth_scores(rows)
    present = [t for t in dict.fromkeys([*tasks, *map(str, scores["ruler_task"])]) if t in set(scores["ruler_task"])]
    return [
        depth_table(f"{group_id}-depth-{safe_name(task).lower()}", task, scores[scores["ruler_task"] == task], pairs)
        for task in present
    ]


def depth_figures(group: Group, out_dir: Path, stem: str, taken: set[str]) -> dict[str, str]:
    """A RULER group's depth tables drawn: per task, the score against the answer's depth (a panel per length, a line
    per method) and one depth x length heatmap per method, as `<stem>-<task>-by-depth.png` and
    `-depth-heatmap.png`; returns key (`<table id>-by-depth`, `<table id>-depth-heatmap`) -> file name."""
    images: dict[str, str] = {}
    for table in (t for t in group.tables if t.kind == "ruler-depth" and t.rows):
        base = f"{stem}-{safe_name(table.task).lower()}"
        by_depth = free_name(f"{base}-by-depth", taken)
        plot_depth_curves(
            table,
            lambda m, lb: curve_label(group, m, lb),
            out_dir / by_depth,
            figure_title(group, f"{table.task}, score by the answer's depth"),
        )
        heat = free_name(f"{base}-depth-heatmap", taken)
        panels = depth_panels(table, lambda m, lb: curve_label(group, m, lb), group.original_lengths)
        dashed = any(p.original_length and max(p.grid.columns) > p.original_length for p in panels)
        what = "score by depth and length" + (" (dashed: past the original length)" if dashed else "")
        plot_heatmaps(panels, out_dir / heat, figure_title(group, f"{table.task}, {what}"), "answer depth", "score")
        images.update({f"{table.id}-by-depth": by_depth, f"{table.id}-depth-heatmap": heat})
    return images


def figures(group: Group, space: FigureSpace) -> dict[str, str]:
    """The mean score by length (the threshold on the same axis), then the depth tables' figures."""
    curves = group_curves(group, value_columns=len(group.tables[0].columns) - 3)
    threshold = group.ruler_threshold
    plot_curves(
        curves,
        space.main,
        title=figure_title(group, "mean score by length"),
        xlabel="context length (tokens)",
        ylabel="RULER mean score",
        originals=originals_legend(group),
        threshold=threshold,
        threshold_label=f"threshold {threshold:g}",
        ylim=(-2, 102),
    )
    return {group.id: space.main.name, **depth_figures(group, space.out_dir, space.stem, space.taken)}


def caption(group: Group, part: str) -> str | None:
    for table in (t for t in group.tables if t.kind == "ruler-depth"):
        for suffix, what in DEPTH_FIGURES.items():
            if f"{group.id}-{part}" == f"{table.id}-{suffix}":
                return f"{heading(group)}: {table.task}, {what}"
    return None


KIND = Kind("ruler", "RULER", protocol_key, tables, figures, caption)
