"""The needle and passkey kinds: their protocol key (the needle preset, haystack, depths, samples, seed, scoring,
generation budget, chat template, snap; passkey also its protocol and BOS); one table of mean accuracy by length
with the effective length (passkey: with the YaRN paper's passkey context and accuracy); the needle's depth x
length heatmaps and the passkey's accuracy curves."""

from __future__ import annotations

import math
from typing import Any, Sequence

import pandas as pd

from ...runs.rows import BEYOND_POSITIONS, fmt_length
from ...runs.store import RunStore
from ...specs import MethodSpec
from ...util.paths import safe_name
from ..figures import curve_figure, curve_label, figure_title
from ..kind import FigureSpace, Kind, Settings
from ..plots import HeatmapPanel, plot_curves, plot_heatmaps
from ..runs import Group, Run, row_order
from ..single import Printed, RunOutputs, frame_curves, isna, save_csv, save_text
from ..tables import (
    Table,
    accuracy_grid,
    effective_length,
    fmt_acc,
    markdown,
    needle_long,
    needle_summary,
    number,
    passkey_summary,
    yarn_passkey_figures,
)


def protocol_key(run: Run, aggregate: str | None = None) -> dict[str, Any]:
    spec = run.spec
    preset = spec.get("preset")
    key: dict[str, Any] = {}
    if isinstance(preset, dict):
        key["preset"] = preset.get("name")
        key.update({f"preset.{k}": v for k, v in preset.items() if k != "name"})
    else:
        key["preset"] = preset or (run.rows[0].get("preset"))
    key.update(
        {
            "haystack": spec.get("haystack"),
            "text_field": spec.get("text_field", "text"),
            "depths": "random" if run.task == "passkey" or spec.get("random_depth") else spec.get("depths"),
            "samples": spec.get("samples"),
            "seed": spec.get("seed", run.record.get("seed")),
            "scoring": spec.get("scoring", run.rows[0].get("scoring")),
            "max_new_tokens": spec.get("max_new_tokens"),
            "chat_template": spec.get("chat_template"),
            "snap": spec.get("snap"),
        }
    )
    if run.task == "passkey":  # runs made before --protocol existed used ctxeval's layout with BOS
        key.update({"protocol": spec.get("protocol", "ctxeval"), "bos": spec.get("bos", True)})
    return key


def tables(group: Group, rows: list[dict[str, Any]], settings: Settings) -> list[Table]:
    return [accuracy_table(group, rows, settings.threshold)]


def accuracy_table(group: Group, rows: list[dict[str, Any]], threshold: float) -> Table:
    df = needle_long(rows)
    df["model"] = df["model"].astype(str)
    df["label"] = df["label"].astype(str)
    lengths = sorted(int(x) for x in df["length"].unique())
    pairs = row_order(group, rows)
    means = df[df["status"] == "ok"].groupby(["model", "label", "length"])["correct"].mean()
    seen = df.groupby(["model", "label", "length"])["status"].agg(
        lambda s: "ok" if (s == "ok").any() else str(s.iloc[0])
    )
    passkey = group.kind == "passkey"
    columns = ["model", "method", *map(str, lengths), "effective length"] + (
        ["passkey context", "passkey accuracy"] if passkey else []
    )
    headers = ["model", "method", *map(fmt_length, lengths), f"effective length (>= {threshold:.0%})"] + (
        [f"passkey context (YaRN: longest >= {threshold:.0%})", "passkey accuracy"] if passkey else []
    )
    raw, status, shown = [], [], []
    late_start = False
    for model, label in pairs:
        vals, sts = [], []
        beyond = (group.positions.get(model) or {}).get("beyond") or []
        for length in lengths:
            st = seen.get((model, label, length), "missing")
            st = BEYOND_POSITIONS if st == "missing" and length in beyond else st
            vals.append(number(means.get((model, label, length))) if st == "ok" else None)
            sts.append(None if st == "ok" else st)
        evaluated = {L: (v if v is not None else float("nan")) for L, v, s in zip(lengths, vals, sts) if s != "missing"}
        ctx = effective_length(pd.Series(evaluated, dtype=float), threshold) if evaluated else None
        late = bool(evaluated) and min(evaluated) > lengths[0]
        late_start |= late
        ctx_text = (fmt_length(ctx) if ctx is not None else "none") + ("†" if late else "")
        row_raw = [model, label, *vals, ctx]
        row_st: list[str | None] = [None, None, *sts, None if ctx is not None else "none"]
        row_shown = [
            model,
            label,
            *(fmt_acc(v if v is not None else float("nan"), s) for v, s in zip(vals, sts)),
            ctx_text,
        ]
        if passkey:  # the YaRN paper's figures (Table 5): no contiguity required
            yarn_ctx, yarn_mean = yarn_passkey_figures(pd.Series(evaluated, dtype=float), threshold)
            mean = None if math.isnan(yarn_mean) else yarn_mean
            row_raw += [yarn_ctx, mean]
            row_st += [None if yarn_ctx is not None else "none", None if mean is not None else "missing"]
            row_shown += [
                fmt_length(yarn_ctx) if yarn_ctx is not None else "none",
                fmt_acc(mean if mean is not None else float("nan")),
            ]
        raw.append(row_raw)
        status.append(row_st)
        shown.append(row_shown)
        if not passkey:
            grid, gstatus = accuracy_grid(df[df["model"] == model], label)
            depths = sorted(df["depth"].astype(float).unique())
            group.grids[(model, label)] = (
                grid.reindex(index=depths, columns=lengths),
                gstatus.reindex(index=depths, columns=lengths),
            )
    what = "samples at random depths" if passkey else "depths and samples"
    caption = (
        f"Mean accuracy over {what}, scored without an LLM judge; effective length: the longest length such "
        f"that every evaluated length up to it has mean accuracy >= {threshold:.0%}."
        + (
            f" Passkey context and accuracy as the YaRN paper (Table 5): the longest length with accuracy >= "
            f"{threshold:.0%}, and the mean accuracy of the lengths up to it."
            if passkey
            else ""
        )
    )
    footnotes = (
        ["† not evaluated at the table's shorter lengths: counted from the shortest length it was evaluated at"]
        if late_start
        else []
    )
    return Table(group.id, group.kind, group.title, columns, headers, raw, status, shown, caption, footnotes)


def needle_figures(group: Group, space: FigureSpace) -> dict[str, str]:
    """The needle heatmaps (depth x length) of every model x method, in the table's row order."""
    if not group.grids:
        return {}
    panels = [
        HeatmapPanel(curve_label(group, model, label), grid, status, group.original_lengths.get(model))
        for (model, label), (grid, status) in (
            (pair, group.grids[pair]) for pair in ((r[0], r[1]) for r in group.tables[0].rows) if pair in group.grids
        )
    ]
    dashed = any(p.original_length and max(p.grid.columns) > p.original_length for p in panels)
    plot_heatmaps(
        panels,
        space.main,
        figure_title(group, "accuracy by depth and length" + (" (dashed: past the original length)" if dashed else "")),
    )
    return {group.id: space.main.name}


def passkey_figures(group: Group, space: FigureSpace) -> dict[str, str]:
    """Passkey accuracy against length (0-100%, the threshold on the same axis)."""
    return curve_figure(
        group,
        space,
        "accuracy by length",
        "context length (tokens)",
        "accuracy",
        value_columns=len(group.tables[0].columns) - 5,  # + 3 summary columns
        skip_empty=False,
        threshold=space.settings.threshold,
        y_percent=True,
    )


def render_retrieval(
    store: RunStore, task: str, specs: Sequence[MethodSpec], original: int | None, threshold: float, title: str
) -> RunOutputs:
    """Per method a heatmap + accuracy table (depth x length); a summary (method x length) with the effective
    length; for passkey (random depths: no heatmap) the passkey context and passkey.png, accuracy by length per
    method with the threshold, both in percent."""
    df = needle_long(store.rows())
    order = [s.label for s in specs]
    summary = needle_summary(df, order, threshold)
    lengths = [c for c in summary.columns if c != "effective length"]
    headers = ["method"] + [fmt_length(c) for c in lengths] + [f"effective length (>= {threshold:.0%})"]
    rows = [
        [label]
        + [fmt_acc(summary.loc[label, c]) for c in lengths]
        + [
            fmt_length(int(summary.loc[label, "effective length"]))
            if not isna(summary.loc[label, "effective length"])
            else "none"
        ]
        for label in summary.index
    ]
    md = [
        f"# {title}\n\n",
        f"Mean accuracy over depths and samples; scoring without an LLM judge. Original length {original}.\n\n",
        markdown(headers, rows),
    ]
    printed: list[Printed] = []
    if task == "passkey":
        pk = passkey_summary(df, order, threshold)
        pheaders = ["method", "passkey context", "passkey accuracy"]
        prow = [
            [
                r["method"],
                fmt_length(int(r["passkey context"])) if not isna(r["passkey context"]) else "none",
                fmt_acc(r["passkey accuracy"]),
            ]
            for _, r in pk.iterrows()
        ]
        pcaption = (
            f"Passkey context: the longest evaluated length with accuracy >= {threshold:.0%}; passkey "
            "accuracy: the mean accuracy over the evaluated lengths up to it (YaRN, Table 5). The effective "
            "length above also requires every shorter length to pass."
        )
        md += [
            f"\n## Passkey context and accuracy (the YaRN paper's figures)\n\n{pcaption}\n\n",
            markdown(pheaders, prow),
        ]
        printed.append(Printed("passkey context and accuracy (the YaRN paper's figures)", pcaption, pheaders, prow))
        save_csv(pk, store.dir / "passkey.csv", index=False)
        plot_curves(
            frame_curves(summary[lengths]),
            store.dir / "passkey.png",
            title=f"{title}: accuracy by length",
            xlabel="context length (tokens)",
            ylabel="accuracy",
            originals={original: f"original length {fmt_length(original)}"} if original else None,
            threshold=threshold,
            y_percent=True,
        )
    for label in summary.index:
        grid, status = accuracy_grid(df, label)
        if task != "passkey":
            gh = ["depth"] + [fmt_length(c) for c in grid.columns]
            gr = [[f"{d:g}%"] + [fmt_acc(grid.loc[d, c], status.loc[d, c]) for c in grid.columns] for d in grid.index]
            md += [f"\n## {label}: accuracy by depth and length\n\n", markdown(gh, gr)]
            past = (
                f" (dashed: past the original length {fmt_length(original)})"
                if original and max(grid.columns) > original
                else ""
            )
            plot_heatmaps(
                [HeatmapPanel("", grid, status, original)],
                store.dir / f"heatmap-{safe_name(label)}.png",
                f"{label}: {title}{past}",
            )
    save_text(store.dir / "table.md", "".join(md))
    export = summary.copy()
    export.index.name = "method"
    save_csv(export, store.dir / "summary.csv")
    caption = f"mean accuracy; effective length = longest length with every shorter length >= {threshold:.0%}"
    return RunOutputs(
        [Printed(title, caption, headers, rows), *printed],
        f"wrote {store.dir}/table.md, summary.csv"
        + (", heatmap-*.png" if task != "passkey" else ", passkey.csv, passkey.png"),
    )


NEEDLE = Kind("needle", "Needle in a haystack", protocol_key, tables, needle_figures)
PASSKEY = Kind("passkey", "Passkey retrieval", protocol_key, tables, passkey_figures)
