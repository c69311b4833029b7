"""Run directories as a report reads them: load, group by protocol, merge points measured by several runs.

Tables are built from rows.jsonl only; run.json is read for metadata (task, model, dtype, original length,
protocol, data, status). Runs are grouped by protocol: runs whose protocol or data differ never share a table.

- **Group key** (what must agree for two runs to share a table):
  ppl: data spec, documents, text field, protocol, stride, BOS, aggregate;
  needle / passkey: the needle preset (every field), haystack, text field, depths, samples, seed, scoring,
  generation budget, chat template, snap; passkey also its protocol (yarn or ctxeval) and BOS;
  entropy: data spec, documents, text field, BOS, layers, heads;
  tune: data spec, tuning and held-out documents, BOS (one row per tune run: the search's results are columns).
  Lengths, models and methods are not part of it: they are the table's columns and rows, and a length a run did
  not measure is a missing cell ("—"), never zero.
- **Same (model, method) in several runs of one group**: merged point by point (a short run and a long run fill
  one row). A point measured by more than one run is taken from the run started later, except that a measured
  value is never replaced by a failure (oom / skipped); every such overlap is listed in the group's notes.
- **Same model name with different dtypes** in one group: rows are labelled `model (dtype)` so they never merge.
- **Arguments** (expand_run_args): a folder that holds run directories (`results/`) stands for the run directories
  directly inside it, in name order; a path that is not a run directory (a file such as `results/README.md`, a
  folder without run.json, a report directory written by `ctxeval report --out`) is skipped with a note when a run
  directory remains, and is an error when none does. A tune run brings its winner's held-out ppl run (run.json
  tune.heldout_dir, an ordinary ppl run inside it), so the held-out comparison joins the ppl tables.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

import pandas as pd

from ..errors import CtxevalError, NothingMeasured
from ..rope.geometry import trained_length_of_record
from ..runs.rows import AGGREGATES, KINDS, MISSING, POINT_FIELDS, RULER_THRESHOLD, point_key
from ..runs.store import ROWS_FILE, RUN_FILE, how_it_ended, load_rows
from ..util.numbers import finite_number
from ..util.textfiles import read_json
from .tables import Table

WRITERS = "ctxeval ppl, needle, passkey, entropy, ruler, lm-eval or tune"
# run.json fields a report reads as objects: another shape means the file is not a ctxeval run.json
RECORD_OBJECTS = (
    "spec",
    "model",
    "data",
    "protocol",
    "key_tokens",
    "lm_eval",
    "environment",
    "distributed",
    "methods",
    "positions",
)


@dataclass
class Run:
    """One run directory: run.json (metadata) and its rows."""

    path: Path
    name: str  # as the user gave it (used in headings and notes)
    task: str  # ppl | needle | passkey | entropy
    record: dict[str, Any]
    rows: list[dict[str, Any]]
    order: int  # position on the command line
    skipped: str | None = None  # a note on the rows.jsonl lines left out (rows.row_problem), if any

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
        """The model's trained length (geometry.trained_length's rule, read from run.json's model record)."""
        return trained_length_of_record(self.record.get("model") or {})


def load_run(path: Path | str, order: int = 0) -> Run:
    """Read one run directory; a CtxevalError (one line, what to do) for anything that is not a usable run."""
    given = str(path).rstrip("/") or str(path)
    p = Path(path)
    if p.is_file() and p.name == RUN_FILE:
        p = p.parent
    if not p.exists():
        raise CtxevalError(f"run directory {given} does not exist; pass directories written by {WRITERS}")
    if not p.is_dir():
        raise CtxevalError(
            f"{given} is a file, not a run directory; pass the directory that holds run.json and rows.jsonl"
        )
    run_json = p / RUN_FILE
    if not run_json.exists():
        inner = sorted(d.name for d in p.iterdir() if (d / RUN_FILE).exists()) if p.is_dir() else []
        if inner:
            raise CtxevalError(
                f"{given} is not a run directory but holds {len(inner)} (e.g. {inner[0]}); "
                f"pass them one by one, e.g. {given}/*/"
            )
        if is_report_dir(p):
            raise CtxevalError(
                f"{given} holds a report written by ctxeval report --out, not a run (no run.json); "
                f"pass the run directories it was made from"
            )
        raise CtxevalError(
            f"{given} is not a ctxeval run directory (no run.json); pass directories written by {WRITERS}"
        )
    try:
        record = read_json(run_json, "", finite=False)
    except CtxevalError as exc:
        detail = str(exc).replace(str(run_json), "it").split("; ")[0]
        raise CtxevalError(
            f"{run_json} cannot be read as a ctxeval run.json ({detail}); leave this directory out"
        ) from None
    if not isinstance(record, dict):
        raise CtxevalError(f"{run_json} is not a ctxeval run.json (not a JSON object); leave this directory out")
    for name in RECORD_OBJECTS:
        if record.get(name) is not None and not isinstance(record[name], dict):
            raise CtxevalError(
                f"{run_json}: '{name}' is not a JSON object, as ctxeval writes it; not a ctxeval "
                "run.json: leave this directory out"
            )
    for where, value in (
        ("history", record.get("history")),
        ("spec.methods", (record.get("spec") or {}).get("methods")),
        ("spec.lengths", (record.get("spec") or {}).get("lengths")),
        ("spec.tasks", (record.get("spec") or {}).get("tasks")),
        ("data.documents", (record.get("data") or {}).get("documents")),
    ):
        if value is not None and not isinstance(value, list):
            raise CtxevalError(
                f"{run_json}: '{where}' is not a JSON list, as ctxeval writes it; not a ctxeval "
                "run.json: leave this directory out"
            )
    aggregate = (record.get("protocol") or {}).get("aggregate")
    if aggregate is not None and aggregate not in AGGREGATES:
        raise CtxevalError(
            f"{run_json}: protocol aggregate {str(aggregate)[:40]!r} is not one of "
            f"{', '.join(AGGREGATES)}; not a ctxeval run.json: leave this directory out"
        )
    threshold = (record.get("protocol") or {}).get("threshold")
    if threshold is not None and not (finite_number(threshold) is not None and 0 < threshold <= 100):
        raise CtxevalError(
            f"{run_json}: protocol threshold {threshold!r} is not a number in (0, 100]; not a ctxeval "
            "run.json: leave this directory out"
        )
    found = load_rows(p / ROWS_FILE)
    spec = record.get("spec") or {}
    task = spec.get("task") or (found.rows[0].get("task") if found.rows else None)
    if not isinstance(task, str) or task not in KINDS:
        raise CtxevalError(
            f"{given}: unknown task {str(task)[:40]!r} in run.json; ctxeval report merges ppl, needle, "
            "passkey, entropy, ruler, lm-eval and tune runs"
        )
    tasks = spec.get("tasks")
    if task == "ruler" and not (isinstance(tasks, list) and tasks and all(isinstance(t, str) for t in tasks)):
        raise CtxevalError(
            f"{run_json}: a RULER run's spec.tasks is not a list of task names; not a ctxeval run.json: "
            "leave this directory out"
        )
    found = found.checked(task)
    if not found.rows and found.skipped:
        why = "; ".join(f"line {n}: {w}" for n, w in found.skipped[:2])
        raise CtxevalError(
            f"{given}/{ROWS_FILE} holds no usable rows ({why}; ctxeval writes one UTF-8 JSON object per "
            "line); resume the run with its original command, or leave it out"
        )
    if not found.rows:
        raise NothingMeasured(
            f"{given} has no measured rows ({ROWS_FILE} missing or empty); resume the run with "
            "its original command, or leave it out",
            f"{given} measured nothing ({how_it_ended(record)}); skipped",
        )
    rows = found.rows
    run = Run(p, given, task, record, rows, order)
    run.skipped = found.note()
    return run


def not_a_run(path: Path | str) -> str | None:
    """Why an existing path is not a run directory, as a note ("X is a file, not a run directory"); None for a run
    directory, its run.json, a folder that holds run directories, and a path that does not exist (load_run tells
    those)."""
    given = str(path).rstrip("/") or str(path)
    p = Path(path)
    if p.is_file():
        return None if p.name == RUN_FILE else f"{given} is a file, not a run directory"
    if not p.is_dir() or (p / RUN_FILE).exists() or runs_inside(p):
        return None
    if is_report_dir(p):
        return f"{given} holds a report written by ctxeval report --out, not a run"
    return f"{given} is not a ctxeval run directory (no run.json)"


def runs_inside(path: Path) -> list[Path]:
    """The run directories (folders with run.json) directly inside `path`, in name order; [] if it is not a folder."""
    try:
        return sorted(d for d in path.iterdir() if d.is_dir() and (d / RUN_FILE).is_file()) if path.is_dir() else []
    except OSError:
        return []


def expand_run_args(paths: Sequence[Path | str]) -> tuple[list[Path | str], list[str]]:
    """The run directories a report's arguments name, and notes on what was done to them: a folder that holds run
    directories (as `results/`) is replaced by the run directories directly inside it, in name order; an argument
    that is not a run directory (a file such as results/README.md, a folder without run.json, a report directory)
    is left out, as long as one run directory remains (else load_run's one-line error for the first of them).
    Paths that do not exist and run directories that cannot be read are kept: load_run refuses them."""
    kept: list[Path | str] = []
    notes: list[str] = []
    left_out: list[tuple[Path | str, str]] = []
    for path in paths:
        p = Path(path)
        why = not_a_run(p)
        if why is not None:
            left_out.append((path, why))
            continue
        inner = [] if (p / RUN_FILE).exists() else runs_inside(p)
        if inner:
            given = str(path).rstrip("/") or str(path)
            others = sum(1 for _ in p.iterdir()) - len(inner)
            notes.append(
                f"{given} is a folder of run directories: using the {len(inner)} directly inside it, in "
                "name order"
                + (f" ({others} other entr{'y' if others == 1 else 'ies'} in it not run directories)" if others else "")
            )
            kept += inner
        else:
            kept.append(path)
    given = {Path(p).resolve() for p in kept}
    for path in list(kept):
        held = tune_heldout(Path(path))
        if held is not None and held.resolve() not in given:
            given.add(held.resolve())
            kept.insert(kept.index(path) + 1, held)
            notes.append(
                f"{str(path).rstrip('/') or path} is a tune run: its winner's held-out ppl run {held.name} "
                "joins the ppl tables"
            )
    if left_out and not kept:
        load_run(left_out[0][0])  # raises its one-line error
    notes[:0] = [f"{why}; skipped" for _, why in left_out]
    return kept, notes


def tune_heldout(path: Path) -> Path | None:
    """A tune run's held-out ppl run (run.json tune.heldout_dir, a directory inside it with a run.json); None for
    any other directory, or one whose run.json cannot be read (load_run says why)."""
    try:
        record = read_json(path / RUN_FILE, "", finite=False) if (path / RUN_FILE).is_file() else None
    except CtxevalError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("spec"), dict) or record["spec"].get("task") != "tune":
        return None
    return heldout_of_record(path, record)


def heldout_of_record(path: Path, record: dict[str, Any]) -> Path | None:
    """The held-out ppl run a tune run's run.json names (tune.heldout_dir: a plain name inside `path`), when it
    holds a run.json."""
    name = record.get("tune").get("heldout_dir") if isinstance(record.get("tune"), dict) else None
    if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
        return None
    held = Path(path) / name
    return held if (held / RUN_FILE).is_file() else None


def is_report_dir(path: Path) -> bool:
    """A directory written by `ctxeval report --out` (its report.json; no run.json): not a run."""
    if (path / RUN_FILE).exists() or not (path / "report.json").is_file():
        return False
    try:
        data = read_json(path / "report.json", "", finite=False)
    except CtxevalError:
        return False
    return isinstance(data, dict) and {"settings", "runs", "groups"} <= set(data)


def load_runs(paths: Sequence[Path | str]) -> tuple[list[Run], list[str]]:
    """Load every run (a path given twice is used once; a report directory among runs is skipped). Returns the runs
    and notes about them."""
    if not paths:
        raise CtxevalError(f"no run directories given; pass one or more directories written by {WRITERS}")
    runs: list[Run] = []
    seen: dict[Path, str] = {}
    paths, notes = expand_run_args(paths)
    empty: list[NothingMeasured] = []
    for path in paths:
        try:
            run = load_run(path, order=len(runs))
        except NothingMeasured as nothing:  # a run refused or stopped before its first point: nothing to show
            empty.append(nothing)
            notes.append(nothing.note)
            continue
        resolved = run.path.resolve()
        if resolved in seen:
            notes.append(f"{run.name} was given twice (as {seen[resolved]}); used once")
            continue
        seen[resolved] = run.name
        runs.append(run)
    if not runs and empty:
        if len(empty) == 1:
            raise empty[0]
        raise CtxevalError(f"none of the {len(empty)} run directories given measured anything; {empty[0].note}")
    for run in runs:
        if run.skipped:
            notes.append(f"{run.name}: {run.skipped}")
        if run.status != "success":
            notes.append(f"{run.name} is incomplete (status {run.status}): cells it did not reach show as {MISSING}")
    return runs, notes


# ---------------------------------------------------------------------------------------------------------------
# protocol keys and groups


def documents(run: Run) -> list[str]:
    """The run's documents as run.json's data.documents lists them (else as its rows name them), in order."""
    data = run.record.get("data") or {}
    docs = [str(d.get("doc")) for d in data.get("documents") or [] if isinstance(d, dict)]
    return docs or list(dict.fromkeys(str(r["doc"]) for r in run.rows))


def corpus_key(run: Run) -> dict[str, Any]:
    """The protocol fields of a run over a corpus (ppl, entropy): the data spec, its documents, the text field."""
    return {
        "data": run.spec.get("data", (run.record.get("data") or {}).get("spec")),
        "documents": documents(run),
        "text_field": run.spec.get("text_field", "text"),
    }


def canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def field_label(name: str) -> str:
    return name.replace("_", " ")


def fmt_value(value: Any) -> str:
    """A protocol field's value for headings: on/off, comma lists, long strings shortened at a space."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "none"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ",".join(fmt_value(v) for v in value) or "none"
    if isinstance(value, dict):
        return canon(value)
    text = " ".join(str(value).split())
    if len(text) <= 48:
        return text
    space = text.rfind(" ", 0, 46)
    return (text[:space] if space > 24 else text[:45]).rstrip(" ,;(") + "..."  # at a word's end where one is near


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
    kind_title: str = ""  # the kind's title (report.kind.Kind.title): the heading's first words
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    original_lengths: dict[str, int] = field(default_factory=dict)
    positions: dict[str, dict[str, Any]] = field(default_factory=dict)  # model -> its position encoding, beyond
    grids: dict[tuple[str, str], tuple[pd.DataFrame, pd.DataFrame]] = field(default_factory=dict)

    @property
    def title(self) -> str:
        """The heading of the group's section: kind, number, and what sets it apart from the kind's other groups."""
        title = self.short_title
        if self.of > 1:
            if self.distinguishing:
                title += ": " + ", ".join(f"{field_label(f)} {fmt_value(self.key.get(f))}" for f in self.distinguishing)
        return title

    @property
    def ruler_threshold(self) -> float:
        """A RULER group's effective-length threshold: the one its runs recorded (RULER's 85.6 by default)."""
        return float(self.key.get("threshold") or RULER_THRESHOLD)

    @property
    def short_title(self) -> str:
        """Kind and number only: a figure's first line, above the description that already names every field."""
        return (self.kind_title or self.kind) + (f" ({self.number} of {self.of})" if self.of > 1 else "")

    @property
    def description(self) -> str:
        quiet = {"text_field": "text", "max_new_tokens": None}  # shown only when not the default
        if self.key.get("protocol") != "sliding":
            quiet["stride"] = None
        shown = [
            f
            for f in self.key
            if (not f.startswith("preset.") and not (f in quiet and self.key[f] == quiet[f]))
            or f in self.distinguishing
        ]
        return " · ".join(f"{field_label(f)} {fmt_value(self.key.get(f))}" for f in shown)


class KindLike(Protocol):
    """What grouping needs of a task kind (report.kind.Kind): its title and the protocol fields of a run."""

    title: str

    def protocol_key(self, run: Run, aggregate: str | None) -> dict[str, Any]: ...


def group_runs(
    runs: Sequence[Run], kinds: Mapping[str, KindLike], aggregate: str | None = None, single: bool = False
) -> list[Group]:
    """Group runs by (kind, the kind's protocol key: what must agree for runs to share a table); kinds in the
    order of `kinds` (the registry: ppl, needle, passkey, entropy, ruler, lm-eval, tune), groups in command-line
    order.

    single=True refuses (CtxevalError) when the runs of one kind would need more than one table."""
    found: dict[tuple[str, str], tuple[dict[str, Any], list[Run]]] = {}
    for run in runs:
        key = kinds[run.task].protocol_key(run, aggregate)
        found.setdefault((run.task, canon(key)), (key, []))[1].append(run)
    groups: list[Group] = []
    for kind in kinds:
        mine = [(key, members) for (k, _), (key, members) in found.items() if k == kind]
        fields = list(dict.fromkeys(f for key, _ in mine for f in key))
        differ = [f for f in fields if len({canon(key.get(f)) for key, _ in mine}) > 1]
        if single and len(mine) > 1:
            values = "; ".join(
                f"{members[0].name}: " + ", ".join(f"{field_label(f)} {fmt_value(key.get(f))}" for f in differ)
                for key, members in mine
            )
            raise CtxevalError(
                f"--single: the {kind} runs differ in {', '.join(map(field_label, differ))} ({values}); drop --single "
                "to get one table per protocol, or leave runs out"
            )
        for n, (key, members) in enumerate(mine, 1):
            groups.append(Group(f"{kind}-{n}", kind, n, len(mine), key, members, differ, kinds[kind].title))
    return groups


# ---------------------------------------------------------------------------------------------------------------
# merging rows


def display_models(group: Group) -> dict[tuple[int, str], str]:
    """(run order, row model) -> display name; `model (dtype)` where one model name comes with several dtypes."""
    dtypes: dict[str, set[str]] = {}
    for run in group.runs:
        for model in run.models:
            dtypes.setdefault(model, set()).add(str(run.dtype))
    return {
        (run.order, m): (f"{m} ({run.dtype})" if len(dtypes[m]) > 1 else m) for run in group.runs for m in run.models
    }


def merge_rows(group: Group) -> tuple[list[dict[str, Any]], list[str]]:
    """The group's rows with one row per point, and notes on points more than one run measured.

    Within a run the last row per point wins (a resumed point replaces its failure). Across runs the run started
    later wins (ties: the later one on the command line), except that a measured value is never replaced by a
    failure."""
    names = display_models(group)
    point = POINT_FIELDS[group.kind]
    chosen: dict[tuple, tuple[Run, dict[str, Any]]] = {}
    overlaps: Counter[tuple[str, str, str, str, str]] = Counter()
    epoch = _dt.datetime.min.replace(tzinfo=_dt.timezone.utc)
    for run in sorted(group.runs, key=lambda r: (r.started or epoch, r.order)):
        latest: dict[tuple, dict[str, Any]] = {}
        for row in run.rows:
            row = {**row, "model": names[(run.order, str(row["model"]))], "length": int(row["length"])}
            latest[point_key(row, point)] = row
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
        notes.append(
            head
            + (
                f"kept {newer}'s (started later)"
                if reason == "later"
                else f"kept {older}'s values ({newer} has {reason} there; a failure never replaces a value)"
            )
        )
    return [row for _, row in chosen.values()], notes


def row_order(group: Group, rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(model, method) in command-line order: models as they first appear, methods in each run's order."""
    names = display_models(group)
    order: list[tuple[str, str]] = []
    for run in sorted(group.runs, key=lambda r: r.order):
        labels = list(dict.fromkeys([*map(str, run.spec.get("methods") or []), *(str(r["label"]) for r in run.rows)]))
        for model in run.models:
            order += [(names[(run.order, model)], label) for label in labels]
    present = {(r["model"], str(r["label"])) for r in rows}
    return [pair for pair in dict.fromkeys(order) if pair in present]
