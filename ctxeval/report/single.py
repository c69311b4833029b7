"""A run's own outputs, written into its run directory when it finishes: the one-run case of the report, built by the
same table functions (tables.py) and drawn by the same figures (plots.py) as `ctxeval report`. Nothing here prints:
each function returns the tables for the command to show."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import pandas as pd

from ..runs.rows import BEYOND_POSITIONS, MISSING, UNIFORM_LABEL, fmt_length
from ..runs.store import RunStore
from ..specs import MethodSpec
from ..util.paths import safe_name
from ..util.textfiles import atomic_path, write_text
from .kinds.ruler import ruler_depth_tables
from .plots import Curve, HeatmapPanel, depth_panels, method_family, plot_curves, plot_depth_curves, plot_heatmaps
from .tables import (
    NOT_REACHED_NOTE,
    Table,
    accuracy_grid,
    bucket_center,
    bucket_label,
    csv_value,
    entropy_tables,
    fmt_acc,
    fmt_ppl,
    fmt_score,
    longppl_long,
    markdown,
    needle_long,
    needle_summary,
    passkey_summary,
    positions_long,
    ppl_cells,
    ppl_long,
    ppl_wide,
    ruler_effective_length,
    ruler_means,
    ruler_task_scores,
    status_wide,
    suite_name,
    valid_cells,
    valid_lengths,
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


def _isna(value: Any) -> bool:
    return value is None or bool(pd.isna(value))


def _curves(wide: pd.DataFrame) -> list[Curve]:
    """One curve per row of a [label x length] table; the uniform-entropy row is a reference line."""
    curves = []
    for label, series in wide.iterrows():
        points = [(int(c), float(v)) for c, v in series.items() if not _isna(v)]
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


VALID_CAPTION = (
    "Both valid lengths go up from the reference length (the original length, or the longest evaluated "
    "length below it) and stop at the first length that fails. Own: ppl within the tolerance of the "
    "method's own ppl at the reference (how gracefully it degrades). Vs base: within the tolerance of "
    "the unmodified model's ppl there (`native`, else `none`): how far it goes without paying. " + NOT_REACHED_NOTE
)
POSITIONS_CAPTION = (
    "Perplexity of the tokens predicted from p tokens of context (bucket start <= p < stop), "
    "token-weighted over the documents, from each method's forward at its longest length (a "
    "length-dependent method: its forward at that length only)."
)
LONGPPL_CAPTION = (
    "LongPPL (Fang et al. 2025): perplexity over the key tokens only, the tokens the evaluator "
    "predicts much better with the long context; every method is scored on the same tokens. "
    "Over documents as PKU-ML/LongPPL aggregates them: exp(summed key-token NLL / key tokens), the "
    "key-token-weighted geometric mean of the documents' LongPPL."
)


def position_curves(pos: pd.DataFrame, multi_model: bool = False) -> tuple[list[Curve], list[int]]:
    """Loss-by-position rows -> one curve per (model, method) at the bucket centres, and the bucket edges as ticks."""
    curves, edges = [], set()
    one_length = pos["length"].nunique() == 1  # then the title says it, not every legend entry
    for (model, label), g in pos.groupby(["model", "label"], sort=False):
        g = g.sort_values("start")
        edges |= set(int(x) for x in g["start"]) | set(int(x) for x in g["stop"])
        name = f"{model} · {label}" if multi_model else str(label)
        at = "" if one_length else f" (at {fmt_length(int(g['length'].iloc[0]))})"
        curves.append(
            Curve(
                name + at,
                method_family(str(label)),
                [bucket_center(a, b) for a, b in zip(g["start"], g["stop"])],
                [float(v) for v in g["ppl"]],
            )
        )
    return curves, sorted(edges)


def position_tables(pos: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Rows = method, columns = position buckets (the ppl of each)."""
    buckets = sorted({(int(a), int(b)) for a, b in zip(pos["start"], pos["stop"])})
    headers = ["method", "at"] + [bucket_label(a, b) for a, b in buckets]
    rows = []
    for label, g in pos.groupby("label", sort=False):
        cell = {(int(a), int(b)): v for a, b, v in zip(g["start"], g["stop"], g["ppl"])}
        rows.append(
            [str(label), fmt_length(int(g["length"].iloc[0]))]
            + [fmt_ppl(cell[k]) if k in cell else MISSING for k in buckets]
        )
    return headers, rows


def render_positions(store: RunStore, original_length: int, title: str) -> tuple[list[Printed], str]:
    """positions.csv / positions.png and the markdown section; nothing when the rows carry no position sums."""
    pos = positions_long(store.rows())
    if pos.empty:
        return [], ""
    save_csv(pos.rename(columns={"label": "method"}), store.dir / "positions.csv", index=False, float_format="%.6g")
    curves, edges = position_curves(pos)
    at = f" (forwards of {fmt_length(int(pos['length'].iloc[0]))} tokens)" if pos["length"].nunique() == 1 else ""
    plot_curves(
        curves,
        store.dir / "positions.png",
        title=f"Loss by position: {title}{at}",
        xlabel="tokens of context the prediction had (bucket centres; ticks at bucket edges)",
        ylabel="perplexity of the bucket's tokens",
        originals={original_length: f"original length {fmt_length(original_length)}"},
        log_y=True,
        x_ticks=edges,
    )
    headers, rows = position_tables(pos)
    section = f"\n## Loss by position\n\n{POSITIONS_CAPTION}\n\n" + markdown(headers, rows)
    return [Printed("perplexity by position (tokens of context)", None, headers, rows)], section


def render_longppl(store: RunStore, specs: Sequence[MethodSpec]) -> tuple[list[Printed], str]:
    """longppl.csv and its markdown section, when the run found key tokens (--key-tokens)."""
    lp = longppl_long(store.rows())
    if lp.empty:
        return [], ""
    save_csv(lp.rename(columns={"label": "method"}), store.dir / "longppl.csv", index=False, float_format="%.6g")
    lengths = sorted(lp["length"].unique())
    order = [s.label for s in specs if s.label in set(lp["label"])]
    cell = {(r.label, int(r.length)): (r.longppl, r.status) for r in lp.itertuples()}
    counts = lp.groupby("length")["key_tokens"].max()
    headers = ["method"] + [fmt_length(int(L)) for L in lengths]
    rows = [
        [label] + [fmt_ppl(*cell.get((label, int(L)), (float("nan"), "missing"))) for L in lengths] for label in order
    ]
    rows.append(
        ["key tokens (count)"] + [f"{int(counts[L]):,}" if counts[L] == counts[L] else MISSING for L in lengths]
    )
    key = store.record.get("key_tokens") or {}
    caption = (
        LONGPPL_CAPTION + f" Evaluator: {key.get('evaluator')} under {key.get('method')}; short context "
        f"{key.get('context')} (stride {key.get('window')}); alpha {key.get('alpha')}, beta {key.get('beta')}."
    )
    section = f"\n## LongPPL (key tokens)\n\n{caption}\n\n" + markdown(headers, rows)
    return [Printed("LongPPL (perplexity over the key tokens)", caption, headers, rows)], section


def render_ppl(
    store: RunStore, specs: Sequence[MethodSpec], original_length: int, aggregate: str, tolerance: float, title: str
) -> RunOutputs:
    """table.md / table.csv / valid.csv / ppl.png in the run directory."""
    long = ppl_long(store.rows(), aggregate)
    wide = ppl_wide(long, [s.label for s in specs])
    status = status_wide(long, wide)
    for length in store.record.get("beyond_positions") or []:  # past a learned position table: measured as failed
        if int(length) not in wide.columns:
            wide[int(length)], status[int(length)] = float("nan"), BEYOND_POSITIONS
    wide, status = wide.sort_index(axis=1), status.sort_index(axis=1)
    valid = valid_lengths(wide, original_length, tolerance, status)
    headers, rows = ppl_cells(wide, status)
    vheaders, vrows = valid_cells(valid)
    n_docs = int(long["n_docs"].max()) if len(long) else 0
    caption = f"Perplexity ({aggregate}-weighted over {n_docs} document(s)); original length {original_length}."
    position_printed, position_md = render_positions(store, original_length, title)
    longppl_printed, longppl_md = render_longppl(store, specs)
    save_text(
        store.dir / "table.md",
        f"# {title}\n\n{caption}\n\n"
        + markdown(headers, rows)
        + longppl_md
        + f"\n## Valid length (ppl within {tolerance:.0%})\n\n{VALID_CAPTION}\n\n"
        + markdown(vheaders, vrows)
        + position_md,
    )
    export = wide.copy()
    export.index.name = "method"
    save_csv(export, store.dir / "table.csv", float_format="%.6g")
    save_csv(valid, store.dir / "valid.csv", index=False, float_format="%.6g")
    plot_curves(
        _curves(wide),
        store.dir / "ppl.png",
        title=title,
        xlabel="evaluation length (tokens)",
        ylabel="perplexity",
        originals={original_length: f"original length {fmt_length(original_length)}"},
        log_y=True,
    )
    extra = (", positions.csv, positions.png" if position_printed else "") + (
        ", longppl.csv" if longppl_printed else ""
    )
    return RunOutputs(
        [
            Printed(title, caption, headers, rows),
            *longppl_printed,
            Printed(f"valid length (ppl within {tolerance:.0%})", None, vheaders, [[str(c) for c in r] for r in vrows]),
            *position_printed,
        ],
        f"wrote {store.dir}/table.md, table.csv, valid.csv, ppl.png{extra}",
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
            if not _isna(summary.loc[label, "effective length"])
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
                fmt_length(int(r["passkey context"])) if not _isna(r["passkey context"]) else "none",
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
            _curves(summary[lengths]),
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


def render_entropy(store: RunStore, specs: Sequence[MethodSpec], original_length: int, title: str) -> RunOutputs:
    """table.md / entropy.csv / entropy-layers.csv / entropy.png in the run directory."""
    wide, layers = entropy_tables(store.rows(), [s.label for s in specs])
    if wide.empty:
        return RunOutputs(notes=["no entropy was measured (every point failed); see rows.jsonl"])

    def cell(value: float) -> str:
        return MISSING if math.isnan(value) else f"{value:.3f}"

    headers = ["method", *[fmt_length(int(c)) for c in wide.columns]]
    rows = [[str(label), *[cell(v) for v in series]] for label, series in wide.iterrows()]
    lheaders = ["method", "layer", *[fmt_length(int(c)) for c in layers.columns]]
    lrows = [[str(i[0]), str(i[1]), *[cell(v) for v in series]] for i, series in layers.iterrows()]
    caption = (
        f"Mean attention entropy in nats (over layers, heads, query positions and documents); original length "
        f"{original_length}. 'uniform' = mean ln(i+1), the entropy if every query attended evenly."
    )
    save_text(
        store.dir / "table.md",
        f"# {title}\n\n{caption}\n\n" + markdown(headers, rows) + "\n## Per layer\n\n" + markdown(lheaders, lrows),
    )
    save_csv(wide.rename_axis("method"), store.dir / "entropy.csv", float_format="%.6g")
    save_csv(layers, store.dir / "entropy-layers.csv", float_format="%.6g")
    plot_curves(
        _curves(wide),
        store.dir / "entropy.png",
        title=title,
        xlabel="context length (tokens)",
        ylabel="mean attention entropy (nats)",
        originals={original_length: f"original length {fmt_length(original_length)}"},
    )
    return RunOutputs(
        [Printed(title, caption, headers, rows)],
        f"wrote {store.dir}/table.md, entropy.csv, entropy-layers.csv, entropy.png",
    )


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
