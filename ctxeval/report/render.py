"""A report as files and text: markdown, one tidy CSV, one wide CSV per table, JSON (with how it was made) and
one figure per protocol group (a tune group: its runs' search figures). Headings and figure titles stay short (the
kind, the models, what is plotted); the protocol goes to the line under the heading and the HTML page's captions."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

from ..errors import CtxevalError
from ..runs.rows import UNIFORM_LABEL, UNIFORM_MODEL, fmt_length
from ..runs.store import RUN_FILE, environment, now_utc
from ..util.paths import safe_name
from ..util.textfiles import finite_json, read_json, write_text
from .merged import Report
from .plots import Curve, HeatmapPanel, depth_panels, method_family, plot_curves, plot_depth_curves, plot_heatmaps
from .runs import Group, field_label, fmt_value, is_report_dir
from .single import table_csv
from .tables import Table, bucket_center, csv_value, markdown, number
from .tune import draw as draw_tune
from .tune_data import read_tune

__all__ = ["table_csv"]  # kept importable from here: single.py holds it so that a run's lm-eval table can use it

# characters of a group's heading (markdown ## and the HTML page's h2): one line in the page's 1,264 px column
HEADING_MAX = 110
# a tune run's figures (tune.py draws them into a run directory as tune-<part>.png): part -> what each shows
TUNE_FIGURES = {
    "objective": "perplexity at the target by trial, with the best so far",
    "pareto": "perplexity at the trained length against the target, the Pareto front, the guard",
    "factors": "the winner's per-pair scale against PI, NTK and YaRN",
}


def compact_field(field: str, value: Any) -> str:
    """A protocol field for a heading: a list of more than three items counted (`11 tasks`), a remark in brackets
    left out (`essays austen`)."""
    if isinstance(value, (list, tuple)) and len(value) > NAME_LIST_MAX:
        return f"{len(value)} {field_label(field)}"
    return f"{field_label(field)} {re.sub(r' [(].*$', '', fmt_value(value))}"


def heading(group: Group) -> str:
    """The group's heading: its title (kind, number, what sets it apart) within HEADING_MAX characters; a longer
    one counts its long lists and drops remarks, then stops at a field boundary with '...'. The line under the
    heading (`Protocol: ...`) keeps every field whole."""
    title = group.title
    if len(title) <= HEADING_MAX:
        return title
    title = f"{group.short_title}: " + ", ".join(compact_field(f, group.key.get(f)) for f in group.distinguishing)
    if len(title) <= HEADING_MAX:
        return title
    cut = title.rfind(", ", 0, HEADING_MAX - 4)
    return (title[:cut] if cut > len(group.short_title) else title[: HEADING_MAX - 4]) + ", ..."


def group_models(group: Group) -> list[str]:
    """The models of a group's runs, by their last path part, in order."""
    return list(dict.fromkeys(Path(m).name or m for run in group.runs for m in run.models))


# a RULER depth table's figures: key suffix -> what each shows
DEPTH_FIGURES = {
    "by-depth": "score by the answer's depth (lost in the middle)",
    "depth-heatmap": "score by depth and length",
}


def figure_title(group: Group, what: str) -> str:
    """A figure's title, one short line: the kind (and number), the models, what is plotted."""
    models = group_models(group)
    who = ", ".join(models) if len(models) <= NAME_LIST_MAX else f"{len(models)} models"
    return f"{group.short_title} · {who}: {what}"


def tune_runs(group: Group) -> list[Any]:
    return sorted(group.runs, key=lambda r: r.order)


def figure_caption(group: Group, key: str) -> str:
    """What one of the group's figures shows (`key` as write_plots returns it): the group's heading (a tune run's
    figure: the kind and number, and the run when the group holds several), then what is plotted."""
    if key == group.id:
        return heading(group)
    part = key[len(group.id) + 1 :]
    if part == "positions":
        return f"{heading(group)}: loss by position"
    for table in (t for t in group.tables if t.kind == "ruler-depth"):
        for suffix, what in DEPTH_FIGURES.items():
            if key == f"{table.id}-{suffix}":
                return f"{heading(group)}: {table.task}, {what}"
    runs = tune_runs(group) if group.kind == "tune" else []
    run_part, _, figure = part.rpartition("-")
    if figure in TUNE_FIGURES and runs:
        k = int(run_part.removeprefix("run")) if run_part.startswith("run") else 1
        run = runs[k - 1] if 1 <= k <= len(runs) else None
        who = f" · {run.name}" if run is not None and len(runs) > 1 else ""
        return f"{group.short_title}{who}: {TUNE_FIGURES[figure]}"
    return f"{heading(group)}: {part.replace('-', ' ')}"


def group_figures(group: Group, images: dict[str, Any]) -> list[tuple[str, Any, str]]:
    """(key, file, caption) of the group's figures: its main figure first, then the others write_plots made for it
    (`<group>-positions`, a tune run's `<group>-objective`, ...)."""
    keys = [k for k in images if k == group.id] + [k for k in images if k.startswith(group.id + "-")]
    return [(k, images[k], figure_caption(group, k)) for k in keys]


def to_markdown(rep: Report, images: dict[str, str] | None = None) -> str:
    """The whole report as markdown; `images` (group id -> file name) adds the plots."""
    parts = ["# ctxeval report\n\n"]
    parts.append(
        markdown(
            ["run", "task", "model", "status", "rows", "table"],
            [
                [
                    f"`{r.name}`",
                    r.task,
                    ", ".join(r.models),
                    r.status,
                    str(len(r.rows)),
                    next(g.id for g in rep.groups if r in g.runs),
                ]
                for r in rep.runs
            ],
        )
    )
    if rep.notes:
        parts.append("\n" + "".join(f"- {n}\n" for n in rep.notes))
    for group in rep.groups:
        parts.append(f"\n## {heading(group)}\n\n")
        parts.append(f"Protocol: {group.description}. Runs: {', '.join(f'`{r.name}`' for r in group.runs)}.\n")
        for i, table in enumerate(group.tables):
            if i:
                parts.append(f"\n### {table.title}\n")
            if table.caption:
                parts.append(f"\n{table.caption}\n")
            parts.append("\n" + markdown(table.headers, table.cells))
            if table.footnotes:
                parts.append("\n" + "".join(f"{f}\n" for f in table.footnotes))
        if group.notes:
            parts.append("\n" + "".join(f"- {n}\n" for n in group.notes))
        for _, name, caption in group_figures(group, images or {}):
            parts.append(f"\n![{caption}]({name})\n")
    return "".join(parts)


CSV_FIELDS = ["table", "title", "model", "method", "column", "value", "status"]


def to_csv(rep: Report) -> str:
    """Every table in one tidy CSV: one line per (table, model, method, column); missing = empty value."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_FIELDS)
    for table in rep.tables:
        for row, sts in zip(table.rows, table.status):
            for col, value, st in list(zip(table.columns, row, sts))[2:]:
                w.writerow([table.id, table.title, row[0], row[1], col, csv_value(value), st or "ok"])
    return buf.getvalue()


def to_json(rep: Report, images: dict[str, str] | None = None) -> dict[str, Any]:
    """The report as plain JSON-able data (missing values are null, never 0)."""

    def table_json(t: Table) -> dict[str, Any]:
        return {
            "id": t.id,
            "kind": t.kind,
            "title": t.title,
            "caption": t.caption,
            "columns": t.columns,
            "rows": [
                {c: (v if i < 2 or isinstance(v, str) else number(v)) for i, (c, v) in enumerate(zip(t.columns, row))}
                for row in t.rows
            ],
            "status": [{c: s for c, s in zip(t.columns, sts) if s is not None} for sts in t.status],
            "footnotes": t.footnotes,
        }

    return finite_json(
        {  # a value copied from a run.json written by hand may be NaN: null in strict JSON
            "settings": {"threshold": rep.threshold, "valid_tolerance": rep.tolerance, "aggregate": rep.aggregate},
            "runs": [
                {
                    "path": r.name,
                    "task": r.task,
                    "models": r.models,
                    "status": r.status,
                    "started": r.record.get("started"),
                    "rows": len(r.rows),
                    "group": next(g.id for g in rep.groups if r in g.runs),
                }
                for r in rep.runs
            ],
            "groups": [
                {
                    "id": g.id,
                    "kind": g.kind,
                    "title": g.title,
                    "protocol": g.key,
                    "distinguishing": g.distinguishing,
                    "runs": [r.name for r in g.runs],
                    "original_lengths": g.original_lengths,
                    "notes": g.notes,
                    "tables": [table_json(t) for t in g.tables],
                    "plot": (images or {}).get(g.id),
                    "positions_plot": (images or {}).get(f"{g.id}-positions"),
                    "figures": [name for _, name, _ in group_figures(g, images or {})],
                }
                for g in rep.groups
            ],
            "notes": rep.notes,
        }
    )


def _curve_label(group: Group, model: str, label: str) -> str:
    models = {r[0] for r in group.tables[0].rows if not (r[0] == UNIFORM_MODEL and r[1] == UNIFORM_LABEL)}
    encoding = _encodings(group).get(model)
    return f"{model}{f' ({encoding})' if encoding else ''} · {label}" if len(models) > 1 else label


def _encodings(group: Group) -> dict[str, str]:
    """Model -> its position encoding, when the group's models differ in it (else empty)."""
    encodings = {m: str(p.get("encoding") or "?") for m, p in group.positions.items()}
    return encodings if len(set(encodings.values())) > 1 else {}


def _curve_family(group: Group, model: str, label: str) -> str:
    """What colours a curve: the method's family; an unmodified model (none) across position encodings: its
    encoding, so that the figure compares encodings as the ALiBi paper's does (one hue per encoding)."""
    family = method_family(label)
    return _encodings(group).get(model, family) if family == "none" else family


def _originals(group: Group) -> dict[int, str]:
    """Original length -> legend text (naming the models when the group's models differ in it)."""
    by_length: dict[int, list[str]] = {}
    for model, L in group.original_lengths.items():
        by_length.setdefault(L, []).append(model)
    several = len(group.original_lengths) > 1
    return {
        L: f"original length {fmt_length(L)}" + (f" ({', '.join(models)})" if several else "")
        for L, models in by_length.items()
    }


def group_curves(group: Group, value_columns: int | None = None) -> list[Curve]:
    """The group's first table as curves: one per (model, method) row; the uniform-entropy row as a reference."""
    table = group.tables[0]
    stop = 2 + (value_columns if value_columns is not None else len(table.columns) - 2)
    lengths = [int(c) for c in table.columns[2:stop]]
    curves = []
    for row in table.rows:
        points = [(L, v) for L, v in zip(lengths, row[2:stop]) if v is not None]
        reference = row[0] == UNIFORM_MODEL and row[1] == UNIFORM_LABEL
        label = "uniform attention (ln of visible keys)" if reference else _curve_label(group, row[0], row[1])
        family = _curve_family(group, row[0], row[1])
        curves.append(Curve(label, family, [p[0] for p in points], [p[1] for p in points], reference))
    return curves


def position_curves(group: Group, table: Table) -> list[Curve]:
    """A positions table as curves: one per (model, method) row, at the bucket centres, labelled with its length."""
    buckets = [tuple(int(x) for x in c.split("-")) for c in table.columns[3:]]
    curves = []
    for row in table.rows:
        points = [(bucket_center(a, b), v) for (a, b), v in zip(buckets, row[3:]) if v is not None]
        curves.append(
            Curve(
                f"{_curve_label(group, row[0], row[1])} (at {fmt_length(int(row[2]))})",
                _curve_family(group, row[0], row[1]),
                [p[0] for p in points],
                [p[1] for p in points],
            )
        )
    return curves


# protocol fields whose values name themselves in a file name ("austen", "sliding"); the others read "bos-off"
SELF_NAMING_FIELDS = {"data", "documents", "preset", "haystack", "protocol", "essays", "tasks", "scoring"}
NAME_LIST_MAX = 3  # list items a file name spells out; a longer list is counted ("11-tasks")
NAME_PART_MAX = 40
NAME_MAX = 100


def _cut(text: str, limit: int) -> str:
    """`text` shortened to `limit` characters at a '-' (not inside a word where one is near)."""
    if len(text) <= limit:
        return text
    dash = text.rfind("-", 0, limit + 1)
    return text[:dash] if dash > limit // 2 else text[:limit]


def name_part(field: str, value: Any) -> str:
    """A protocol field's value as part of a file name: `austen`, `emma-mansfield-park`, `bos-off`, `11-tasks`."""
    label = field.replace("_", "-")
    if isinstance(value, (list, tuple)):
        text = "-".join(map(str, value)) if len(value) <= NAME_LIST_MAX else f"{len(value)}-{label}"
        named = field in SELF_NAMING_FIELDS or len(value) > NAME_LIST_MAX
    elif isinstance(value, bool):
        text, named = "on" if value else "off", False
    elif isinstance(value, float):
        text, named = f"{value:g}", False
    elif isinstance(value, dict):
        text, named = json.dumps(value, sort_keys=True, default=str), False
    else:
        # "austen (substitute for RULER's Paul Graham essays)": the remark in brackets is not part of the name
        text, named = re.sub(r"\s*\(.*\)\s*$", "", str(value)) or str(value), field in SELF_NAMING_FIELDS
    return _cut(safe_name(text if named else f"{label} {text}").lower(), NAME_PART_MAX)


def figure_stems(groups: Sequence[Group]) -> dict[str, str]:
    """Group id -> the file name (without .png) of its figure: the kind, the group's models, and the values of the
    fields that set it apart from the kind's other groups (the fewest of them, in order, that tell the groups
    apart): `ppl-smollm2-austen-emma-bos-off`, `ruler-tiny-11-tasks-pydoc`, `entropy-tiny`. A suffix `-2`, `-3`
    only where two names would still be the same."""
    stems: dict[str, str] = {}
    used: set[str] = set()
    for kind in dict.fromkeys(g.kind for g in groups):
        mine = [g for g in groups if g.kind == kind]
        fields = list(dict.fromkeys(f for g in mine for f in g.distinguishing))
        parts = {g.id: {f: name_part(f, g.key.get(f)) for f in fields} for g in mine}

        def told_apart(names: list[str], parts: dict = parts, mine: list = mine) -> int:
            return len({tuple(parts[g.id][f] for f in names) for g in mine})

        chosen: list[str] = []
        for f in fields:
            if told_apart(chosen) == len(mine):
                break
            if told_apart([*chosen, f]) > told_apart(chosen):
                chosen.append(f)
        for g in mine:
            models = list(dict.fromkeys(Path(m).name or m for run in g.runs for m in run.models))
            who = [safe_name(m).lower() for m in models] if len(models) <= NAME_LIST_MAX else [f"{len(models)}-models"]
            stem = _cut("-".join([kind, *who, *(parts[g.id][f] for f in chosen)]), NAME_MAX)
            # the first free one of stem, stem-2, stem-3, ...: len(used) + 1 candidates always hold one
            unique = next(
                name for name in (stem, *(f"{stem}-{n}" for n in range(2, len(used) + 3))) if name not in used
            )
            used |= {unique, f"{unique}-positions"}
            stems[g.id] = unique
    return stems


def tune_figures(group: Group, out_dir: Path, stem: str, taken: set[str]) -> dict[str, str]:
    """A tune group's figures: each run's search figures as `ctxeval tune` draws them in its run directory (tune.py),
    redrawn from its rows as `<stem>-objective.png`, `-pareto.png`, `-factors.png` (`<stem>-<method>-...` when the
    group holds several runs; a name in `taken` gets `-2`, `-3`); returns key (`<group>-objective`,
    `<group>-run<k>-objective`) -> file name."""
    images: dict[str, str] = {}
    runs = tune_runs(group)
    summaries = [read_tune(run.path, run.record, run.rows) for run in runs]
    methods = [safe_name(str(s.spec.get("method") or "tune")).lower() for s in summaries]
    for k, s in enumerate(summaries, 1):
        baseline, tolerance = s.tune.get("baseline_short"), s.spec.get("short_tolerance")
        guard = baseline * (1 + tolerance) if baseline is not None and tolerance is not None else None  # as tune.md
        key = f"run{k}-" if len(runs) > 1 else ""
        named = "" if len(runs) == 1 else f"{methods[k - 1]}-" if methods.count(methods[k - 1]) == 1 else key
        # tune.py names the files tune-<part>.png: drawn into a folder of their own, then renamed into out_dir
        with tempfile.TemporaryDirectory(prefix=".tune-figures-", dir=out_dir) as tmp:
            for name in draw_tune(s, guard, Path(tmp)):
                part = name.removeprefix("tune-").removesuffix(".png")
                base = f"{stem}-{named}{part}"
                file = next(
                    f"{n}.png"
                    for n in (base, *(f"{base}-{i}" for i in range(2, len(taken) + 3)))
                    if f"{n}.png" not in taken
                )
                os.replace(Path(tmp) / name, out_dir / file)
                taken.add(file)
                images[f"{group.id}-{key}{part}"] = file
    return images


def free_name(base: str, taken: set[str]) -> str:
    """`base.png`, else the first of `base-2.png`, `base-3.png`, ... not in `taken` (which gets it)."""
    name = next(
        f"{n}.png" for n in (base, *(f"{base}-{i}" for i in range(2, len(taken) + 3))) if f"{n}.png" not in taken
    )
    taken.add(name)
    return name


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
            lambda m, lb: _curve_label(group, m, lb),
            out_dir / by_depth,
            figure_title(group, f"{table.task}, score by the answer's depth"),
        )
        heat = free_name(f"{base}-depth-heatmap", taken)
        panels = depth_panels(table, lambda m, lb: _curve_label(group, m, lb), group.original_lengths)
        dashed = any(p.original_length and max(p.grid.columns) > p.original_length for p in panels)
        what = "score by depth and length" + (" (dashed: past the original length)" if dashed else "")
        plot_heatmaps(panels, out_dir / heat, figure_title(group, f"{table.task}, {what}"), "answer depth", "score")
        images.update({f"{table.id}-by-depth": by_depth, f"{table.id}-depth-heatmap": heat})
    return images


def write_plots(rep: Report, out_dir: Path) -> dict[str, str]:
    """One PNG per group (ppl curves / needle heatmaps / passkey curves / entropy curves; a tune group: its runs'
    search figures), named by figure_stems; returns group id (and `<group id>-positions`, `<group id>-objective`,
    ...) -> file name. Titles are one short line (figure_title); the protocol is in the captions."""
    images: dict[str, str] = {}
    stems = figure_stems(rep.groups)
    taken = {f"{stem}{end}.png" for stem in stems.values() for end in ("", "-positions")}
    for group in rep.groups:
        path = Path(out_dir) / f"{stems[group.id]}.png"
        if group.kind == "needle":
            if not group.grids:
                continue
            panels = [
                HeatmapPanel(_curve_label(group, model, label), grid, status, group.original_lengths.get(model))
                for (model, label), (grid, status) in (
                    (pair, group.grids[pair])
                    for pair in ((r[0], r[1]) for r in group.tables[0].rows)
                    if pair in group.grids
                )
            ]
            dashed = any(p.original_length and max(p.grid.columns) > p.original_length for p in panels)
            plot_heatmaps(
                panels,
                path,
                figure_title(
                    group,
                    "accuracy by depth and length" + (" (dashed: past the original length)" if dashed else ""),
                ),
            )
        elif group.kind == "tune":
            images.update(tune_figures(group, Path(out_dir), stems[group.id], taken))
            continue
        elif group.kind == "lm-eval":
            continue  # a method x task table: nothing to draw against the context length
        elif group.kind == "ruler":
            curves = group_curves(group, value_columns=len(group.tables[0].columns) - 3)
            threshold = group.ruler_threshold
            plot_curves(
                curves,
                path,
                title=figure_title(group, "mean score by length"),
                xlabel="context length (tokens)",
                ylabel="RULER mean score",
                originals=_originals(group),
                threshold=threshold,
                threshold_label=f"threshold {threshold:g}",
                ylim=(-2, 102),
            )
            images[group.id] = path.name
            images.update(depth_figures(group, Path(out_dir), stems[group.id], taken))
            continue
        elif group.kind == "passkey":
            curves = group_curves(group, value_columns=len(group.tables[0].columns) - 5)  # + 3 summary columns
            plot_curves(
                curves,
                path,
                title=figure_title(group, "accuracy by length"),
                xlabel="context length (tokens)",
                ylabel="accuracy",
                originals=_originals(group),
                threshold=rep.threshold,
                y_percent=True,
            )
        else:
            curves = group_curves(group)
            if not any(c.xs for c in curves if not c.reference):
                continue
            if group.kind == "ppl":
                plot_curves(
                    curves,
                    path,
                    title=figure_title(group, "perplexity by length"),
                    xlabel="evaluation length (tokens)",
                    ylabel="perplexity",
                    originals=_originals(group),
                    log_y=True,
                )
                positions = next((t for t in group.tables if t.kind == "positions"), None)
                if positions is not None:
                    pos_path = Path(out_dir) / f"{stems[group.id]}-positions.png"
                    plot_curves(
                        position_curves(group, positions),
                        pos_path,
                        title=figure_title(group, "loss by position"),
                        xlabel="tokens of context the prediction had (bucket centres; ticks at bucket edges)",
                        ylabel="perplexity of the bucket's tokens",
                        originals=_originals(group),
                        log_y=True,
                        x_ticks=sorted({int(x) for c in positions.columns[3:] for x in c.split("-")}),
                    )
                    images[f"{group.id}-positions"] = pos_path.name
            else:
                plot_curves(
                    curves,
                    path,
                    title=figure_title(group, "attention entropy by length"),
                    xlabel="context length (tokens)",
                    ylabel="mean attention entropy (nats)",
                    originals=_originals(group),
                )
        images[group.id] = path.name
    return images


def earlier_figures(out_dir: Path) -> set[str]:
    """The figures an earlier report in `out_dir` wrote, as its report.json names them (PNG files directly in the
    directory; nothing else is ever removed)."""
    if not is_report_dir(out_dir):
        return set()
    try:
        record = read_json(out_dir / "report.json", "", finite=False)
    except CtxevalError:
        return set()
    groups = record.get("groups") if isinstance(record.get("groups"), list) else []
    names = {g.get(key) for g in groups if isinstance(g, dict) for key in ("plot", "positions_plot")}
    listed = [g.get("figures") for g in groups if isinstance(g, dict) and isinstance(g.get("figures"), list)]
    names |= {n for figures in listed for n in figures if isinstance(n, str)}
    return {
        n for n in names if isinstance(n, str) and n.endswith(".png") and Path(n).name == n and (out_dir / n).is_file()
    }


def write_report(rep: Report, out_dir: Path) -> list[Path]:
    """table.md, report.json, report.csv (tidy), one wide CSV per table and one PNG per group, in out_dir."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise CtxevalError(f"--out {out_dir} is a file, not a directory; choose a directory path")
    if (out_dir / RUN_FILE).exists():
        raise CtxevalError(
            f"--out {out_dir} is a run directory (it holds run.json); choose another directory for the report"
        )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CtxevalError(
            f"--out {out_dir}: cannot create the directory ({exc.strerror or type(exc).__name__}); choose another path"
        ) from None
    earlier = earlier_figures(out_dir)
    images = write_plots(rep, out_dir)
    written = [out_dir / name for name in images.values()]
    for name in earlier - set(images.values()):  # an earlier report's figure this one no longer draws
        with contextlib.suppress(OSError):
            (out_dir / name).unlink()
    record = {
        **to_json(rep, images),
        "generated": {  # how this report was made, as run.json says for a run
            "command": "ctxeval " + " ".join(sys.argv[1:]),
            "time": now_utc(),
            "environment": environment(),
        },
    }
    files = {
        "table.md": to_markdown(rep, images),
        "report.csv": to_csv(rep),
        "report.json": json.dumps(record, indent=2, allow_nan=False, default=str) + "\n",
    }
    files.update({f"{t.id}.csv": table_csv(t) for t in rep.tables})
    for name, text in files.items():
        written.append(write_text(out_dir / name, text, "report file"))
    return written
