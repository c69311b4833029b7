"""`ctxeval report RUN_DIR...`: merge run directories into comparison tables (ctxeval.report does the work)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import CtxevalError
from .console import err, user_errors
from .options import THRESHOLD, VALID_TOLERANCE

# torch, transformers, pandas and matplotlib load only when a command needs them (`ctxeval --help` starts in
# well under a second): the evaluation and report modules are imported inside the command functions.
FORMATS = ("md", "csv", "json")


@user_errors
def report_cmd(
    runs: Annotated[
        list[Path],
        typer.Argument(
            help="Run directories written by ctxeval ppl, needle, passkey, "
            "entropy, ruler, lm-eval or tune (any mix of tasks and models; a "
            "tune run brings its held-out ppl run), or a folder of them "
            "(results/); anything else among them is skipped with a note.",
            show_default=False,
        ),
    ],
    format: Annotated[
        str, typer.Option("--format", "-f", help="What stdout gets: md (default) | csv (one tidy table) | json.")
    ] = "md",
    out: Annotated[
        Optional[Path],
        typer.Option(
            help="Also write table.md, report.csv, report.json, one CSV per "
            "table and the combined plots to this directory "
            "(default: stdout only, no files)."
        ),
    ] = None,
    html: Annotated[
        Optional[Path],
        typer.Option(
            help="Also write the report as one self-contained HTML page to this "
            "file: sortable tables, the figures embedded, each run's "
            "provenance (works offline)."
        ),
    ] = None,
    threshold: Annotated[
        float,
        typer.Option(help="Needle/passkey: accuracy that counts for the effective length and the passkey context."),
        THRESHOLD,
    ] = 0.8,
    valid_tolerance: Annotated[
        float, typer.Option(help="Valid-length table: allowed ppl rise over the original length."), VALID_TOLERANCE
    ] = 0.10,
    aggregate: Annotated[
        Optional[str],
        typer.Option(
            help="ppl: token | window for every ppl run (default: "
            "each run's own; runs that differ get separate "
            "tables)."
        ),
    ] = None,
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
    from ..report.render import to_csv, to_json, to_markdown, write_report

    fmt = format.lower()
    if fmt not in FORMATS:
        raise CtxevalError(f"--format must be md, csv or json, got '{format}'")
    if html is not None:
        from ..report.html import check_html_path, write_html

        check_html_path(html, out)  # before any work: a bad path fails fast
    from ..report.runs import expand_run_args

    runs, arg_notes = expand_run_args(runs)  # folders of runs expanded, what is not a run skipped (or refused)
    for note in arg_notes:
        err.print(f"note: {note}", markup=False)
    rep = build_report(runs, threshold=threshold, tolerance=valid_tolerance, aggregate=aggregate, single=single)
    if out is not None:
        written = write_report(rep, out)
        pngs = [p.name for p in written if p.suffix == ".png"]
        err.print(
            f"wrote {out}/table.md, report.csv, report.json, {len(rep.tables)} table CSV(s)"
            + (f", {', '.join(pngs)}" if pngs else "")
        )
    if html is not None:
        err.print(f"wrote {write_html(rep, html)}")
    if fmt == "md":
        typer.echo(to_markdown(rep), nl=False)
        return
    for note in rep.notes + [n for g in rep.groups for n in g.notes]:
        err.print(f"note: {note}", markup=False)
    if fmt == "csv":
        typer.echo(to_csv(rep), nl=False)
    else:
        typer.echo(json.dumps(to_json(rep), indent=2, allow_nan=False))
