"""`ctxeval report`'s tables: the runs of each protocol group merged point by point into one table per kind
(ppl: model x method by length with the valid-length table, built in ppl_tables.py; needle / passkey: mean accuracy
with the effective length or passkey context; entropy: mean attention entropy with the uniform-attention reference
row; RULER, lm-eval, and one row per tune run)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from ..errors import CtxevalError
from ..runs.rows import (
    AGGREGATES,
    BEYOND_POSITIONS,
    MISSING,
    UNIFORM_LABEL,
    UNIFORM_MODEL,
    fmt_length,
    status_label,
    uniform_entropy,
)
from ..util.paths import safe_name
from .ppl_tables import ppl_tables
from .runs import Group, Run, display_models, field_label, group_runs, load_runs, merge_rows, row_order
from .tables import (
    Table,
    accuracy_grid,
    effective_length,
    fmt_acc,
    fmt_entropy,
    fmt_ppl,
    fmt_score,
    length_or,
    needle_long,
    number,
    ruler_depth_scores,
    ruler_effective_length,
    ruler_means,
    ruler_task_scores,
    suite_name,
    yarn_passkey_figures,
)
from .tune_data import read_tune


def encoding_of_record(record: dict[str, Any]) -> str | None:
    """The position encoding of a run recorded before run.json named it, from its RoPE record."""
    rope = record.get("rope") or {}
    if rope.get("base"):
        return "RoPE"
    reason = str(rope.get("no_rope_reason") or "")
    named = [("ALiBi", "ALiBi"), ("sinusoidal", "sinusoidal"), ("learned", "learned"), ("every layer", "NoPE")]
    return next((name for key, name in named if key in reason), None)


def _retrieval_table(group: Group, rows: list[dict[str, Any]], threshold: float) -> Table:
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


def _entropy_table(group: Group, rows: list[dict[str, Any]]) -> Table:
    """Rows = model x method, columns = length, value = the mean over documents of each point's entropy (itself the
    mean over layers, heads and query positions); a cell with a failed document shows the failure, as in ppl.
    The last row is the uniform-attention bound, which depends on the length only."""
    points: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for row in rows:
        points.setdefault((str(row["model"]), str(row["label"]), int(row["length"])), []).append(row)
    lengths = sorted({k[2] for k in points})
    pairs = row_order(group, rows)
    n_docs = len(group.key.get("documents") or [])
    raw, status, shown = [], [], []
    partial: list[str] = []
    for model, label in pairs:
        vals: list[float | None] = []
        sts: list[str | None] = []
        for length in lengths:
            mine = points.get((model, label, length), [])
            failed = [r for r in mine if r.get("status") != "ok"]
            if not mine or failed:
                vals.append(None)
                sts.append(str(failed[0].get("status")) if failed else "missing")
                continue
            vals.append(number(sum(float(r["entropy"]) for r in mine) / len(mine)))
            sts.append(None)
            if len(mine) < n_docs:
                partial.append(f"{fmt_length(length)} ({len(mine)} of {n_docs})")
        if partial:
            group.notes.append(
                f"{model} · {label}: averaged over fewer documents than the protocol's at "
                f"{', '.join(partial)}; the run did not measure the others"
            )
            partial = []
        raw.append([model, label, *vals])
        status.append([None, None, *sts])
        shown.append([model, label, *(fmt_entropy(v, s) for v, s in zip(vals, sts))])
    recorded = {
        int(r["length"]): float(r["uniform_entropy"])
        for r in rows
        if r.get("status") == "ok" and number(r.get("uniform_entropy")) is not None
    }
    bound = [recorded.get(L, uniform_entropy(L)) for L in lengths]
    raw.append([UNIFORM_MODEL, UNIFORM_LABEL, *bound])
    status.append([None, None, *([None] * len(lengths))])
    shown.append([UNIFORM_MODEL, UNIFORM_LABEL, *(fmt_entropy(v) for v in bound)])
    originals = ", ".join(f"{m} {fmt_length(L)}" for m, L in group.original_lengths.items())
    caption = (
        f"Mean attention entropy in nats (over layers, heads, query positions and {n_docs} document(s)); "
        f"original length: {originals}. Last row: the entropy if every query attended evenly to the keys it "
        "sees, mean ln(i+1), the upper bound; it depends on the length only, the same for every model and "
        "method."
    )
    return Table(
        group.id,
        "entropy",
        group.title,
        ["model", "method", *map(str, lengths)],
        ["model", "method", *map(fmt_length, lengths)],
        raw,
        status,
        shown,
        caption=caption,
    )


def _ruler_table(group: Group, rows: list[dict[str, Any]]) -> Table:
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


def _lm_eval_table(group: Group, rows: list[dict[str, Any]]) -> Table:
    """Rows = model x method, columns = lm-eval task x metric (x filter when not 'none'): value ± stderr."""
    latest = {}
    for r in rows:
        latest[(str(r["model"]), str(r["label"]), str(r["subtask"]), str(r["metric"]), str(r.get("filter")))] = r
    columns = list(dict.fromkeys((k[2], k[3], k[4]) for k in latest))
    raw, status, shown = [], [], []
    for model, label in row_order(group, rows):
        vals, sts, cells = [], [], []
        for task, metric, filt in columns:
            r = latest.get((model, label, task, metric, filt))
            ok = r is not None and r.get("status") == "ok" and r.get("value") is not None
            vals.append(number(r["value"]) if ok else None)
            sts.append(None if ok else (r.get("status") if r else "missing"))
            err = number(r.get("stderr")) if ok else None
            cells.append(
                (f"{r['value']:.4g}" + (f" ± {err:.2g}" if err is not None else "")) if ok else status_label(sts[-1])
            )
        raw.append([model, label, *vals])
        status.append([None, None, *sts])
        shown.append([model, label, *cells])
    names = [f"{t} {m}" + ("" if f in ("none", "None") else f" ({f})") for t, m, f in columns]
    caption = (
        f"lm-evaluation-harness {group.key.get('lm_eval') or ''} results (value ± stderr) with each method "
        f"applied in place and read back; inputs truncated from the left to {group.key.get('max_length')} "
        f"tokens; limit {group.key.get('limit')}, few-shot {group.key.get('num_fewshot')}."
    )
    return Table(
        group.id,
        "lm-eval",
        group.title,
        ["model", "method", *names],
        ["model", "method", *names],
        raw,
        status,
        shown,
        caption=caption,
    )


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


@dataclass
class Report:
    runs: list[Run]
    groups: list[Group]
    notes: list[str]
    threshold: float
    tolerance: float
    aggregate: str | None

    @property
    def tables(self) -> list[Table]:
        return [t for g in self.groups for t in g.tables]


def build_report(
    paths: Sequence[Path | str],
    *,
    threshold: float = 0.8,
    tolerance: float = 0.10,
    aggregate: str | None = None,
    single: bool = False,
) -> Report:
    """Load the runs, group them by protocol and build every group's tables."""
    if not 0 < threshold <= 1:
        raise CtxevalError(f"--threshold must be in (0, 1], got {threshold}")
    if tolerance < 0:
        raise CtxevalError(f"--valid-tolerance must be >= 0, got {tolerance}")
    if aggregate is not None and aggregate not in AGGREGATES:
        raise CtxevalError(f"--aggregate must be token or window, got '{aggregate}'")
    runs, notes = load_runs(paths)
    groups = group_runs(runs, aggregate, single)
    for group in groups:
        names = display_models(group)
        for run in group.runs:
            for model in run.models:
                if run.original_length and names[(run.order, model)] not in group.original_lengths:
                    group.original_lengths[names[(run.order, model)]] = run.original_length
                record = run.record.get("model") or {}
                group.positions[names[(run.order, model)]] = {
                    "encoding": record.get("position_encoding") or encoding_of_record(record),
                    "beyond": run.record.get("beyond_positions") or [],
                }
        if group.kind == "tune":  # one row per run: trials of different searches are never merged
            group.tables = [tune_table(group)]
            continue
        rows, group.notes = merge_rows(group)
        if group.kind == "ppl":
            group.tables = ppl_tables(group, rows, tolerance)
        elif group.kind == "ruler":
            depths = ruler_depth_tables(group.id, rows, row_order(group, rows), group.key.get("tasks") or [])
            group.tables = [_ruler_table(group, rows), *depths]
        elif group.kind == "lm-eval":
            group.tables = [_lm_eval_table(group, rows)]
        elif group.kind == "entropy":
            group.tables = [_entropy_table(group, rows)]
        else:
            group.tables = [_retrieval_table(group, rows, threshold)]
    kinds = Counter(g.kind for g in groups)
    for kind, n in kinds.items():
        if n > 1:
            differ = groups[[g.kind for g in groups].index(kind)].distinguishing
            notes.append(
                f"the {kind} runs differ in {', '.join(map(field_label, differ))}: shown as {n} separate tables, never mixed"
            )
    return Report(runs, groups, notes, threshold, tolerance, aggregate)
