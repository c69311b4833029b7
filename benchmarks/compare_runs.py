"""Compare re-measured runs with committed ones, row by row: did a change of code (a new attention kernel, say)
leave every number and every generated answer as it was?

    python benchmarks/compare_runs.py results/ppl-tiny-pydoc-attention=/tmp/new/ppl-tiny ... [--out FILE.json]

For each pair OLD=NEW: rows are matched on what they measure (model, label, task, metric, length, depth, sample,
document, RULER or lm-eval task, ...); of the fields both rows have, reported are the largest relative difference
of the floats (perplexities, NLL sums, scores) and every other field that differs (generated answers, correctness,
token counts; timings aside). Fields a newer version adds (loss by position, tokens/s) are not compared. Also: the
attention kernel each run recorded (run.json) and the median seconds per row by method label. Exit 1 when a row
is missing or a non-float field differs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

TIMING = {"seconds", "time", "elapsed", "started", "finished", "tokens_per_s", "peak_gib"}
KEYS = (
    "model",
    "label",
    "task",
    "metric",
    "length",
    "depth",
    "sample",
    "doc",
    "ruler_task",
    "lm_eval_task",
    "subtask",
    "filter",
    "protocol",
    "preset",
    "scoring",
)


def rows_of(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "rows.jsonl").read_text().splitlines() if line.strip()]


def identity(row: dict[str, Any]) -> str:
    """What a row measures."""
    return json.dumps({k: row[k] for k in KEYS if k in row}, sort_keys=True)


def kernels(run: Path) -> dict[str, str]:
    methods = json.loads((run / "run.json").read_text()).get("methods", {})
    return {label: record.get("attention_kernel", "model's own") for label, record in methods.items()}


def median_seconds(rows: list[dict[str, Any]]) -> dict[str, float]:
    by: dict[str, list[float]] = {}
    for row in rows:
        if isinstance(row.get("seconds"), (int, float)):
            by.setdefault(row.get("label", "?"), []).append(row["seconds"])
    return {label: round(statistics.median(values), 2) for label, values in by.items()}


def compare(old: Path, new: Path) -> dict[str, Any]:
    old_rows, new_rows = rows_of(old), rows_of(new)
    new_by = {identity(r): r for r in new_rows}
    matched, worst, differing = 0, 0.0, []
    for row in old_rows:
        other = new_by.get(identity(row))
        if other is None:
            continue
        matched += 1
        for field, a in row.items():
            if field in TIMING or field not in other:
                continue
            b = other[field]
            if isinstance(a, float) and isinstance(b, (int, float)):
                if a != b:
                    worst = max(worst, abs(a - b) / max(abs(a), 1e-300))
            elif a != b:
                differing.append({"row": json.loads(identity(row)), "field": field, "old": a, "new": b})
    return {
        "old": str(old),
        "new": str(new),
        "rows_old": len(old_rows),
        "rows_new": len(new_rows),
        "rows_matched": matched,
        "max_rel_diff": worst,
        "other_fields_differing": differing,
        "kernels_old": kernels(old),
        "kernels_new": kernels(new),
        "median_seconds_old": median_seconds(old_rows),
        "median_seconds_new": median_seconds(new_rows),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pairs", nargs="+", help="OLD_RUN_DIR=NEW_RUN_DIR")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    report = []
    for pair in args.pairs:
        old, _, new = pair.partition("=")
        result = compare(Path(old), Path(new))
        report.append(result)
        print(
            f"{old}: {result['rows_matched']}/{result['rows_old']} rows matched, max rel diff "
            f"{result['max_rel_diff']:.2g}, other fields differing: {len(result['other_fields_differing'])}"
        )
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if all(r["rows_matched"] == r["rows_old"] and not r["other_fields_differing"] for r in report) else 1


if __name__ == "__main__":
    sys.exit(main())
