"""A report as files and text: markdown, one tidy CSV, one wide CSV per table, JSON (with how it was made) and
one figure per protocol group (a tune group: its runs' search figures). Headings and figure titles stay short (the
kind, the models, what is plotted); the protocol goes to the line under the heading and the HTML page's captions."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
import sys
from pathlib import Path
from typing import Any, Sequence

from ..errors import CtxevalError
from ..runs.store import RUN_FILE, environment, now_utc
from ..util.paths import safe_name
from ..util.textfiles import finite_json, read_json, write_text
from .figures import NAME_LIST_MAX, heading
from .kind import FigureSpace, Settings
from .merged import Report
from .registry import KINDS
from .runs import Group, is_report_dir
from .single import table_csv
from .tables import Table, csv_value, markdown, number

__all__ = ["table_csv"]  # kept importable from here: single.py holds it so that a run's lm-eval table can use it


def figure_caption(group: Group, key: str) -> str:
    """What one of the group's figures shows (`key` as write_plots returns it): the group's heading, then what is
    plotted, as the group's kind says it (report/kinds/); else the part of the key in words."""
    if key == group.id:
        return heading(group)
    part = key[len(group.id) + 1 :]
    return KINDS[group.kind].caption(group, part) or f"{heading(group)}: {part.replace('-', ' ')}"


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


# protocol fields whose values name themselves in a file name ("austen", "sliding"); the others read "bos-off"
SELF_NAMING_FIELDS = {"data", "documents", "preset", "haystack", "protocol", "essays", "tasks", "scoring"}
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


def write_plots(rep: Report, out_dir: Path) -> dict[str, str]:
    """The figures of every group, as its kind draws them (report/kinds/), named by figure_stems; returns group id
    (and `<group id>-positions`, `<group id>-objective`, ...) -> file name. Titles are one short line
    (figures.figure_title); the protocol is in the captions."""
    images: dict[str, str] = {}
    stems = figure_stems(rep.groups)
    taken = {f"{stem}{end}.png" for stem in stems.values() for end in ("", "-positions")}
    settings = Settings(rep.threshold, rep.tolerance)
    for group in rep.groups:
        images.update(KINDS[group.kind].figures(group, FigureSpace(Path(out_dir), stems[group.id], taken, settings)))
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
