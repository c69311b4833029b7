"""`ctxeval report RUN_DIR...`: merge run directories into comparison tables (ctxeval.report does the work)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ..errors import CtxevalError
from .console import err, user_errors
from .options import AggregateOpt, FormatOpt, OutOpt, ThresholdOpt, ValidToleranceOpt, reworded

# torch, transformers, pandas and matplotlib load only when a command needs them (`ctxeval --help` starts in
# well under a second): the evaluation and report modules are imported inside the command functions.
FORMATS = ("md", "csv", "json")
RunsArg = Annotated[
    list[Path],
    typer.Argument(
        help="Run directories written by ctxeval ppl, needle, passkey, "
        "entropy, ruler, lm-eval or tune (any mix of tasks and models; a "
        "tune run brings its held-out ppl run), or a folder of them "
        "(results/); anything else among them is skipped with a note.",
        show_default=False,
    ),
]
HtmlOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--html",
        help="Also write the report as one self-contained HTML page to this "
        "file: sortable tables, the figures embedded, each run's "
        "provenance (works offline).",
    ),
]


@user_errors
def report_cmd(
    runs: RunsArg,
    format: reworded(
        FormatOpt, "What stdout gets: md (default) | csv (one tidy table) | json.", str, short="-f"
    ) = "md",
    out: reworded(
        OutOpt,
        "Also write table.md, report.csv, report.json, one CSV per "
        "table and the combined plots to this directory "
        "(default: stdout only, no files).",
    ) = None,
    html: HtmlOpt = None,
    threshold: reworded(
        ThresholdOpt, "Needle/passkey: accuracy that counts for the effective length and the passkey context."
    ) = 0.8,
    valid_tolerance: ValidToleranceOpt = 0.10,
    aggregate: reworded(
        AggregateOpt,
        "ppl: token | window for every ppl run (default: each run's own; runs that differ get separate tables).",
    ) = None,
    single: Annotated[
        bool,
        typer.Option(
            "--single", help="Refuse (exit 2) instead of splitting when runs of one task differ in protocol or data."
        ),
    ] = False,
) -> None:
    """Merge run directories into comparison tables (ppl with valid length, loss by position and LongPPL; needle,
    passkey, RULER, entropy, lm-eval, tune searches); runs that differ in protocol get separate tables; --html: one
    page."""
    from ..report.merged import build_report
    from ..report.runs import expand_run_args

    fmt = format.lower()
    if fmt not in FORMATS:
        raise CtxevalError(f"--format must be md, csv or json, got '{format}'")
    if html is not None:
        from ..report.html import check_html_path

        check_html_path(html, out)  # before any work: a bad path fails fast
    runs, arg_notes = expand_run_args(runs)  # folders of runs expanded, what is not a run skipped (or refused)
    for note in arg_notes:
        err.print(f"note: {note}", markup=False)
    rep = build_report(runs, threshold=threshold, tolerance=valid_tolerance, aggregate=aggregate, single=single)
    write_files(rep, out, html)
    print_report(rep, fmt)


def write_files(rep: Any, out: Path | None, html: Path | None) -> None:
    """--out: the tables, CSVs and plots in a directory; --html: the one-page report."""
    from ..report.render import write_report

    if out is not None:
        written = write_report(rep, out)
        pngs = [p.name for p in written if p.suffix == ".png"]
        err.print(
            f"wrote {out}/table.md, report.csv, report.json, {len(rep.tables)} table CSV(s)"
            + (f", {', '.join(pngs)}" if pngs else "")
        )
    if html is not None:
        from ..report.html import write_html

        err.print(f"wrote {write_html(rep, html)}")


def print_report(rep: Any, fmt: str) -> None:
    """The report on stdout as markdown (its notes inside), CSV or JSON (their notes on stderr)."""
    from ..report.render import to_csv, to_json, to_markdown

    if fmt == "md":
        typer.echo(to_markdown(rep), nl=False)
        return
    for note in rep.notes + [n for g in rep.groups for n in g.notes]:
        err.print(f"note: {note}", markup=False)
    if fmt == "csv":
        typer.echo(to_csv(rep), nl=False)
    else:
        typer.echo(json.dumps(to_json(rep), indent=2, allow_nan=False))
