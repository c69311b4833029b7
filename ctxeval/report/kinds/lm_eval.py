"""The lm-eval kind (`ctxeval lm-eval`): its protocol key (the input length, limit, few-shot, lm-eval's version);
one table of method x lm-eval task and metric, value ± stderr, in a report and as the run's own table.md; no figure
(nothing is drawn against a length)."""

from __future__ import annotations

from typing import Any

from ...runs.rows import status_label
from ...runs.store import RunStore
from ..kind import Kind, Settings
from ..runs import Group, Run, load_run, merge_rows, row_order
from ..single import Printed, RunOutputs, save_text, table_csv
from ..tables import Table, markdown, number


def protocol_key(run: Run, aggregate: str | None = None) -> dict[str, Any]:
    spec = run.spec
    return {
        "max_length": spec.get("max_length"),
        "limit": spec.get("limit"),
        "num_fewshot": spec.get("num_fewshot"),
        "lm_eval": (run.record.get("lm_eval") or {}).get("version"),
    }


def tables(group: Group, rows: list[dict[str, Any]], settings: Settings) -> list[Table]:
    return [lm_eval_table(group, rows)]


def lm_eval_table(group: Group, rows: list[dict[str, Any]]) -> Table:
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


def render_lm_eval(store: RunStore, title: str) -> RunOutputs:
    """table.md / table.csv: method x (lm-eval task, metric), value ± stderr (the report's own table of this run)."""
    run = load_run(store.dir)
    group = Group("lm-eval-1", KIND.name, 1, 1, protocol_key(run), [run], kind_title=KIND.title)
    rows, group.notes = merge_rows(group)
    table = lm_eval_table(group, rows)
    headers, cells = table.headers[1:], [r[1:] for r in table.cells]
    save_text(store.dir / "table.md", f"# {title}\n\n{table.caption}\n\n" + markdown(headers, cells))
    save_text(store.dir / "table.csv", table_csv(table))
    return RunOutputs([Printed(title, table.caption, headers, cells)], f"wrote {store.dir}/table.md, table.csv")


KIND = Kind("lm-eval", "lm-evaluation-harness", protocol_key, tables)
