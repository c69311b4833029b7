"""A tune run as the reports read it: its trials (rows.jsonl), its search record (run.json `tune`) and the winner's
held-out ppl run (`heldout-trial-N/`, an ordinary ppl run). The numbers a tune run's own outputs (tune.py) and
`ctxeval report` (merged.py) both show come from here, so the two never disagree."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ...errors import CtxevalError
from ...rope.methods import Geometry, compute
from ...runs.store import ROWS_FILE, RUN_FILE, read_rows
from ...util.textfiles import read_json
from ..runs import heldout_of_record
from ..tables import ppl_long

OK = "ok"
INVALID = "invalid"  # a point whose parameters the method refuses: no forward, no perplexity
# the comparisons every tune run re-measures at the winner's factor, as their labels read: `pi(factor=8)`
FAMILY_AT_FACTOR = re.compile(r"^(none|pi|ntk|yarn)(?:\(factor=([^,()]+)\))?$")
VECTOR_PARAM = re.compile(r"^(.+)\.(\d+)$")  # LongRoPE's per-pair factors as searched: `long_factor.3`


def trial_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The search's rows, one per trial (the last written wins, as a resume rewrites a trial), by trial number."""
    latest: dict[int, dict[str, Any]] = {}
    for row in rows:
        search = row.get("task", "tune") == "tune" and row.get("phase", "search") == "search"
        if search and row.get("trial") is not None:
            latest[int(row["trial"])] = row
    return [latest[t] for t in sorted(latest)]


def is_ok(row: dict[str, Any]) -> bool:
    return row.get("status") == OK and row.get("value") is not None


def is_feasible(row: dict[str, Any]) -> bool:
    return is_ok(row) and bool(row.get("feasible"))


def best_so_far(rows: Sequence[dict[str, Any]]) -> list[tuple[int, float]]:
    """(trial, lowest target ppl of the feasible trials up to it), from the first feasible trial on."""
    out: list[tuple[int, float]] = []
    best = math.inf
    for row in sorted(rows, key=lambda r: int(r["trial"])):
        if is_feasible(row):
            best = min(best, float(row["value"]))
        if best < math.inf:
            out.append((int(row["trial"]), best))
    return out


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point dominates when both coordinates are minimised (another point is <= in
    both and < in one), ordered by the first coordinate. Equal points are all on the front."""
    front = [i for i, (x, y) in enumerate(points) if not any(a <= x and b <= y and (a < x or b < y) for a, b in points)]
    return sorted(front, key=lambda i: (points[i][0], points[i][1], i))


def param_columns(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Every searched parameter, in the order the trials name them (per-pair factors by their index)."""
    names = list(dict.fromkeys(k for r in rows for k in (r.get("params") or {})))

    def key(name: str) -> tuple[str, int]:
        m = VECTOR_PARAM.match(name)
        return (m.group(1), int(m.group(2))) if m else (name, -1)

    first = {key(n)[0]: i for i, n in reversed(list(enumerate(names)))}
    return sorted(names, key=lambda n: (first[key(n)[0]], key(n)[1]))


def fmt_number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def fmt_params(params: dict[str, Any] | None, limit: int = 4) -> str:
    """`beta_fast=1.941, beta_slow=0.1841`; per-pair factors as one list, its ends shown: `long_factor=[1, 1.2, ...,
    8] (16)`."""
    scalars: list[str] = []
    vectors: dict[str, list[Any]] = {}
    for name in param_columns([{"params": params or {}}]):
        m = VECTOR_PARAM.match(name)
        if m:
            vectors.setdefault(m.group(1), []).append((params or {})[name])
        else:
            scalars.append(f"{name}={fmt_number((params or {})[name])}")
    for name, values in vectors.items():
        shown = [fmt_number(v) for v in values]
        if len(shown) > limit:
            shown = shown[: limit - 1] + ["...", shown[-1]]
        scalars.append(f"{name}=[{', '.join(shown)}] ({len(values)})")
    return ", ".join(scalars) or "(none)"


# ---------------------------------------------------------------------------------------------------------------
# the winner's held-out ppl run


@dataclass
class Heldout:
    """The winner's held-out ppl run: token-weighted ppl per method at the trained (short) and the target length."""

    path: Path
    record: dict[str, Any]  # its run.json
    winner: str  # the tuned winner's label
    labels: list[str]  # the winner first, then the comparisons in the run's order
    short: int
    target: int
    ppl: dict[tuple[str, int], float]  # (label, length) -> ppl; NaN where a document failed or is missing
    status: dict[tuple[str, int], str]
    docs: list[str]

    def value(self, label: str | None, length: int) -> float | None:
        v = self.ppl.get((label or "", length))
        return None if v is None or math.isnan(v) else v

    def others(self) -> list[str]:
        return [label for label in self.labels if label != self.winner]

    def family_default(self, family: str) -> str | None:
        """The label of `family` at the winner's factor with its default parameters (`yarn(factor=8)`), if measured."""
        return next(
            (label for label in self.others() if (m := FAMILY_AT_FACTOR.match(label)) and m.group(1) == family), None
        )

    def factor(self) -> float | None:
        """The factor the comparisons ran at (PI's, else YaRN's or NTK's label says it)."""
        for family in ("pi", "yarn", "ntk"):
            m = FAMILY_AT_FACTOR.match(self.family_default(family) or "")
            if m and m.group(2):
                try:
                    return float(m.group(2))
                except ValueError:
                    continue
        return None

    def best_other(self) -> str | None:
        """The re-measured method other than the winner with the lowest held-out ppl at the target."""
        measured = [label for label in self.others() if self.value(label, self.target) is not None]
        return min(measured, key=lambda label: self.ppl[(label, self.target)]) if measured else None


def read_heldout(run_dir: Path, record: dict[str, Any]) -> Heldout | None:
    """The held-out run named in run.json (None when there is no winner or no held-out run yet)."""
    path = heldout_of_record(Path(run_dir), record)
    winner = ((record.get("tune") or {}).get("winner") or {}).get("label")
    if path is None or not isinstance(winner, str):
        return None
    try:
        held = read_json(path / RUN_FILE, "held-out run.json", finite=False)
        rows = read_rows(path / ROWS_FILE, "ppl")
    except CtxevalError:  # a damaged held-out run: the search's own outputs still render (ctxeval report names it)
        return None
    if not isinstance(held, dict) or not isinstance(held.get("data") or {}, dict):
        return None
    spec = held.get("spec") if isinstance(held.get("spec"), dict) else {}
    long = ppl_long(rows, "token")
    measured = list(dict.fromkeys(str(label) for label in long["label"]))
    labels = list(dict.fromkeys([winner, *[str(x) for x in spec.get("methods") or []], *measured]))
    lengths = sorted({int(x) for x in spec.get("lengths") or []} | {int(x) for x in long["length"]})
    own = record.get("spec") if isinstance(record.get("spec"), dict) else {}
    short = int(own.get("short") or (lengths[0] if lengths else 0))
    target = int(own.get("target") or (lengths[-1] if lengths else 0))
    ppl = {(str(r.label), int(r.length)): float(r.ppl) for r in long.itertuples()}
    status = {(str(r.label), int(r.length)): str(r.status) for r in long.itertuples()}
    docs = [str(d.get("doc")) for d in (held.get("data") or {}).get("documents") or [] if isinstance(d, dict)]
    return Heldout(
        path,
        held,
        winner,
        [label for label in labels if label in measured or label == winner],
        short,
        target,
        ppl,
        status,
        docs or list(dict.fromkeys(str(r["doc"]) for r in rows)),
    )


def inv_freq(held: Heldout, label: str, length: int | None = None) -> list[float] | None:
    """The inverse frequencies `label` ran with in the held-out run, as its run.json read them back (the entry at
    `length`, default the target, for a length-dependent method); computed from the recorded geometry and parameters
    when the record has none. None when neither is possible."""
    length = held.target if length is None else length
    methods = held.record.get("methods") if isinstance(held.record.get("methods"), dict) else {}
    entry = methods.get(label) if isinstance(methods.get(label), dict) else None
    if entry is None:
        return None
    effective = [e for e in entry.get("effective") or [] if isinstance(e, dict) and isinstance(e.get("inv_freq"), list)]
    chosen = next((e for e in effective if e.get("length") == length), None) or next(
        (e for e in effective if e.get("length") is None), None
    )
    if chosen is not None:
        return [float(v) for v in chosen["inv_freq"]]
    try:
        geometry = Geometry(**entry["geometry"])
        params = {k: v for k, v in (entry.get("params") or {}).items() if v is not None}
        return [float(v) for v in compute(str(entry["method"]), geometry, params, length).inv_freq]
    except (CtxevalError, KeyError, TypeError, ValueError):
        return None


def pair_scales(held: Heldout, labels: Sequence[str], length: int | None = None) -> dict[str, list[float]]:
    """label -> per-pair scale theta_i / theta'_i (plain RoPE's inverse frequency over the method's) at `length`
    (default the target), for the labels whose frequencies are known; {} without the `none` row to divide by."""
    base = inv_freq(held, "none", length)
    if base is None:
        return {}
    out = {}
    for label in labels:
        mine = inv_freq(held, label, length)
        if mine is not None and len(mine) == len(base):
            out[label] = [b / m for b, m in zip(base, mine)]
    return out


# ---------------------------------------------------------------------------------------------------------------
# one tune run in one line (the merged report's row)


@dataclass
class TuneSummary:
    run_dir: Path
    record: dict[str, Any]
    trials: list[dict[str, Any]]
    heldout: Heldout | None

    @property
    def spec(self) -> dict[str, Any]:
        return self.record.get("spec") if isinstance(self.record.get("spec"), dict) else {}

    @property
    def tune(self) -> dict[str, Any]:
        return self.record.get("tune") if isinstance(self.record.get("tune"), dict) else {}

    @property
    def winner(self) -> dict[str, Any] | None:
        winner = self.tune.get("winner")
        return winner if isinstance(winner, dict) and isinstance(winner.get("label"), str) else None

    @property
    def target(self) -> int | None:
        value = self.spec.get("target")
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    @property
    def short(self) -> int | None:
        value = self.spec.get("short")
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def counts(self) -> dict[str, int]:
        out = {"finished": len(self.trials), "ok": 0, "feasible": 0, INVALID: 0, "error": 0}
        for row in self.trials:
            status = str(row.get("status"))
            out["ok"] += is_ok(row)
            out["feasible"] += is_feasible(row)
            if not is_ok(row):
                out[INVALID if status == INVALID else "error"] += 1
        out["counted"] = out["finished"] - out[INVALID]  # what --trials counts: trials that measured a point
        return out


def read_tune(
    run_dir: Path | str, record: dict[str, Any] | None = None, rows: Sequence[dict[str, Any]] | None = None
) -> TuneSummary:
    """A tune run directory (its run.json and rows unless given) with its held-out run."""
    run_dir = Path(run_dir)
    if record is None:
        record = read_json(run_dir / RUN_FILE, "tune run.json", finite=False)
    if rows is None:
        rows = read_rows(run_dir / ROWS_FILE, "tune")
    families = (record.get("tune") or {}).get("families") if isinstance(record.get("tune"), dict) else None
    if isinstance(families, list):  # a search across methods: its rows mirror each method's, numbered per method
        trials = [r for f in families for r in trial_rows([x for x in rows if x.get("family") == f.get("dir")])]
    else:
        trials = trial_rows(rows)
    return TuneSummary(run_dir, record, trials, read_heldout(run_dir, record))
