"""The ruler kind (RULER's tasks and the retrieval suites run by `ctxeval ruler`): its protocol key (the tasks,
samples, seed, essays, template, threshold); the table of the mean task score by length with the effective length,
and a table by depth for each task whose rows carry one; the mean-score curves, and per depth task the score against
the answer's depth and a depth x length heatmap per method; a ruler run's own outputs (render_ruler)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from ...runs.rows import MISSING, fmt_length
from ...runs.store import RunStore
from ...specs import MethodSpec
from ...util.paths import safe_name
from ..figures import curve_figure, curve_label, figure_title, free_name, heading
from ..kind import FigureSpace, Kind, Settings
from ..plots import HeatmapPanel, depth_panels, plot_depth_curves, plot_heatmaps
from ..runs import Group, Run, row_order
from ..single import Printed, RunOutputs, save_csv, save_text
from ..tables import (
    Table,
    fmt_score,
    markdown,
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
    threshold = group.ruler_threshold
    main = curve_figure(
        group,
        space,
        "mean score by length",
        "context length (tokens)",
        "RULER mean score",
        value_columns=len(group.tables[0].columns) - 3,
        skip_empty=False,
        threshold=threshold,
        threshold_label=f"threshold {threshold:g}",
        ylim=(-2, 102),
    )
    return {**main, **depth_figures(group, space.out_dir, space.stem, space.taken)}


def caption(group: Group, part: str) -> str | None:
    for table in (t for t in group.tables if t.kind == "ruler-depth"):
        for suffix, what in DEPTH_FIGURES.items():
            if f"{group.id}-{part}" == f"{table.id}-{suffix}":
                return f"{heading(group)}: {table.task}, {what}"
    return None


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


KIND = Kind("ruler", "RULER", protocol_key, tables, figures, caption)
