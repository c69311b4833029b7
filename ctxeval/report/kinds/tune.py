"""The tune kind (`ctxeval tune`): its protocol key (the data, tuning and held-out documents, BOS); one row per
tune run (its winner beside plain RoPE, YaRN's defaults and the best other method, held out), never merged point by
point; each run's search figures as `ctxeval tune` draws them in its run directory, redrawn from its rows."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from ...runs.rows import MISSING, fmt_length
from ...util.paths import safe_name
from ..kind import FigureSpace, Kind, Settings
from ..runs import Group, Run, display_models
from ..tables import Table, fmt_ppl, length_or, number
from .tune_data import read_tune
from .tune_outputs import draw as draw_tune

# a tune run's figures (tune.py draws them into a run directory as tune-<part>.png): part -> what each shows
TUNE_FIGURES = {
    "objective": "perplexity at the target by trial, with the best so far",
    "pareto": "perplexity at the trained length against the target, the Pareto front, the guard",
    "factors": "the winner's per-pair scale against PI, NTK and YaRN",
}


def protocol_key(run: Run, aggregate: str | None = None) -> dict[str, Any]:
    """The search's settings and results are the table's columns, the documents are not."""
    spec = run.spec
    return {
        "data": spec.get("data"),
        "tuning_docs": spec.get("tuning_docs"),
        "heldout_docs": spec.get("heldout_docs"),
        "bos": spec.get("bos"),
    }


def tables(group: Group, rows: list[dict[str, Any]], settings: Settings) -> list[Table]:
    return [tune_table(group)]


def tune_runs(group: Group) -> list[Run]:
    return sorted(group.runs, key=lambda r: r.order)


TUNE_COLUMNS = [
    ("target", "target"),
    ("trials", "trials"),
    ("guard", "guard"),
    ("tuning ppl at target", "tuning ppl @ target"),
    ("held-out tuned at short", "held-out @ trained"),
    ("held-out tuned at target", "held-out @ target"),
    ("held-out none at target", "none @ target"),
    ("held-out yarn at target", "yarn defaults @ target"),
    ("held-out best other at target", "best other @ target"),
]


def tune_table(group: Group) -> Table:
    """One row per tune run: its winner (the method column), the search's size and guard, the winner's ppl on the
    tuning documents, and on the held-out documents beside plain RoPE, YaRN's defaults and the best other method
    re-measured there (named in the group's notes)."""
    names = display_models(group)
    raw, status, shown = [], [], []
    for run in sorted(group.runs, key=lambda r: r.order):
        s = read_tune(run.path, run.record, run.rows)
        model = names[(run.order, run.models[0])] if run.models else str(s.spec.get("model"))
        winner, held = s.winner, s.heldout
        label = winner["label"] if winner else f"{s.spec.get('method')} (no trial kept the guard)"
        tolerance = number(s.spec.get("short_tolerance"))
        other = held.best_other() if held else None
        values: list[Any] = [
            s.target,
            s.counts()["counted"],
            tolerance,
            number(winner["ppl_target"]) if winner else None,
        ]
        if held is not None:
            values += [
                held.value(held.winner, held.short),
                held.value(held.winner, held.target),
                held.value(held.family_default("none"), held.target),
                held.value(held.family_default("yarn"), held.target),
                held.value(other, held.target),
            ]
            group.notes.append(
                f"{run.name}: held-out run {held.path.name} on {', '.join(held.docs)}; the best "
                f"other method at {fmt_length(held.target)}: {other or MISSING}"
            )
        else:
            values += [None] * 5
            if winner:
                group.notes.append(f"{run.name}: the winner's held-out run is missing (the run stopped before it?)")
        sts = [
            None if v is not None else ("no winner" if i >= 3 and not winner else "missing")
            for i, v in enumerate(values)
        ]
        guard = f"{tolerance:.0%}" if tolerance is not None else MISSING
        cells = [
            length_or(values[0], MISSING),
            str(values[1]),
            guard,
            *(fmt_ppl(v if v is not None else float("nan"), st) for v, st in zip(values[3:], sts[3:])),
        ]
        raw.append([model, label, *values])
        status.append([None, None, *sts])
        shown.append([model, label, *cells])
    caption = (
        "One row per tune run. Method: the winner, the lowest perplexity at the target on the tuning documents "
        "among the trials that kept the guard (the ppl at the trained length at most `guard` above plain "
        "RoPE's). Held-out: token-weighted perplexity on documents the search never saw, the winner beside "
        "plain RoPE (none), YaRN at the same factor with its default betas, and the best of the other "
        "re-measured methods; every held-out row is in the ppl table."
    )
    return Table(
        group.id,
        "tune",
        group.title,
        ["model", "method", *(c for c, _ in TUNE_COLUMNS)],
        ["model", "method (tuned winner)", *(h for _, h in TUNE_COLUMNS)],
        raw,
        status,
        shown,
        caption,
    )


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


def figures(group: Group, space: FigureSpace) -> dict[str, str]:
    return tune_figures(group, space.out_dir, space.stem, space.taken)


def caption(group: Group, part: str) -> str | None:
    """A tune run's figure: the kind and number, and the run when the group holds several, then what it shows."""
    runs = tune_runs(group)
    run_part, _, figure = part.rpartition("-")
    if figure not in TUNE_FIGURES or not runs:
        return None
    k = int(run_part.removeprefix("run")) if run_part.startswith("run") else 1
    run = runs[k - 1] if 1 <= k <= len(runs) else None
    who = f" · {run.name}" if run is not None and len(runs) > 1 else ""
    return f"{group.short_title}{who}: {TUNE_FIGURES[figure]}"


KIND = Kind("tune", "Tuned methods (ctxeval tune)", protocol_key, tables, figures, caption, merges_rows=False)
