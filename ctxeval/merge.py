"""Merge run directories (ppl, needle, passkey, entropy; any models) into comparison tables and combined plots.

Tables are built from rows.jsonl only; run.json is read for metadata (task, model, dtype, original length,
protocol, data, status). Runs are grouped by protocol: runs whose protocol or data differ never share a table.

- **Group key** (what must agree for two runs to share a table):
  ppl: data spec, documents, text field, protocol, stride, BOS, aggregate;
  needle / passkey: the needle preset (every field), haystack, text field, depths, samples, seed, scoring,
  generation budget, chat template, snap;
  entropy: data spec, documents, text field, BOS, layers, heads.
  Lengths, models and methods are not part of it: they are the table's columns and rows, and a length a run did
  not measure is a missing cell ("—"), never zero.
- **Same (model, method) in several runs of one group**: merged point by point (a short run and a long run fill
  one row). A point measured by more than one run is taken from the run started later, except that a measured
  value is never replaced by a failure (oom / skipped); every such overlap is listed in the group's notes.
- **Same model name with different dtypes** in one group: rows are labelled `model (dtype)` so they never merge.
- **A report directory** (written by `ctxeval report --out`: report.json, no run.json) among the paths, as in
  `results/*/`, is skipped with a note; given alone it is an error.
"""

from __future__ import annotations

import csv
import datetime as _dt
import io
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import pandas as pd

from . import report as R
from .errors import CtxevalError
from .store import ROWS_FILE, RUN_FILE, read_rows

KINDS = ("ppl", "needle", "passkey", "entropy")
KIND_TITLES = {"ppl": "Perplexity", "needle": "Needle in a haystack", "passkey": "Passkey retrieval",
               "entropy": "Attention entropy"}
# the fields of one point: a point measured twice is one cell, not two
POINT_FIELDS = {"ppl": ("model", "label", "length", "doc"),
                "needle": ("model", "label", "length", "depth", "sample"),
                "passkey": ("model", "label", "length", "sample"),
                "entropy": ("model", "label", "length", "doc")}
REQUIRED = {"ppl": ("model", "label", "length", "doc", "status"),
            "needle": ("model", "label", "length", "depth", "sample", "status"),
            "passkey": ("model", "label", "length", "sample", "status"),
            "entropy": ("model", "label", "length", "doc", "status")}
REQUIRED_OK = {"ppl": ("nll_sum", "n_tokens"), "needle": ("correct",), "passkey": ("correct",), "entropy": ("entropy",)}
FAILED = {"oom", "skipped", "error"}
WRITERS = "ctxeval ppl, needle, passkey or entropy"
# entropy tables end with the upper bound: uniform attention over the visible keys, a function of the length only
UNIFORM_MODEL = "any model"
UNIFORM_LABEL = "uniform (ln of visible keys)"


# ---------------------------------------------------------------------------------------------------------------
# runs


@dataclass
class Run:
    """One run directory: run.json (metadata) and its rows."""

    path: Path
    name: str  # as the user gave it (used in headings and notes)
    task: str  # ppl | needle | passkey | entropy
    record: dict[str, Any]
    rows: list[dict[str, Any]]
    order: int  # position on the command line

    @property
    def spec(self) -> dict[str, Any]:
        return self.record.get("spec") or {}

    @property
    def status(self) -> str:
        return str(self.record.get("status") or "unknown")

    @property
    def started(self) -> _dt.datetime | None:
        text = self.record.get("started")
        try:
            stamp = _dt.datetime.fromisoformat(text) if text else None
        except (TypeError, ValueError):
            return None
        if stamp is not None and stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=_dt.timezone.utc)
        return stamp

    @property
    def dtype(self) -> str | None:
        return self.spec.get("dtype") or (self.record.get("model") or {}).get("dtype")

    @property
    def models(self) -> list[str]:
        return list(dict.fromkeys(str(r["model"]) for r in self.rows))

    @property
    def original_length(self) -> int | None:
        """The model's trained length: the RoPE geometry's original length, else max_position_embeddings."""
        for entry in (self.record.get("methods") or {}).values():
            geometry = (entry or {}).get("geometry") or {}
            if geometry.get("original_length"):
                return int(geometry["original_length"])
        mpe = (self.record.get("model") or {}).get("max_position_embeddings")
        return int(mpe) if mpe else None


def load_run(path: Path | str, order: int = 0) -> Run:
    """Read one run directory; a CtxevalError (one line, what to do) for anything that is not a usable run."""
    given = str(path).rstrip("/") or str(path)
    p = Path(path)
    if p.is_file() and p.name == RUN_FILE:
        p = p.parent
    if not p.exists():
        raise CtxevalError(f"run directory {given} does not exist; pass directories written by {WRITERS}")
    if not p.is_dir():
        raise CtxevalError(f"{given} is a file, not a run directory; pass the directory that holds run.json and rows.jsonl")
    run_json = p / RUN_FILE
    if not run_json.exists():
        inner = sorted(d.name for d in p.iterdir() if (d / RUN_FILE).exists()) if p.is_dir() else []
        if inner:
            raise CtxevalError(f"{given} is not a run directory but holds {len(inner)} (e.g. {inner[0]}); "
                               f"pass them one by one, e.g. {given}/*/")
        if is_report_dir(p):
            raise CtxevalError(f"{given} holds a report written by ctxeval report --out, not a run (no run.json); "
                               f"pass the run directories it was made from")
        raise CtxevalError(f"{given} is not a ctxeval run directory (no run.json); pass directories written by "
                           f"{WRITERS}")
    try:
        record = json.loads(run_json.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CtxevalError(f"{run_json} cannot be read ({type(exc).__name__}); it is not a ctxeval run.json, "
                           "leave this directory out") from None
    if not isinstance(record, dict):
        raise CtxevalError(f"{run_json} is not a ctxeval run.json (not a JSON object); leave this directory out")
    rows = read_rows(p / ROWS_FILE)
    spec = record.get("spec") if isinstance(record.get("spec"), dict) else {}
    task = spec.get("task") or (rows[0].get("task") if rows else None)
    if task not in KINDS:
        raise CtxevalError(f"{given}: unknown task '{task}' in run.json; ctxeval report merges ppl, needle, "
                           "passkey and entropy runs")
    if not rows:
        raise CtxevalError(f"{given} has no measured rows ({ROWS_FILE} missing or empty); resume the run with "
                           "its original command, or leave it out")
    for i, row in enumerate(rows, 1):
        need = REQUIRED[task] + (REQUIRED_OK[task] if row.get("status") == "ok" else ())
        lacking = [f for f in need if f not in row]
        if lacking:
            raise CtxevalError(f"{given}/{ROWS_FILE} line {i} lacks {', '.join(lacking)}: not a ctxeval {task} row; "
                               "leave this directory out")
    return Run(p, given, task, record, rows, order)


def is_report_dir(path: Path) -> bool:
    """A directory written by `ctxeval report --out` (its report.json; no run.json): not a run."""
    if (path / RUN_FILE).exists() or not (path / "report.json").is_file():
        return False
    try:
        data = json.loads((path / "report.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and {"settings", "runs", "groups"} <= set(data)


def load_runs(paths: Sequence[Path | str]) -> tuple[list[Run], list[str]]:
    """Load every run (a path given twice is used once; a report directory among runs is skipped). Returns the runs
    and notes about them."""
    if not paths:
        raise CtxevalError(f"no run directories given; pass one or more directories written by {WRITERS}")
    runs: list[Run] = []
    seen: dict[Path, str] = {}
    notes: list[str] = []
    reports = [p for p in paths if Path(p).is_dir() and is_report_dir(Path(p))]
    for path in paths:
        if path in reports and len(reports) < len(paths):
            notes.append(f"{str(path).rstrip('/') or path} holds a report written by ctxeval report --out, not a run; "
                         "skipped")
            continue
        run = load_run(path, order=len(runs))
        resolved = run.path.resolve()
        if resolved in seen:
            notes.append(f"{run.name} was given twice (as {seen[resolved]}); used once")
            continue
        seen[resolved] = run.name
        runs.append(run)
    for run in runs:
        if run.status != "success":
            notes.append(f"{run.name} is incomplete (status {run.status}): cells it did not reach show as {R.MISSING}")
    return runs, notes


# ---------------------------------------------------------------------------------------------------------------
# protocol keys and groups


def _documents(run: Run) -> list[str]:
    """The run's documents as run.json's data.documents lists them (else as its rows name them), in order."""
    data = run.record.get("data") or {}
    docs = [str(d.get("doc")) for d in data.get("documents") or [] if isinstance(d, dict)]
    return docs or list(dict.fromkeys(str(r["doc"]) for r in run.rows))


def protocol_key(run: Run, aggregate: str | None = None) -> dict[str, Any]:
    """What must agree for runs to share a table (flat: field -> JSON-able value)."""
    spec = run.spec
    if run.task in ("ppl", "entropy"):
        proto = run.record.get("protocol") or {}
        corpus = {"data": spec.get("data", (run.record.get("data") or {}).get("spec")), "documents": _documents(run),
                  "text_field": spec.get("text_field", "text")}
        if run.task == "ppl":
            return {**corpus, "protocol": proto.get("name", spec.get("protocol")),
                    "stride": proto.get("stride", spec.get("stride")), "bos": proto.get("bos", spec.get("bos")),
                    "aggregate": aggregate or proto.get("aggregate", "token")}
        return {**corpus, "bos": spec.get("bos", proto.get("bos")), "layers": spec.get("layers", "all"),
                "heads": spec.get("heads", "all")}
    preset = spec.get("preset")
    key: dict[str, Any] = {}
    if isinstance(preset, dict):
        key["preset"] = preset.get("name")
        key.update({f"preset.{k}": v for k, v in preset.items() if k != "name"})
    else:
        key["preset"] = preset or (run.rows[0].get("preset"))
    key.update({
        "haystack": spec.get("haystack"),
        "text_field": spec.get("text_field", "text"),
        "depths": "random" if run.task == "passkey" or spec.get("random_depth") else spec.get("depths"),
        "samples": spec.get("samples"),
        "seed": spec.get("seed", run.record.get("seed")),
        "scoring": spec.get("scoring", run.rows[0].get("scoring")),
        "max_new_tokens": spec.get("max_new_tokens"),
        "chat_template": spec.get("chat_template"),
        "snap": spec.get("snap"),
    })
    return key


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _field(name: str) -> str:
    return name.replace("_", " ")


def fmt_value(value: Any) -> str:
    """A protocol field's value for headings: on/off, comma lists, long strings shortened."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "none"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ",".join(fmt_value(v) for v in value) or "none"
    if isinstance(value, dict):
        return _canon(value)
    text = " ".join(str(value).split())
    return text if len(text) <= 48 else text[:45] + "..."


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

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row)) for row in self.rows]


@dataclass
class Group:
    """Runs of one kind that agree on the protocol: they share tables."""

    id: str  # ppl-1, needle-1, ...
    kind: str
    number: int
    of: int
    key: dict[str, Any]
    runs: list[Run]
    distinguishing: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    original_lengths: dict[str, int] = field(default_factory=dict)
    grids: dict[tuple[str, str], tuple[pd.DataFrame, pd.DataFrame]] = field(default_factory=dict)

    @property
    def title(self) -> str:
        title = KIND_TITLES[self.kind]
        if self.of > 1:
            title += f" ({self.number} of {self.of})"
            if self.distinguishing:
                title += ": " + ", ".join(f"{_field(f)} {fmt_value(self.key.get(f))}" for f in self.distinguishing)
        return title

    @property
    def description(self) -> str:
        quiet = {"text_field": "text", "max_new_tokens": None}  # shown only when not the default
        if self.key.get("protocol") != "sliding":
            quiet["stride"] = None
        shown = [f for f in self.key if (not f.startswith("preset.") and not (f in quiet and self.key[f] == quiet[f]))
                 or f in self.distinguishing]
        return " · ".join(f"{_field(f)} {fmt_value(self.key.get(f))}" for f in shown)


def group_runs(runs: Sequence[Run], aggregate: str | None = None, single: bool = False) -> list[Group]:
    """Group runs by (kind, protocol key); kinds in the order ppl, needle, passkey, entropy, groups in command-line
    order.

    single=True refuses (CtxevalError) when the runs of one kind would need more than one table."""
    found: dict[tuple[str, str], tuple[dict[str, Any], list[Run]]] = {}
    for run in runs:
        key = protocol_key(run, aggregate)
        found.setdefault((run.task, _canon(key)), (key, []))[1].append(run)
    groups: list[Group] = []
    for kind in KINDS:
        mine = [(key, members) for (k, _), (key, members) in found.items() if k == kind]
        fields = list(dict.fromkeys(f for key, _ in mine for f in key))
        differ = [f for f in fields if len({_canon(key.get(f)) for key, _ in mine}) > 1]
        if single and len(mine) > 1:
            values = "; ".join(f"{members[0].name}: " + ", ".join(f"{_field(f)} {fmt_value(key.get(f))}" for f in differ)
                               for key, members in mine)
            raise CtxevalError(f"--single: the {kind} runs differ in {', '.join(map(_field, differ))} ({values}); drop --single "
                               "to get one table per protocol, or leave runs out")
        for n, (key, members) in enumerate(mine, 1):
            groups.append(Group(f"{kind}-{n}", kind, n, len(mine), key, members, differ))
    return groups


# ---------------------------------------------------------------------------------------------------------------
# merging rows


def _display_models(group: Group) -> dict[tuple[int, str], str]:
    """(run order, row model) -> display name; `model (dtype)` where one model name comes with several dtypes."""
    dtypes: dict[str, set[str]] = {}
    for run in group.runs:
        for model in run.models:
            dtypes.setdefault(model, set()).add(str(run.dtype))
    return {(run.order, m): (f"{m} ({run.dtype})" if len(dtypes[m]) > 1 else m) for run in group.runs for m in run.models}


def merge_rows(group: Group) -> tuple[list[dict[str, Any]], list[str]]:
    """The group's rows with one row per point, and notes on points more than one run measured.

    Within a run the last row per point wins (a resumed point replaces its failure). Across runs the run started
    later wins (ties: the later one on the command line), except that a measured value is never replaced by a
    failure."""
    names = _display_models(group)
    point = POINT_FIELDS[group.kind]
    chosen: dict[tuple, tuple[Run, dict[str, Any]]] = {}
    overlaps: Counter[tuple[str, str, str, str, str]] = Counter()
    epoch = _dt.datetime.min.replace(tzinfo=_dt.timezone.utc)
    for run in sorted(group.runs, key=lambda r: (r.started or epoch, r.order)):
        latest: dict[tuple, dict[str, Any]] = {}
        for row in run.rows:
            row = {**row, "model": names[(run.order, str(row["model"]))], "length": int(row["length"])}
            latest[tuple(_canon(row.get(f)) for f in point)] = row
        for key, row in latest.items():
            if key in chosen:
                old_run, old = chosen[key]
                keep_new = row.get("status") == "ok" or old.get("status") != "ok"
                reason = "later" if keep_new else str(row.get("status"))
                overlaps[(row["model"], str(row["label"]), old_run.name, run.name, reason)] += 1
                if not keep_new:
                    continue
            chosen[key] = (run, row)
    notes = []
    for (model, label, older, newer, reason), n in overlaps.items():
        head = f"{model} · {label}: {n} point(s) measured by both {older} and {newer}; "
        notes.append(head + (f"kept {newer}'s (started later)" if reason == "later" else
                             f"kept {older}'s values ({newer} has {reason} there; a failure never replaces a value)"))
    return [row for _, row in chosen.values()], notes


def _row_order(group: Group, rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(model, method) in command-line order: models as they first appear, methods in each run's order."""
    names = _display_models(group)
    order: list[tuple[str, str]] = []
    for run in sorted(group.runs, key=lambda r: r.order):
        labels = list(dict.fromkeys([*map(str, run.spec.get("methods") or []), *(str(r["label"]) for r in run.rows)]))
        for model in run.models:
            order += [(names[(run.order, model)], label) for label in labels]
    present = {(r["model"], str(r["label"])) for r in rows}
    return [pair for pair in dict.fromkeys(order) if pair in present]


def _num(value: Any) -> float | int | None:
    """JSON/CSV-safe number: NaN and None -> None, integer types -> int, numpy scalars -> Python."""
    import numpy as np

    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    number = float(value)
    return None if math.isnan(number) else number


def _int_or_none(value: Any) -> int | None:
    number = _num(value)
    return None if number is None else int(number)


def _csv_value(value: Any) -> str:
    number = _num(value)
    if number is None:
        return ""
    return str(number) if isinstance(number, int) else f"{number:.6g}"


def _len_or(value: Any, missing: str) -> str:
    return R.fmt_length(int(value)) if _num(value) is not None else missing


# ---------------------------------------------------------------------------------------------------------------
# tables


def _ppl_tables(group: Group, rows: list[dict[str, Any]], tolerance: float) -> list[Table]:
    aggregate = group.key.get("aggregate") or "token"
    if aggregate == "window" and any(r.get("status") == "ok" and "window_nll_sum" not in r for r in rows):
        raise CtxevalError(f"the runs of {group.id} ({', '.join(r.name for r in group.runs)}) have no per-window "
                           "sums; use --aggregate token")
    long = R.ppl_long(rows, aggregate)
    cells = {(str(r.model), str(r.label), int(r.length)): (r.ppl, r.status) for r in long.itertuples()}
    lengths = sorted({k[2] for k in cells})
    pairs = _row_order(group, rows)

    raw, status, shown = [], [], []
    for model, label in pairs:
        vals, sts = [], []
        for length in lengths:
            value, st = cells.get((model, label, length), (None, "missing"))
            vals.append(_num(value))
            sts.append(None if st == "ok" else st)
        raw.append([model, label, *vals])
        status.append([None, None, *sts])
        shown.append([model, label, *(R.fmt_ppl(v if v is not None else float("nan"), s) for v, s in zip(vals, sts))])
    n_docs = len(group.key.get("documents") or [])
    originals = ", ".join(f"{m} {R.fmt_length(L)}" for m, L in group.original_lengths.items())
    main = Table(group.id, "ppl", group.title, ["model", "method", *map(str, lengths)],
                 ["model", "method", *map(R.fmt_length, lengths)], raw, status, shown,
                 caption=f"Perplexity ({aggregate}-weighted over {n_docs} document(s)); original length: {originals}.")

    # valid length: per model, over the lengths that model was evaluated at
    vcol = f"longest length within {tolerance:.0%}"
    vraw, vstatus, vshown = [], [], []
    models = list(dict.fromkeys(m for m, _ in pairs))
    for model in models:
        mine = [(m, l) for m, l in pairs if m == model]
        evaluated = sorted({k[2] for k in cells if k[0] == model})
        wide = pd.DataFrame([[float("nan") if _num(cells.get((model, label, L), (None,))[0]) is None
                              else float(cells[(model, label, L)][0]) for L in evaluated] for _, label in mine],
                            index=[label for _, label in mine], columns=evaluated)
        original = group.original_lengths.get(model) or max(evaluated)
        valid = R.valid_lengths(wide, original, tolerance)
        for (_, label), v in zip(mine, valid.itertuples(index=False)):
            ref_len, ref, longest, times = _int_or_none(v[1]), _num(v[2]), _int_or_none(v[3]), _num(v[4])
            ref_status = cells.get((model, label, int(ref_len)), (None, "missing"))[1]
            vraw.append([model, label, ref_len, ref, longest, times])
            vstatus.append([None, None, None, None if ref is not None else ref_status,
                            None if longest is not None else "missing", None])
            vshown.append([model, label, R.fmt_length(int(ref_len)),
                           R.fmt_ppl(ref if ref is not None else float("nan"), ref_status),
                           _len_or(longest, R.MISSING), f"{times:.2f}" if times is not None else R.MISSING])
    valid_table = Table(f"{group.id}-valid", "valid", f"Valid length (ppl within {tolerance:.0%} of the reference)",
                        ["model", "method", "reference length", "ppl at reference", vcol, "x original"],
                        ["model", "method", "reference length", "ppl at reference", vcol, "x original"],
                        vraw, vstatus, vshown,
                        caption="Reference: the model's original length (or the longest evaluated length below it); "
                                "the longest length, going up from it, whose ppl stays within the tolerance.")
    return [main, valid_table]


def _retrieval_table(group: Group, rows: list[dict[str, Any]], threshold: float) -> Table:
    df = R.needle_long(rows)
    df["model"] = df["model"].astype(str)
    df["label"] = df["label"].astype(str)
    lengths = sorted(int(x) for x in df["length"].unique())
    pairs = _row_order(group, rows)
    means = df[df["status"] == "ok"].groupby(["model", "label", "length"])["correct"].mean()
    seen = df.groupby(["model", "label", "length"])["status"].agg(
        lambda s: "ok" if (s == "ok").any() else str(s.iloc[0]))
    passkey = group.kind == "passkey"
    ctx_name = "passkey context" if passkey else "effective length"
    columns = ["model", "method", *map(str, lengths), ctx_name] + (["mean accuracy up to it"] if passkey else [])
    headers = ["model", "method", *map(R.fmt_length, lengths), f"{ctx_name} (>= {threshold:.0%})"] + (
        ["mean accuracy up to it"] if passkey else [])
    raw, status, shown = [], [], []
    late_start = False
    for model, label in pairs:
        vals, sts = [], []
        for length in lengths:
            st = seen.get((model, label, length), "missing")
            vals.append(_num(means.get((model, label, length))) if st == "ok" else None)
            sts.append(None if st == "ok" else st)
        evaluated = {L: (v if v is not None else float("nan")) for L, v, s in zip(lengths, vals, sts) if s != "missing"}
        ctx = R.effective_length(pd.Series(evaluated, dtype=float), threshold) if evaluated else None
        late = bool(evaluated) and min(evaluated) > lengths[0]
        late_start |= late
        ctx_text = (R.fmt_length(ctx) if ctx is not None else "none") + ("†" if late else "")
        row_raw = [model, label, *vals, ctx]
        row_st: list[str | None] = [None, None, *sts, None if ctx is not None else "none"]
        row_shown = [model, label, *(R.fmt_acc(v if v is not None else float("nan"), s) for v, s in zip(vals, sts)),
                     ctx_text]
        if passkey:
            upto = [v for L, v in evaluated.items() if ctx is not None and L <= ctx and not math.isnan(v)]
            mean = sum(upto) / len(upto) if upto else None
            row_raw.append(mean)
            row_st.append(None if mean is not None else "missing")
            row_shown.append(R.fmt_acc(mean if mean is not None else float("nan")))
        raw.append(row_raw)
        status.append(row_st)
        shown.append(row_shown)
        if not passkey:
            grid, gstatus = R.accuracy_grid(df[df["model"] == model], label)
            depths = sorted(df["depth"].astype(float).unique())
            group.grids[(model, label)] = (grid.reindex(index=depths, columns=lengths),
                                           gstatus.reindex(index=depths, columns=lengths))
    what = "samples at random depths" if passkey else "depths and samples"
    caption = (f"Mean accuracy over {what}, scored without an LLM judge; {ctx_name}: the longest length such that "
               f"every evaluated length up to it has mean accuracy >= {threshold:.0%}.")
    footnotes = [f"† not evaluated at the table's shorter lengths: counted from the shortest length it was "
                 "evaluated at"] if late_start else []
    return Table(group.id, group.kind, group.title, columns, headers, raw, status, shown, caption, footnotes)


def uniform_entropy(length: int) -> float:
    """Mean over queries 0..L-1 of ln(i+1) = ln(L!)/L: the entropy of uniform causal attention (the upper bound)."""
    return math.lgamma(length + 1) / length


def fmt_entropy(value: Any, status: str | None = None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return {"oom": "OOM", "skipped": "skip"}.get(status or "", R.MISSING)
    return f"{value:.3f}"


def _entropy_table(group: Group, rows: list[dict[str, Any]]) -> Table:
    """Rows = model x method, columns = length, value = the mean over documents of each point's entropy (itself the
    mean over layers, heads and query positions); a cell with a failed document shows the failure, as in ppl.
    The last row is the uniform-attention bound, which depends on the length only."""
    points: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for row in rows:
        points.setdefault((str(row["model"]), str(row["label"]), int(row["length"])), []).append(row)
    lengths = sorted({k[2] for k in points})
    pairs = _row_order(group, rows)
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
            vals.append(_num(sum(float(r["entropy"]) for r in mine) / len(mine)))
            sts.append(None)
            if len(mine) < n_docs:
                partial.append(f"{R.fmt_length(length)} ({len(mine)} of {n_docs})")
        if partial:
            group.notes.append(f"{model} · {label}: averaged over fewer documents than the protocol's at "
                               f"{', '.join(partial)}; the run did not measure the others")
            partial = []
        raw.append([model, label, *vals])
        status.append([None, None, *sts])
        shown.append([model, label, *(fmt_entropy(v, s) for v, s in zip(vals, sts))])
    recorded = {int(r["length"]): float(r["uniform_entropy"]) for r in rows
                if r.get("status") == "ok" and _num(r.get("uniform_entropy")) is not None}
    bound = [recorded.get(L, uniform_entropy(L)) for L in lengths]
    raw.append([UNIFORM_MODEL, UNIFORM_LABEL, *bound])
    status.append([None, None, *([None] * len(lengths))])
    shown.append([UNIFORM_MODEL, UNIFORM_LABEL, *(fmt_entropy(v) for v in bound)])
    originals = ", ".join(f"{m} {R.fmt_length(L)}" for m, L in group.original_lengths.items())
    caption = (f"Mean attention entropy in nats (over layers, heads, query positions and {n_docs} document(s)); "
               f"original length: {originals}. Last row: the entropy if every query attended evenly to the keys it "
               "sees, mean ln(i+1), the upper bound; it depends on the length only, the same for every model and "
               "method.")
    return Table(group.id, "entropy", group.title, ["model", "method", *map(str, lengths)],
                 ["model", "method", *map(R.fmt_length, lengths)], raw, status, shown, caption=caption)


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


def build_report(paths: Sequence[Path | str], *, threshold: float = 0.8, tolerance: float = 0.10,
                 aggregate: str | None = None, single: bool = False) -> Report:
    """Load the runs, group them by protocol and build every group's tables."""
    if not 0 < threshold <= 1:
        raise CtxevalError(f"--threshold must be in (0, 1], got {threshold}")
    if tolerance < 0:
        raise CtxevalError(f"--valid-tolerance must be >= 0, got {tolerance}")
    if aggregate not in (None, "token", "window"):
        raise CtxevalError(f"--aggregate must be token or window, got '{aggregate}'")
    runs, notes = load_runs(paths)
    groups = group_runs(runs, aggregate, single)
    for group in groups:
        names = _display_models(group)
        for run in group.runs:
            for model in run.models:
                if run.original_length and names[(run.order, model)] not in group.original_lengths:
                    group.original_lengths[names[(run.order, model)]] = run.original_length
        rows, group.notes = merge_rows(group)
        if group.kind == "ppl":
            group.tables = _ppl_tables(group, rows, tolerance)
        elif group.kind == "entropy":
            group.tables = [_entropy_table(group, rows)]
        else:
            group.tables = [_retrieval_table(group, rows, threshold)]
    kinds = Counter(g.kind for g in groups)
    for kind, n in kinds.items():
        if n > 1:
            differ = groups[[g.kind for g in groups].index(kind)].distinguishing
            notes.append(f"the {kind} runs differ in {', '.join(map(_field, differ))}: shown as {n} separate tables, never mixed")
    return Report(runs, groups, notes, threshold, tolerance, aggregate)


# ---------------------------------------------------------------------------------------------------------------
# renderers


def to_markdown(rep: Report, images: dict[str, str] | None = None) -> str:
    """The whole report as markdown; `images` (group id -> file name) adds the plots."""
    parts = ["# ctxeval report\n\n"]
    parts.append(R.markdown(["run", "task", "model", "status", "rows", "table"],
                            [[f"`{r.name}`", r.task, ", ".join(r.models), r.status, str(len(r.rows)),
                              next(g.id for g in rep.groups if r in g.runs)] for r in rep.runs]))
    if rep.notes:
        parts.append("\n" + "".join(f"- {n}\n" for n in rep.notes))
    for group in rep.groups:
        parts.append(f"\n## {group.title}\n\n")
        parts.append(f"Protocol: {group.description}. Runs: {', '.join(f'`{r.name}`' for r in group.runs)}.\n")
        for i, table in enumerate(group.tables):
            if i:
                parts.append(f"\n### {table.title}\n")
            if table.caption:
                parts.append(f"\n{table.caption}\n")
            parts.append("\n" + R.markdown(table.headers, table.cells))
            if table.footnotes:
                parts.append("\n" + "".join(f"{f}\n" for f in table.footnotes))
        if group.notes:
            parts.append("\n" + "".join(f"- {n}\n" for n in group.notes))
        if images and group.id in images:
            parts.append(f"\n![{group.title}]({images[group.id]})\n")
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
                w.writerow([table.id, table.title, row[0], row[1], col, _csv_value(value), st or "ok"])
    return buf.getvalue()


def table_csv(table: Table) -> str:
    """One table as a wide CSV (the markdown's shape, raw values; missing = empty)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(table.columns)
    for row in table.rows:
        w.writerow(row[:2] + [_csv_value(v) for v in row[2:]])
    return buf.getvalue()


def to_json(rep: Report, images: dict[str, str] | None = None) -> dict[str, Any]:
    """The report as plain JSON-able data (missing values are null, never 0)."""
    def table_json(t: Table) -> dict[str, Any]:
        return {"id": t.id, "kind": t.kind, "title": t.title, "caption": t.caption, "columns": t.columns,
                "rows": [{c: (v if i < 2 else _num(v)) for i, (c, v) in enumerate(zip(t.columns, row))} for row in t.rows],
                "status": [{c: s for c, s in zip(t.columns, sts) if s is not None} for sts in t.status],
                "footnotes": t.footnotes}

    return {
        "settings": {"threshold": rep.threshold, "valid_tolerance": rep.tolerance, "aggregate": rep.aggregate},
        "runs": [{"path": r.name, "task": r.task, "models": r.models, "status": r.status,
                  "started": r.record.get("started"), "rows": len(r.rows),
                  "group": next(g.id for g in rep.groups if r in g.runs)} for r in rep.runs],
        "groups": [{"id": g.id, "kind": g.kind, "title": g.title, "protocol": g.key, "distinguishing": g.distinguishing,
                    "runs": [r.name for r in g.runs], "original_lengths": g.original_lengths, "notes": g.notes,
                    "tables": [table_json(t) for t in g.tables],
                    "plot": (images or {}).get(g.id)} for g in rep.groups],
        "notes": rep.notes,
    }


# ---------------------------------------------------------------------------------------------------------------
# plots


def _plt() -> Any:
    from . import plots  # noqa: F401  (selects the Agg backend)
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    _plt().close(fig)
    return path


def _length_ticks(ax: Any, lengths: Iterable[int]) -> None:
    lengths = list(lengths)
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths)
    ax.set_xticklabels([R.fmt_length(c) for c in lengths])
    ax.minorticks_off()


def _styles(pairs: list[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any]]:
    """One colour per method (the same method keeps its colour across models), one line style per model."""
    plt = _plt()
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    dashes = ["-", "--", ":", "-."]
    methods = list(dict.fromkeys(l for _, l in pairs))
    models = list(dict.fromkeys(m for m, _ in pairs))
    return {(m, l): {"color": colors[methods.index(l) % len(colors)], "ls": dashes[models.index(m) % len(dashes)]}
            for m, l in pairs}


def _curve_label(group: Group, model: str, label: str) -> str:
    models = {r[0] for r in group.tables[0].rows if not (r[0] == UNIFORM_MODEL and r[1] == UNIFORM_LABEL)}
    return f"{model} · {label}" if len(models) > 1 else label


def _finish_group_plot(fig: Any, ax: Any, group: Group, lengths: list[int], xlabel: str, ylabel: str,
                       path: Path) -> Path:
    """Original lengths marked, log2 length axis, labels, title, grid, legend; saved to `path`."""
    for i, (L, models) in enumerate(_by_length(group.original_lengths, lengths).items()):
        ax.axvline(L, color="black", ls=[":", "--", "-."][i % 3], lw=1,
                   label=f"original length {R.fmt_length(L)}" + (f" ({', '.join(models)})" if len(group.original_lengths) > 1 else ""))
    _length_ticks(ax, lengths)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{group.title}\n{group.description}", fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return _save(fig, path)


def plot_ppl_group(group: Group, path: Path) -> Path:
    """Perplexity vs. length for every model x method of the group on one figure (log y, original lengths marked)."""
    plt = _plt()
    table = group.tables[0]
    lengths = [int(c) for c in table.columns[2:]]
    fig, ax = plt.subplots(figsize=(8, 5))
    styles = _styles([(r[0], r[1]) for r in table.rows])
    for row in table.rows:
        pts = [(L, v) for L, v in zip(lengths, row[2:]) if v is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=4, lw=1.5,
                    label=_curve_label(group, row[0], row[1]), **styles[(row[0], row[1])])
    ax.set_yscale("log")
    from matplotlib import ticker

    ax.yaxis.set_major_formatter(ticker.LogFormatter())
    ax.yaxis.set_minor_formatter(ticker.LogFormatter(labelOnlyBase=False))
    return _finish_group_plot(fig, ax, group, lengths, "evaluation length (tokens)", "perplexity (log scale)", path)


def plot_entropy_group(group: Group, path: Path) -> Path:
    """Mean attention entropy vs. length for every model x method on one figure (log2 x), uniform attention dashed,
    original lengths marked."""
    plt = _plt()
    table = group.tables[0]
    lengths = [int(c) for c in table.columns[2:]]
    fig, ax = plt.subplots(figsize=(8, 5))
    measured = [r for r in table.rows if not (r[0] == UNIFORM_MODEL and r[1] == UNIFORM_LABEL)]
    styles = _styles([(r[0], r[1]) for r in measured])
    for row in table.rows:
        pts = [(L, v) for L, v in zip(lengths, row[2:]) if v is not None]
        if not pts:
            continue
        if row in measured:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=4, lw=1.5,
                    label=_curve_label(group, row[0], row[1]), **styles[(row[0], row[1])])
        else:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color="grey", ls="--", lw=1.2,
                    label="uniform attention (ln of visible keys)")
    return _finish_group_plot(fig, ax, group, lengths, "context length (tokens)", "mean attention entropy (nats)", path)


def _by_length(originals: dict[str, int], lengths: Sequence[int]) -> dict[int, list[str]]:
    """Original length -> its models, for the lengths inside the plotted range."""
    out: dict[int, list[str]] = {}
    for model, L in originals.items():
        if lengths and min(lengths) <= L <= max(lengths):
            out.setdefault(L, []).append(model)
    return out


def plot_passkey_group(group: Group, threshold: float, path: Path) -> Path:
    """Passkey accuracy vs. length for every model x method, the threshold marked."""
    plt = _plt()
    table = group.tables[0]
    lengths = [int(c) for c in table.columns[2:-2]]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    styles = _styles([(r[0], r[1]) for r in table.rows])
    for row in table.rows:
        pts = [(L, v) for L, v in zip(lengths, row[2:2 + len(lengths)]) if v is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=4,
                    label=_curve_label(group, row[0], row[1]), **styles[(row[0], row[1])])
    ax.axhline(threshold, color="grey", lw=1, ls="--", label=f"threshold {threshold:.0%}")
    for L in _by_length(group.original_lengths, lengths):
        ax.axvline(L, color="black", ls=":", lw=1)
    _length_ticks(ax, lengths)
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("accuracy")
    ax.set_title(f"{group.title}\n{group.description}", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path)


def plot_needle_group(group: Group, path: Path) -> Path:
    """The group's heatmaps (depth x length) side by side in one figure, on shared axes and one colour scale."""
    import matplotlib
    import numpy as np

    plt = _plt()
    items = [(pair, group.grids[pair]) for pair in ((r[0], r[1]) for r in group.tables[0].rows) if pair in group.grids]
    n = len(items)
    ncols = min(n, 4)
    nrows = math.ceil(n / ncols)
    first = items[0][1][0]
    width = max(3.0, 0.8 * first.shape[1] + 1.2)
    height = max(2.2, 0.35 * first.shape[0] + 1.4)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols + 1.2, height * nrows + 0.8), squeeze=False,
                             sharey=True, layout="constrained")
    cmap = matplotlib.colormaps["RdYlGn"].with_extremes(bad="#dddddd")
    im = None
    for ax, ((model, label), (grid, status)) in zip(axes.ravel(), items):
        values = grid.to_numpy(dtype=float)
        im = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=0, vmax=1, aspect="auto")
        for i in range(values.shape[0]):
            for j in range(values.shape[1]):
                v = values[i, j]
                text = f"{v:.0%}" if not math.isnan(v) else {"oom": "OOM", "skipped": "skip"}.get(str(status.iat[i, j]), R.MISSING)
                ax.text(j, i, text, ha="center", va="center", fontsize=7)
        ax.set_xticks(range(values.shape[1]))
        ax.set_xticklabels([R.fmt_length(int(c)) for c in grid.columns], fontsize=8)
        ax.set_yticks(range(values.shape[0]))
        ax.set_yticklabels([f"{d:g}%" for d in grid.index], fontsize=8)
        L = group.original_lengths.get(model)
        past = [j for j, c in enumerate(grid.columns) if L is not None and c > L]
        if past:
            ax.axvline(past[0] - 0.5, color="black", lw=1.5, ls="--")
        ax.set_title(_curve_label(group, model, label), fontsize=9)
        ax.set_xlabel("context length", fontsize=8)
    for ax in axes[:, 0]:
        ax.set_ylabel("needle depth", fontsize=8)
    for ax in axes.ravel()[n:]:
        ax.set_visible(False)
    if im is not None:
        fig.colorbar(im, ax=axes.ravel().tolist(), fraction=0.046, pad=0.02, label="accuracy")
    fig.suptitle(f"{group.title} (dashed: past the original length)\n{group.description}", fontsize=9)
    return _save(fig, path)


def write_plots(rep: Report, out_dir: Path) -> dict[str, str]:
    """One PNG per group (ppl curves / needle heatmaps / passkey curves / entropy curves); returns group id -> file
    name."""
    images: dict[str, str] = {}
    for group in rep.groups:
        path = Path(out_dir) / f"{group.id}.png"
        if group.kind == "ppl":
            if any(v is not None for row in group.tables[0].rows for v in row[2:]):
                plot_ppl_group(group, path)
                images[group.id] = path.name
        elif group.kind == "needle":
            if group.grids:
                plot_needle_group(group, path)
                images[group.id] = path.name
        elif group.kind == "entropy":
            if any(v is not None for row in group.tables[0].rows[:-1] for v in row[2:]):
                plot_entropy_group(group, path)
                images[group.id] = path.name
        else:
            plot_passkey_group(group, rep.threshold, path)
            images[group.id] = path.name
    return images


def write_report(rep: Report, out_dir: Path) -> list[Path]:
    """table.md, report.json, report.csv (tidy), one wide CSV per table and one PNG per group, in out_dir."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise CtxevalError(f"--out {out_dir} is a file, not a directory; choose a directory path")
    if (out_dir / RUN_FILE).exists():
        raise CtxevalError(f"--out {out_dir} is a run directory (it holds run.json); choose another directory for the report")
    out_dir.mkdir(parents=True, exist_ok=True)
    images = write_plots(rep, out_dir)
    written = [out_dir / name for name in images.values()]
    import sys

    from .store import _now, environment

    record = {**to_json(rep, images), "generated": {  # how this report was made, as run.json says for a run
        "command": "ctxeval " + " ".join(sys.argv[1:]), "time": _now(), "environment": environment()}}
    files = {"table.md": to_markdown(rep, images), "report.csv": to_csv(rep),
             "report.json": json.dumps(record, indent=2, allow_nan=False, default=str) + "\n"}
    files.update({f"{t.id}.csv": table_csv(t) for t in rep.tables})
    for name, text in files.items():
        (out_dir / name).write_text(text, encoding="utf-8")
        written.append(out_dir / name)
    return written
