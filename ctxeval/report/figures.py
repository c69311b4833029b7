"""What every kind's figures share: a group's heading and figure titles (short: the kind, the models, what is
plotted), a curve's legend text and colour family, the original-length marks, a table as curves, and free file
names. The kinds draw their figures with these (report/kinds/); render.py lays the figures out."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..runs.rows import UNIFORM_LABEL, UNIFORM_MODEL, fmt_length
from .kind import FigureSpace
from .plots import Curve, method_family, plot_curves
from .runs import Group, field_label, fmt_value
from .tables import Table, bucket_center

# characters of a group's heading (markdown ## and the HTML page's h2): one line in the page's 1,264 px column
HEADING_MAX = 110
NAME_LIST_MAX = 3  # list items a heading or file name spells out; a longer list is counted ("11 tasks")


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


def figure_title(group: Group, what: str) -> str:
    """A figure's title, one short line: the kind (and number), the models, what is plotted."""
    models = group_models(group)
    who = ", ".join(models) if len(models) <= NAME_LIST_MAX else f"{len(models)} models"
    return f"{group.short_title} · {who}: {what}"


def curve_label(group: Group, model: str, label: str) -> str:
    models = {r[0] for r in group.tables[0].rows if not (r[0] == UNIFORM_MODEL and r[1] == UNIFORM_LABEL)}
    encoding = encodings_of(group).get(model)
    return f"{model}{f' ({encoding})' if encoding else ''} · {label}" if len(models) > 1 else label


def encodings_of(group: Group) -> dict[str, str]:
    """Model -> its position encoding, when the group's models differ in it (else empty)."""
    encodings = {m: str(p.get("encoding") or "?") for m, p in group.positions.items()}
    return encodings if len(set(encodings.values())) > 1 else {}


def curve_family(group: Group, model: str, label: str) -> str:
    """What colours a curve: the method's family; an unmodified model (none) across position encodings: its
    encoding, so that the figure compares encodings as the ALiBi paper's does (one hue per encoding)."""
    family = method_family(label)
    return encodings_of(group).get(model, family) if family == "none" else family


def originals_legend(group: Group) -> dict[int, str]:
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
        label = "uniform attention (ln of visible keys)" if reference else curve_label(group, row[0], row[1])
        family = curve_family(group, row[0], row[1])
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
                f"{curve_label(group, row[0], row[1])} (at {fmt_length(int(row[2]))})",
                curve_family(group, row[0], row[1]),
                [p[0] for p in points],
                [p[1] for p in points],
            )
        )
    return curves


def free_name(base: str, taken: set[str]) -> str:
    """`base.png`, else the first of `base-2.png`, `base-3.png`, ... not in `taken` (which gets it)."""
    name = next(
        f"{n}.png" for n in (base, *(f"{base}-{i}" for i in range(2, len(taken) + 3))) if f"{n}.png" not in taken
    )
    taken.add(name)
    return name


def curve_figure(
    group: Group,
    space: FigureSpace,
    what: str,
    xlabel: str,
    ylabel: str,
    value_columns: int | None = None,
    skip_empty: bool = True,
    **style: Any,
) -> dict[str, str]:
    """The group's first table drawn as curves against the length (group_curves) in its main figure, titled
    `what`, the original lengths marked; `style`: plot_curves' options (log_y, threshold, ...). Nothing is drawn
    (no key returned) when no curve has a point and `skip_empty`."""
    curves = group_curves(group, value_columns)
    if skip_empty and not any(c.xs for c in curves if not c.reference):
        return {}
    plot_curves(
        curves,
        space.main,
        title=figure_title(group, what),
        xlabel=xlabel,
        ylabel=ylabel,
        originals=originals_legend(group),
        **style,
    )
    return {group.id: space.main.name}
