"""Rows -> pandas long tables -> wide tables, and how every cell is formatted. Reports derive from rows only, so any
set of runs can be merged and re-rendered later; a run's own tables and `ctxeval report` use these same functions."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np
import pandas as pd

from ..errors import CtxevalError
from ..runs.rows import AGGREGATES, MISSING, UNIFORM_LABEL, fmt_length, status_label


def latest_rows(rows: Iterable[dict[str, Any]], key: tuple[str, ...]) -> pd.DataFrame:
    """Long table with one row per key: the last measured (ok) row, else the last row. A resumed point replaces
    its earlier failure, and a stale failure (e.g. from a crashed rank's file merged later) never hides a
    measurement."""
    df = pd.DataFrame(list(rows))
    if df.empty:
        return df
    df["_key"] = df[list(key)].astype(str).agg("|".join, axis=1)
    df["_ok"] = (df["status"] == "ok") if "status" in df else True
    df = df.reset_index(drop=True).rename_axis("_order").reset_index()
    df = df.sort_values(["_ok", "_order"], kind="stable")
    return df.drop_duplicates("_key", keep="last").sort_values("_order").drop(columns=["_key", "_ok", "_order"])


def ppl_long(rows: Iterable[dict[str, Any]], aggregate: str = "token") -> pd.DataFrame:
    """One row per (model, label, length): ppl aggregated over documents, with token and document counts.

    aggregate=token: exp(sum NLL / sum tokens); aggregate=window: exp(mean of window-mean NLLs)."""
    if aggregate not in AGGREGATES:
        raise CtxevalError(f"--aggregate must be token or window, got '{aggregate}'")
    df = latest_rows(rows, ("model", "label", "length", "doc"))
    if df.empty:
        return pd.DataFrame(columns=["model", "label", "length", "ppl", "n_tokens", "n_docs", "status"])
    out = []
    for (model, label, length), g in df.groupby(["model", "label", "length"], sort=False):
        ok = g[g["status"] == "ok"]
        failed = g[g["status"] != "ok"]
        if len(ok) and not len(failed):
            if aggregate == "token":
                ppl = math.exp(ok["nll_sum"].sum() / ok["n_tokens"].sum())
            else:
                ppl = math.exp(ok["window_nll_sum"].sum() / ok["n_windows"].sum())
            status = "ok"
        else:
            ppl, status = float("nan"), (failed["status"].iloc[0] if len(failed) else "missing")
        out.append(
            {
                "model": model,
                "label": label,
                "length": int(length),
                "ppl": ppl,
                "n_tokens": int(ok["n_tokens"].sum()) if len(ok) else 0,
                "n_docs": len(ok),
                "status": status,
            }
        )
    return pd.DataFrame(out)


def positions_long(rows: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """Loss by position: one row per (model, label, bucket) at the longest length each (model, label) was measured
    at, the bucket's NLL summed over documents (token-weighted). Rows without position sums (older runs) and rows
    whose edges differ from that point's first row are left out."""
    columns = ["model", "label", "length", "start", "stop", "tokens", "nll", "ppl", "n_docs"]
    df = latest_rows(rows, ("model", "label", "length", "doc"))
    if df.empty or "position_edges" not in df:
        return pd.DataFrame(columns=columns)
    ok = df[(df["status"] == "ok") & df["position_edges"].apply(lambda e: isinstance(e, list) and len(e) > 1)]
    out = []
    for (model, label), g in ok.groupby(["model", "label"], sort=False):
        at = g[g["length"] == g["length"].max()]
        edges = list(at["position_edges"].iloc[0])
        at = at[at["position_edges"].apply(lambda e, edges=edges: list(e) == edges)]
        sums = np.sum(np.array([list(x) for x in at["position_nll_sum"]], dtype=float), axis=0)
        tokens = np.sum(np.array([list(x) for x in at["position_tokens"]], dtype=np.int64), axis=0)
        for start, stop, nll_sum, n in zip(edges, edges[1:], sums, tokens):
            if n == 0:
                continue
            out.append(
                {
                    "model": model,
                    "label": label,
                    "length": int(at["length"].iloc[0]),
                    "start": int(start),
                    "stop": int(stop),
                    "tokens": int(n),
                    "nll": float(nll_sum / n),
                    "ppl": math.exp(nll_sum / n),
                    "n_docs": len(at),
                }
            )
    return pd.DataFrame(out, columns=columns)


def bucket_label(start: int, stop: int) -> str:
    """Positions [start, stop) as text: '4k-8k' (k = 1024); a one-position bucket as that position."""
    return fmt_length(start) if stop == start + 1 else f"{fmt_length(start)}-{fmt_length(stop)}"


def bucket_center(start: int, stop: int) -> float:
    """Where a bucket sits on a log axis: the geometric mean of its first and last position."""
    return math.sqrt(max(start, 1) * max(stop - 1, start, 1))


def longppl_long(rows: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """LongPPL per (model, label, length) as PKU-ML/LongPPL's perplexity/perplexity.py aggregates documents:
    exp(sum_d n_d log LongPPL_d / sum_d n_d) with n_d the key tokens of document d, which is the pooled
    exp(sum key NLL / sum key tokens); documents without key tokens add nothing (the original skips them).
    Any document of a point that is not ok makes the point missing (never an aggregate of the others)."""
    columns = ["model", "label", "length", "longppl", "key_tokens", "n_docs", "status"]
    df = latest_rows(rows, ("model", "label", "length", "doc"))
    if df.empty or "key_tokens" not in df:
        return pd.DataFrame(columns=columns)
    out = []
    for (model, label, length), g in df.groupby(["model", "label", "length"], sort=False):
        ok = g[(g["status"] == "ok") & g["key_tokens"].notna()]
        if len(ok) < len(g):
            out.append(
                {
                    "model": model,
                    "label": label,
                    "length": int(length),
                    "longppl": float("nan"),
                    "key_tokens": float("nan"),
                    "n_docs": len(ok),  # not counted: unknown, not zero
                    "status": next((s for s in g["status"] if s != "ok"), "missing"),
                }
            )
            continue
        n_key = int(ok["key_tokens"].astype(int).sum())
        out.append(
            {
                "model": model,
                "label": label,
                "length": int(length),
                "longppl": math.exp(ok["key_nll_sum"].sum() / n_key) if n_key else float("nan"),
                "key_tokens": n_key,
                "n_docs": len(ok),
                "status": "ok" if n_key else "no key tokens",
            }
        )
    return pd.DataFrame(out, columns=columns)


def ppl_wide(long: pd.DataFrame, order: list[str] | None = None) -> pd.DataFrame:
    """Rows = method label, columns = evaluation length (YaRN Table 2 shape). Missing cells stay NaN."""
    wide = long.pivot_table(index="label", columns="length", values="ppl", aggfunc="first", dropna=False)
    labels = order or list(dict.fromkeys(long["label"]))
    wide = wide.reindex([label for label in labels if label in wide.index])
    wide.columns = [int(c) for c in wide.columns]
    return wide.sort_index(axis=1)


def status_wide(long: pd.DataFrame, wide: pd.DataFrame) -> pd.DataFrame:
    st = long.pivot_table(index="label", columns="length", values="status", aggfunc="first")
    st.columns = [int(c) for c in st.columns]
    return st.reindex(index=wide.index, columns=wide.columns)


BASE_LABELS = ("native", "none")  # the unmodified model's row, in order of preference


def own_valid_column(tolerance: float) -> str:
    return f"longest within {tolerance:.0%} of own ppl"


def base_valid_column(tolerance: float, base: str | None) -> str:
    return f"longest within {tolerance:.0%} of {base or 'base'}"


def base_label(labels: Iterable[str]) -> str | None:
    """The row that is the unmodified model: `native` (the checkpoint's own RoPE), else `none`; None if neither."""
    labels = list(labels)
    return next((b for b in BASE_LABELS if b in labels), None)


OWN_FAILS_AT = "own: first length past it"
BASE_FAILS_AT = "vs base: first length past it"


def valid_lengths(
    wide: pd.DataFrame, original_length: int, tolerance: float, status: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Per method, two valid lengths (ALiBi-style extrapolation tables), both going up from the reference length R
    (the original length L, or the longest evaluated length <= L) and stopping at the first length that fails:
      own:  ppl stays within (1 + tolerance) of the method's own ppl at R (how gracefully it degrades);
      base: ppl stays within (1 + tolerance) of the unmodified model's ppl at R (`native`, else `none`: how far the
            method goes without costing perplexity against the model as shipped).
    A length fails when its ppl is over the bound or its point failed (out of memory, past a learned position
    table). `status` (the same shape; ok, oom, ..., missing or NaN) tells a point never measured from a failed one:
    the walk stops there too, but nothing failed, so the valid length is a lower bound. Without `status` every NaN
    counts as a failure. OWN_FAILS_AT / BASE_FAILS_AT hold the length that failed, None where none did (the valid
    length is then a lower bound: `≥ L (not reached)`)."""
    below = [c for c in wide.columns if c <= original_length]
    ref_len = max(below) if below else min(wide.columns)
    base = base_label(wide.index)
    base_ref = wide.loc[base].get(ref_len) if base is not None else None

    def unmeasured(label: Any, length: int) -> bool:
        if status is None:
            return False
        st = status.loc[label].get(length)
        return st is None or (isinstance(st, float) and math.isnan(st)) or st == "missing"

    def longest(label: Any, series: pd.Series, ref: Any) -> tuple[int | None, int | None]:
        valid = None
        if ref is None or math.isnan(ref):
            return None, None
        for length in [c for c in wide.columns if c >= ref_len]:
            value = series[length]
            if math.isnan(value):
                return valid, None if unmeasured(label, length) else int(length)
            if value > ref * (1 + tolerance):
                return valid, int(length)
            valid = length
        return valid, None

    rows = []
    for label, series in wide.iterrows():
        ref = series.get(ref_len)
        (own, own_fails), (against_base, base_fails) = longest(label, series, ref), longest(label, series, base_ref)
        rows.append(
            {
                "method": label,
                "reference length": ref_len,
                "ppl at reference": ref,
                own_valid_column(tolerance): own,
                "x original": (own / original_length) if own else None,
                base_valid_column(tolerance, base): against_base,
                "x original (vs base)": (against_base / original_length) if against_base else None,
                OWN_FAILS_AT: own_fails,
                BASE_FAILS_AT: base_fails,
            }
        )
    return pd.DataFrame(rows).astype({OWN_FAILS_AT: "Int64", BASE_FAILS_AT: "Int64"})


def fmt_ppl(value: Any, status: str | None = None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return status_label(status)
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:.2f}"


def markdown(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(headers), sep, *(line(r) for r in rows)]) + "\n"


def ppl_cells(wide: pd.DataFrame, status: pd.DataFrame | None = None) -> tuple[list[str], list[list[str]]]:
    headers = ["method"] + [fmt_length(c) for c in wide.columns]
    rows = []
    for label, series in wide.iterrows():
        rows.append(
            [label] + [fmt_ppl(series[c], None if status is None else status.loc[label, c]) for c in wide.columns]
        )
    return headers, rows


NOT_REACHED = "not reached"
NOT_REACHED_NOTE = (
    f"≥ L ({NOT_REACHED}): valid at every length evaluated up to L, and no longer length failed (L is the longest "
    "evaluated, or the next was not measured); where it fails lies beyond."
)


def open_ended(valid: int | None, fails_at: int | None, shown: str, said: bool = True) -> str:
    """A valid length that no longer length failed is a lower bound: `≥ 1k (not reached)` (`≥ 8.00` for its
    multiple of the original length, `said` False)."""
    if valid is None or fails_at is not None:
        return shown
    return f"≥ {shown}" + (f" ({NOT_REACHED})" if said else "")


def valid_cells(valid: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """The valid-length table's cells (valid_lengths' columns less the failing lengths); a valid length that no
    longer length failed is open_ended."""
    headers = [c for c in valid.columns if c not in (OWN_FAILS_AT, BASE_FAILS_AT)]
    own_col, base_col = headers[3], headers[5]
    rows = []

    def present(x: Any) -> bool:
        return x is not None and not pd.isna(x)

    def cells(r: pd.Series, column: str, times: str, fails: str) -> list[str]:
        length = int(r[column]) if present(r[column]) else None
        fails_at = int(r[fails]) if present(r[fails]) else None
        return [
            open_ended(length, fails_at, fmt_length(length) if length is not None else MISSING),
            open_ended(length, fails_at, f"{r[times]:.2f}" if present(r[times]) else MISSING, False),
        ]

    for _, r in valid.iterrows():
        rows.append(
            [
                r["method"],
                fmt_length(int(r["reference length"])),
                fmt_ppl(r["ppl at reference"]),
                *cells(r, own_col, "x original", OWN_FAILS_AT),
                *cells(r, base_col, "x original (vs base)", BASE_FAILS_AT),
            ]
        )
    return headers, rows


# ---------------------------------------------------------------------------------------------------------------
# needle / passkey


def needle_long(rows: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """Per-sample rows, last per (model, label, length, depth, sample)."""
    df = latest_rows(rows, ("model", "label", "length", "depth", "sample"))
    if df.empty:
        return df
    df["length"] = df["length"].astype(int)
    return df


def accuracy_grid(df: pd.DataFrame, label: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Mean accuracy (rows = depth %, columns = length) for one method, and the cells' status (ok/oom/skipped)."""
    sub = df[df["label"] == label]
    ok = sub[sub["status"] == "ok"]
    grid = ok.pivot_table(index="depth", columns="length", values="correct", aggfunc="mean")
    all_cells = sub.pivot_table(index="depth", columns="length", values="status", aggfunc="first")
    grid = grid.reindex(index=all_cells.index, columns=all_cells.columns)
    return grid.sort_index().sort_index(axis=1), all_cells.sort_index().sort_index(axis=1)


def effective_length(acc_by_length: pd.Series, threshold: float) -> int | None:
    """Longest length L such that every evaluated length <= L has mean accuracy >= threshold (None if the
    shortest already fails). Contiguous from the shortest, so a lucky long length cannot overstate it."""
    best = None
    for length, acc in sorted(acc_by_length.items()):
        if acc is None or math.isnan(acc) or acc < threshold:
            break
        best = int(length)
    return best


def needle_summary(df: pd.DataFrame, order: list[str], threshold: float) -> pd.DataFrame:
    """Rows = method, columns = length (mean accuracy over depths and samples), plus the effective length."""
    ok = df[df["status"] == "ok"]
    wide = ok.pivot_table(index="label", columns="length", values="correct", aggfunc="mean")
    lengths = sorted(df["length"].unique())
    wide = wide.reindex(index=[label for label in order if label in set(df["label"])], columns=lengths)
    wide["effective length"] = [effective_length(wide.loc[label, lengths], threshold) for label in wide.index]
    return wide


def yarn_passkey_figures(acc_by_length: pd.Series, threshold: float) -> tuple[int | None, float]:
    """The YaRN paper's two passkey figures (Table 5's caption): the passkey context, the longest evaluated length
    whose accuracy is >= threshold whatever the shorter lengths scored (None if no length reaches it), and the
    passkey accuracy, the mean accuracy over the evaluated lengths up to it (NaN without a context)."""
    measured = {int(L): float(acc) for L, acc in acc_by_length.items() if acc is not None and not math.isnan(acc)}
    passing = [L for L, acc in measured.items() if acc >= threshold]
    if not passing:
        return None, float("nan")
    context = max(passing)
    upto = [acc for L, acc in measured.items() if L <= context]
    return context, sum(upto) / len(upto)


def passkey_summary(df: pd.DataFrame, order: list[str], threshold: float) -> pd.DataFrame:
    """Per method the YaRN paper's passkey context and accuracy (yarn_passkey_figures), beside ctxeval's contiguous
    effective length (every length up to it >= threshold), which a failing shorter length stops."""
    wide = needle_summary(df, order, threshold)
    lengths = [c for c in wide.columns if c != "effective length"]
    rows = []
    for label in wide.index:
        ctx, mean = yarn_passkey_figures(wide.loc[label, lengths], threshold)
        rows.append(
            {
                "method": label,
                "passkey context": ctx,
                "passkey accuracy": mean,
                "effective length": wide.loc[label, "effective length"],
            }
        )
    return pd.DataFrame(rows)


def fmt_acc(value: Any, status: str | None = None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return status_label(status)
    return f"{value:.0%}"


def fmt_entropy(value: Any, status: str | None = None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return status_label(status)
    return f"{value:.3f}"


def number(value: Any) -> float | int | None:
    """JSON/CSV-safe number: NaN, infinities and None -> None, integer types -> int, numpy scalars -> Python."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    value = float(value)
    return value if math.isfinite(value) else None


def int_or_none(value: Any) -> int | None:
    value = number(value)
    return None if value is None else int(value)


def csv_value(value: Any) -> str:
    if isinstance(value, str):  # a label among the values (a position encoding's name)
        return value
    value = number(value)
    if value is None:
        return ""
    return str(value) if isinstance(value, int) else f"{value:.6g}"


def length_or(value: Any, missing: str) -> str:
    return fmt_length(int(value)) if number(value) is not None else missing


@dataclass
class Table:
    """One rendered table. `rows` hold raw values (None = missing), `cells` the formatted strings."""

    id: str
    kind: str  # ppl | valid | needle | passkey | entropy
    title: str
    columns: list[str]  # machine keys: model, method, "2048", ..., effective length
    headers: list[str]  # display headers
    rows: list[list[Any]]
    status: list[list[str | None]]  # per cell: None (a value, or an id column) or ok/oom/skipped/missing
    cells: list[list[str]]
    caption: str = ""
    footnotes: list[str] = field(default_factory=list)
    task: str = ""  # a RULER depth table's task (kind ruler-depth)
    depths: list[float] = field(default_factory=list)  # a depth table's columns on the 0-100 depth axis

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row)) for row in self.rows]


# ---------------------------------------------------------------------------------------------------------------
# attention entropy


def entropy_tables(rows: list[dict[str, Any]], order: list[str]) -> tuple[Any, Any]:
    """ok rows -> (mean entropy [method x length] averaged over documents, per-layer [method, layer x length])."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("task") == "entropy"]
    if not ok:
        return pd.DataFrame(), pd.DataFrame()
    df = pd.DataFrame(ok).drop_duplicates(subset=["label", "length", "doc"], keep="last")
    wide = df.pivot_table(index="label", columns="length", values="entropy", aggfunc="mean")
    wide = wide.reindex([label for label in order if label in wide.index])
    if "uniform_entropy" in df:  # every row ctxeval writes has it; a row file edited by hand may not
        wide.loc[UNIFORM_LABEL] = df.groupby("length")["uniform_entropy"].first()
    per_layer = []
    for r in df.itertuples():
        for layer, value in zip(r.layers, r.entropy_per_layer):
            per_layer.append({"label": r.label, "layer": layer, "length": r.length, "entropy": value})
    layers = pd.DataFrame(per_layer).pivot_table(
        index=["label", "layer"], columns="length", values="entropy", aggfunc="mean"
    )
    layers = layers.reindex([i for label in order for i in layers.index if i[0] == label])
    return wide, layers


# ---------------------------------------------------------------------------------------------------------------
# RULER


def ruler_task_scores(rows: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """One row per (model, label, ruler_task, length): RULER's task score, the mean sample score x 100 rounded to
    2 decimals (its metric_fn), over the measured samples; status oom when a sample failed."""
    df = latest_rows(rows, ("model", "label", "ruler_task", "length", "sample"))
    columns = ["model", "label", "ruler_task", "length", "score", "samples", "status"]
    if df.empty:
        return pd.DataFrame(columns=columns)
    out = []
    for (model, label, task, length), g in df.groupby(["model", "label", "ruler_task", "length"], sort=False):
        ok = g[g["status"] == "ok"]
        failed = g[g["status"] != "ok"]
        value = round(float(ok["score"].astype(float).mean()) * 100, 2) if len(ok) and not len(failed) else float("nan")
        out.append(
            {
                "model": model,
                "label": label,
                "ruler_task": task,
                "length": int(length),
                "score": value,
                "samples": len(ok),
                "status": "ok"
                if len(ok) and not len(failed)
                else (str(failed["status"].iloc[0]) if len(failed) else "missing"),
            }
        )
    return pd.DataFrame(out, columns=columns)


def suite_name(tasks: list[str]) -> str:
    """What a ruler run's tasks are: "RULER" for RULER's own, else the retrieval suites' prefixes named."""
    suites = sorted({task.split(":")[0] for task in tasks if ":" in task})
    if not suites:
        return "RULER"
    return " + ".join((["RULER"] if any(":" not in task for task in tasks) else []) + suites)


def ruler_means(scores: pd.DataFrame, tasks: list[str]) -> pd.DataFrame:
    """(model, label, length) -> the mean task score over `tasks` (RULER's headline number); NaN unless every task
    was scored at that length."""
    out = []
    for (model, label, length), g in scores.groupby(["model", "label", "length"], sort=False):
        have = {t: s for t, s in zip(g["ruler_task"], g["score"]) if not math.isnan(s)}
        value = sum(have[t] for t in tasks) / len(tasks) if all(t in have for t in tasks) else float("nan")
        out.append({"model": model, "label": label, "length": int(length), "mean": value})
    return pd.DataFrame(out, columns=["model", "label", "length", "mean"])


def ruler_effective_length(mean_by_length: dict[int, float], threshold: float) -> int | None:
    """The longest length up to which every evaluated length's mean exceeds the threshold (RULER: > 85.6)."""
    best = None
    for length, value in sorted(mean_by_length.items()):
        if value is None or math.isnan(value) or not value > threshold:
            break
        best = int(length)
    return best


def fmt_score(value: Any, status: str | None = None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return status_label(status)
    return f"{value:.1f}"


# ---------------------------------------------------------------------------------------------------------------
# RULER tasks with a depth axis (the retrieval tasks of issue 41: litm:kv, helmet:json_kv, infbench:kv_retrieval, ...)

DEPTH_COLUMNS_MAX = 6  # distinct depths a task's table shows as they are (80 columns hold six); more are binned
DEPTH_BINS = 5  # equal ranges of the 0-100 axis when they are binned
DEPTH_SCORE_COLUMNS = ["model", "label", "ruler_task", "length", "depth", "depth_label", "score", "samples", "status"]


def depth_columns(depths: Iterable[float]) -> dict[float, tuple[float, str]]:
    """Each measured depth -> (its column's position on the 0-100 axis, its label): the depth itself (`25%`) when
    a task has at most DEPTH_COLUMNS_MAX of them, else the centre of its range among DEPTH_BINS equal ones (`20-40%`;
    the last range holds 100)."""
    found = sorted({float(d) for d in depths})
    if len(found) <= DEPTH_COLUMNS_MAX:
        return {d: (d, f"{d:.3g}%") for d in found}
    width = 100 / DEPTH_BINS
    bins = {d: min(int(d // width), DEPTH_BINS - 1) for d in found}
    return {d: (width * (k + 0.5), f"{width * k:g}-{width * (k + 1):g}%") for d, k in bins.items()}


def depth_cell(cell: pd.DataFrame, broad: pd.DataFrame) -> tuple[float, int, str]:
    """(score, samples, status) of one depth cell as ruler_task_scores scores a task: the mean sample score x 100
    rounded to 2 decimals; a failed sample there, or one of its task and length without a depth (`broad`), makes
    it that failure (NaN), never a 0."""
    ok = cell[cell["status"] == "ok"]
    failed = pd.concat([cell[cell["status"] != "ok"], broad])
    if len(failed):
        return float("nan"), len(ok), str(failed["status"].iloc[0])
    return round(float(ok["score"].astype(float).mean()) * 100, 2), len(ok), "ok"


def ruler_depth_scores(rows: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """One row per (model, label, ruler_task, length, depth column) of the tasks whose rows carry a depth (0-100:
    where the answer sits), scored by depth_cell; `depth` is the column's position, `depth_label` its header.
    Empty (DEPTH_SCORE_COLUMNS) when no row has a depth."""
    df = latest_rows(rows, ("model", "label", "ruler_task", "length", "sample"))
    if df.empty or "depth" not in df:
        return pd.DataFrame(columns=DEPTH_SCORE_COLUMNS)
    df["depth"] = pd.to_numeric(df["depth"], errors="coerce")
    out = []
    for task, t in df.groupby("ruler_task", sort=False):
        where = depth_columns(t["depth"].dropna())
        if not where:
            continue  # a task without a depth axis
        t = t.assign(x=[where[d][0] if d in where else math.nan for d in t["depth"]])
        labels = dict(where.values())
        for (model, label, length), g in t.groupby(["model", "label", "length"], sort=False):
            broad = g[g["x"].isna() & (g["status"] != "ok")]
            for x in sorted(labels):
                cell = g[g["x"] == x]
                if cell.empty and broad.empty:
                    continue
                score, samples, status = depth_cell(cell, broad)
                out.append([model, label, task, int(length), x, labels[x], score, samples, status])
    return pd.DataFrame(out, columns=DEPTH_SCORE_COLUMNS)
