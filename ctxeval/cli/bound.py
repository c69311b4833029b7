"""`ctxeval bound`: the lower bound on the RoPE base from "Base of RoPE Bounds Context Length" (ctxeval/rope/bound.py)."""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from ..errors import CtxevalError
from ..models.load import load_config
from ..rope import bound as BD
from .console import err, out, user_errors
from .options import Fmt, parse_lengths


def fmt_base(value: float | None) -> str:
    """4300.0 -> '4.3e3' (two significant digits, as the paper writes them); None -> '-'."""
    if value is None or not math.isfinite(value):
        return "-"
    mant, exp = f"{value:.1e}".split("e")
    return f"{mant}e{int(exp)}"


def _model_geometry(model: str, trust_remote_code: bool) -> Any:
    info = load_config(model, trust_remote_code=trust_remote_code)
    if info.geometry is None:
        raise CtxevalError(
            f"model '{model}' has no RoPE ({info.reason}); the bound applies to RoPE models only, "
            "use --head-dim for a bare table"
        )
    shipped = info.shipped.get("rope_type", "default") if not info.per_layer_types else None
    if shipped not in (None, "default"):
        err.print(
            f"note: this checkpoint ships rope_type={shipped}; the criterion is evaluated at its plain base "
            f"{info.geometry.base:g}, without the scaling"
        )
    if info.per_layer_types:
        err.print(
            f"note: this model has per-layer RoPE ({', '.join(info.per_layer_types)}); using the "
            "full-attention layers' base"
        )
    return info.geometry


@user_errors
def bound_cmd(
    head_dim: Annotated[
        Optional[int], typer.Option("--head-dim", help="Rotary dim d (head_dim x partial_rotary_factor), e.g. 128.")
    ] = None,
    lengths: Annotated[
        Optional[str],
        typer.Option(
            "--lengths",
            help="Context lengths L: 1000,2000 | 1k:16k:x2 (k = 1024 here; the paper's lengths are "
            "thousands, the default: 1000,2000,...,512000,1000000).",
        ),
    ] = None,
    model: Annotated[
        Optional[str],
        typer.Option(
            "--model",
            help="Read d, base and trained length from this model's config; add the longest context its base supports.",
        ),
    ] = None,
    trust_remote_code: Annotated[
        bool, typer.Option("--trust-remote-code", help="Run the model repository's own config code.")
    ] = False,
    fmt: Annotated[Fmt, typer.Option("--format", help="table, json or csv")] = Fmt.table,
) -> None:
    """Lower bound on the RoPE base for context length L (Men et al. 2024): sum_i cos(m b^(-2i/d)) >= 0, m <= L."""
    if model is not None and head_dim is not None:
        raise CtxevalError("give either --head-dim or --model (it reads the rotary dim from the config), not both")
    if model is None and head_dim is None:
        raise CtxevalError("bound needs --head-dim D (the rotary dim, e.g. 128) or --model M")
    if head_dim is not None:
        BD.check_head_dim(head_dim)
    wanted = parse_lengths(lengths) if lengths is not None else list(BD.PAPER_LENGTHS)
    model_rec: dict[str, Any] | None = None
    if model is not None:
        geom = _model_geometry(model, trust_remote_code)
        head_dim = geom.rotary_dim
        BD.check_head_dim(head_dim)
        if geom.original_length <= BD.MAX_LENGTH:
            wanted = sorted(set(wanted) | {geom.original_length})
        reach = BD.max_context(geom.base, head_dim)
        model_rec = {
            "model": model,
            "rotary_dim": head_dim,
            "base": geom.base,
            "trained_length": geom.original_length,
            "max_context": reach,
            "max_context_is_lower_limit": reach >= BD.MAX_LENGTH,
            "ratio_to_trained": reach / geom.original_length,
        }
    table = BD.bound_table(head_dim, wanted)
    rows = table.rows
    if head_dim == 2 and max(wanted) >= 2:
        err.print(
            "note: with d = 2 the only pair has theta_0 = 1 for every base, so B_m = cos(m) < 0 at m = 2: "
            "no base passes any L >= 2"
        )
    if fmt == Fmt.json:
        print(
            json.dumps(
                {
                    "head_dim": head_dim,
                    "criterion": "sum_i cos(m * base^(-2i/d)) >= 0 for m = 0..L",
                    "grid": f"bases with two significant digits from 1.1 to at most {BD.MAX_BASE:g}",
                    "rows": [r.to_json() for r in rows],
                    "model": model_rec,
                    "seconds": round(table.seconds, 3),
                },
                indent=2,
            )
        )
    elif fmt == Fmt.csv:
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(["length", "paper", "first_feasible", "all_feasible_above", "safe_base"])
        for r in rows:
            writer.writerow(
                [
                    r.length,
                    "" if r.paper is None else repr(r.paper),
                    "" if r.first_feasible is None else repr(r.first_feasible),
                    "" if r.all_feasible_above is None else repr(r.all_feasible_above),
                    repr(r.safe_base) if math.isfinite(r.safe_base) else "",
                ]
            )
        sys.stdout.write(buf.getvalue())
    else:
        out.print(_render(head_dim, rows, model_rec))
    if model_rec is not None and fmt != Fmt.json:
        (out if fmt == Fmt.table else err).print(_model_line(model_rec, rows), markup=False)
    err.print(f"computed in {table.seconds:.1f} s ({table.grid_bases} grid bases)")


def _render(head_dim: int, rows: list[BD.BoundRow], model_rec: dict[str, Any] | None) -> Any:
    with_paper = any(r.paper is not None for r in rows)
    trained = model_rec["trained_length"] if model_rec else None
    table = Table(
        title=f"Lower bound on the RoPE base, d = {head_dim}: sum_i cos(m b^(-2i/d)) >= 0 for all m <= L",
        caption="bases with two significant digits; 'all feasible above': every grid base from there up "
        "passes (checked up to a base above which every base provably passes)",
    )
    table.add_column("length L", justify="right")
    if with_paper:
        table.add_column("paper (d=128)", justify="right")
    table.add_column("lower bound (first feasible)", justify="right")
    table.add_column("all feasible above", justify="right")
    matches = 0
    for r in rows:
        label = f"{r.length:,}" + (" (trained)" if r.length == trained else "")
        first = fmt_base(r.first_feasible) if r.first_feasible is not None else f"none up to {fmt_base(BD.MAX_BASE)}"
        cells = [label]
        if with_paper:
            if r.paper is None:
                cells.append("")
            else:
                same = r.first_feasible is not None and math.isclose(r.first_feasible, r.paper)
                matches += same
                cells.append(fmt_base(r.paper))
                first = f"[green]{first}[/green]" if same else f"[red]{first}[/red]"
        cells += [
            first,
            fmt_base(r.all_feasible_above)
            if r.all_feasible_above is not None
            else f"not below {fmt_base(BD.MAX_BASE)}",
        ]
        table.add_row(*cells)
    if with_paper:
        n = sum(r.paper is not None for r in rows)
        table.caption += f"; {matches} of {n} rows match the paper's Table 1 (green)"
    return table


def _model_line(rec: dict[str, Any], rows: list[BD.BoundRow]) -> str:
    reach = rec["max_context"]
    reach_text = f">= {reach:,}" if rec["max_context_is_lower_limit"] else f"{reach:,}"
    line = (
        f"{rec['model']}: d = {rec['rotary_dim']}, base {rec['base']:g}, trained length {rec['trained_length']:,}; "
        f"its base supports L = {reach_text} by the criterion ({rec['ratio_to_trained']:.2f}x the trained length)"
    )
    row = next((r for r in rows if r.length == rec["trained_length"]), None)
    if row is not None and row.first_feasible is not None:
        line += (
            f"; for L = {row.length:,} the lower bound is {fmt_base(row.first_feasible)}, every grid base from "
            f"{fmt_base(row.all_feasible_above)} up passes"
        )
    return line
