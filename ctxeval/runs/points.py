"""What a command did to a run directory, in points: the summary line's tally (measured now, reused, failed, copied),
the rows of a method identical to another copied from it, and a directory a command made and measured nothing into
removed."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .lock import LOCK_NAME
from .rows import OK, RESUME_FIELDS, point_key
from .store import ROWS_FILE, RUN_FILE, RunStore


def remove_run_dir(store: RunStore) -> bool:
    """Delete a run directory this command created and measured nothing into (run.json and the lock only), then
    release its lock; False, and the directory kept, if anything else is in it or it cannot be removed."""
    try:
        if any(
            p.name not in (RUN_FILE, LOCK_NAME) and not (p.name == ROWS_FILE and p.stat().st_size == 0)
            for p in store.dir.iterdir()
        ):
            return False
        for path in store.dir.iterdir():
            if path.name != LOCK_NAME:
                path.unlink()
        (store.dir / LOCK_NAME).unlink(missing_ok=True)
        store.dir.rmdir()  # while the lock is held: no other process can have started measuring into it
    except OSError:
        store.close()
        return False
    store.close()
    return True


def copy_twin_rows(store: RunStore, twins: dict[str, str], relabel: dict[str, dict[str, Any]], kind: str) -> None:
    """Append, for each copy (label -> the label it equals), the rows of the method it equals at the points it has
    no ok row for, with `relabel[label]`'s fields (label, method, params) and marked `same_as`; its read-back record
    in run.json is the other's, marked the same way."""
    fields = RESUME_FIELDS.get(kind, ("label", "length"))
    rows = store.rows()
    have = {point_key(row, fields) for row in rows if row.get("status") == OK}
    copies = []
    for twin, first in twins.items():
        for row in rows:
            if row.get("label") != first or row.get("same_as"):
                continue
            copy = {**row, **relabel[twin], "label": twin, "same_as": first}
            if point_key(copy, fields) not in have:
                copies.append(copy)
    if copies:
        store.append(copies)
    methods = dict(store.record.get("methods") or {})
    for twin, first in twins.items():
        if isinstance(methods.get(first), dict) and twin not in methods:
            methods[twin] = {**methods[first], "same_as": first}
    store.update(methods=methods)


FAILED_AS = {"oom": "out of memory"}  # how a failed row's status reads in the summary line
REFUSED = "invalid"  # evals.tune.INVALID (not imported: that would load torch for every command)


@dataclass
class Tally:
    """The points of one command: measured now, reused from an earlier run of the directory, failed now (by
    status)."""

    measured: int = 0
    reused: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    copied: int = 0  # points of a method identical to another, copied from its rows (Measurement.work_once)

    def __str__(self) -> str:
        refused = self.failed.get(REFUSED, 0)  # tune's points the method's own checks refused: no forward, no failure
        failures = {status: n for status, n in self.failed.items() if status != REFUSED}
        failed = sum(failures.values())
        why = ", ".join(f"{n} {FAILED_AS.get(status, status)}" for status, n in sorted(failures.items()))
        return (
            f"{self.measured} point{'s' * (self.measured != 1)} measured, {self.reused} reused from an earlier "
            f"run, {failed} failed"
            + (f" ({why})" if failed else "")
            + (f", {refused} refused by the method's checks" if refused else "")
            + (f", {self.copied} copied from an identical method" if self.copied else "")
        )


def tally(before: list[dict[str, Any]], after: list[dict[str, Any]], kind: str) -> Tally:
    """Count points (rows.RESUME_FIELDS of `kind`) from the rows of a run directory before and after a command: a
    row present after but not before was written by this command (rows are compared whole, so a rank file folded
    into rows.jsonl is no new row); a point's newest such row says measured (ok) or failed (oom, skipped, error).
    Reused: a point with an ok row from before that this command did not measure again."""
    fields = RESUME_FIELDS.get(kind, ("label", "length"))

    def whole(row: dict[str, Any]) -> str:
        return json.dumps(row, sort_keys=True, default=str)

    old = Counter(whole(r) for r in before)
    newest: dict[tuple, str] = {}
    copied: set[tuple] = set()
    for row in after:
        text = whole(row)
        if old[text] > 0:
            old[text] -= 1
            continue
        if row.get("synced"):  # tune: a trial another process (or an earlier session) measured, copied from the study
            continue
        newest[point_key(row, fields)] = str(row.get("status"))
        if row.get("same_as"):
            copied.add(point_key(row, fields))
    out = Tally(
        reused=len(
            {point_key(r, fields) for r in before + [r for r in after if r.get("synced")] if r.get("status") == OK}
            - set(newest)
        )
    )
    for key, status in newest.items():
        if key in copied:
            out.copied += 1
        elif status == OK:
            out.measured += 1
        else:
            out.failed[status] = out.failed.get(status, 0) + 1
    return out
